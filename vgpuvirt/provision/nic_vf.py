"""SR-IOV NIC VFs for VMs that ask for one (``NicRequest``): which VF, and which PF to enable first.

A VM that gets a whole GPU and a NIC VF moves its frames from the GPU's memory to the NIC; when both
hang off the same PCIe switch (or root port) the traffic never crosses the CPU's interconnect, and
when they share a NUMA node at least the memory is local. So the VF is chosen by distance to the
VM's first GPU: same NUMA node first, then a shared upstream bridge (switch or root port), then any
free VF, lowest address first on a tie. The chosen VF and the reason go into the plan's explanation.

When no free VF serves the request but a NIC PF has SR-IOV off and could enable VFs, the plan asks
for that first (:class:`~vgpuvirt.provision.state.SriovPrep` with ``purpose="nic"``): the run
enables them, reads the host again and plans once more, and disables them again if anything fails.
Only a PF with no VFs at all is enabled (changing the count of a PF that has VFs removes them all,
in use or not); it gets every VF it supports, so later VMs find free ones without another change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vgpuvirt.errors import NoCapacity
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.provision.state import HostState, Locality, SriovPrep


@dataclass(frozen=True)
class NicChoice:
    vf: PciAddress
    pf: PciAddress
    reason: str


def _distance(near: Locality | None, vf: Locality | None) -> tuple[int, int, str]:
    """(NUMA rank, bridge rank, why): lower is nearer."""
    if near is None or vf is None:
        return 2, 2, "topology of the GPU or the VF unknown"
    same_node = near.numa_node is not None and near.numa_node == vf.numa_node
    shared = next((b for b in near.bridges if b in vf.bridges), None)
    numa = (f"same NUMA node {near.numa_node}" if same_node
            else f"NUMA node {vf.numa_node} (the GPU is on node {near.numa_node})")
    bridge = (f"behind the same PCIe switch/bridge {shared}" if shared is not None
              else "on another PCIe branch")
    return (0 if same_node else 1), (0 if shared is not None else 1), f"{numa}, {bridge}"


def take_nic_vf(vm: VmRequest, h: HostState, near: PciAddress | None) -> NicChoice:
    """Take (remove from ``h.free_nic_vfs``) the free VF nearest the GPU at ``near`` that serves the VM's
    NicRequest. Raises NoCapacity when none does."""
    assert vm.nic is not None
    here = h.locality.get(near) if near is not None else None
    ranked = []
    for i, (vf, pf) in enumerate(h.free_nic_vfs):
        if vm.nic.pf is not None and pf != vm.nic.pf:
            continue
        numa, bridge, why = _distance(here, h.locality.get(vf))
        ranked.append(((numa, bridge, vf), i, vf, pf, why))
    if not ranked:
        raise NoCapacity(h.name, str(vm.nic.pf or "NIC"), f"no free SR-IOV NIC VF for {vm.name}"
                         + (f" on PF {vm.nic.pf}" if vm.nic.pf else "")
                         + "; and no NIC PF with SR-IOV off that could enable VFs")
    _, i, vf, pf, why = min(ranked, key=lambda r: r[0])
    del h.free_nic_vfs[i]
    target = f"GPU {near}" if near is not None else "the VM"
    return NicChoice(vf, pf, f"NIC VF {vf} of {pf}, the nearest of {len(ranked)} free VF(s) to {target}: {why}")


def nic_preparation(h: HostState, vms: list[VmRequest], nears: Mapping[str, PciAddress | None]) -> list[SriovPrep]:
    """The NIC PFs to enable so that every VM in ``vms`` gets a VF on ``h`` (nearest PFs first), or []
    when enabling cannot serve them (then the caller refuses with its NoCapacity)."""
    work = h.clone()
    preps: list[SriovPrep] = []
    for vm in vms:
        assert vm.nic is not None
        try:
            take_nic_vf(vm, work, nears.get(vm.name))
            continue
        except NoCapacity:
            pass
        near = nears.get(vm.name)
        here = h.locality.get(near) if near is not None else None
        fits = [(pf, total) for pf, total in work.nic_pfs_off if vm.nic.pf is None or pf == vm.nic.pf]
        if not fits:
            return []
        pf, total = min(fits, key=lambda ft: (*_distance(here, h.locality.get(ft[0]))[:2], ft[0]))
        work.nic_pfs_off.remove((pf, total))
        preps.append(SriovPrep(h.name, pf, total, purpose="nic"))
        # The VFs it will have (addresses are not known until the kernel makes them): this PF's locality.
        work.free_nic_vfs.extend((pf, pf) for _ in range(total))
        take_nic_vf(vm, work, nears.get(vm.name))
    return preps
