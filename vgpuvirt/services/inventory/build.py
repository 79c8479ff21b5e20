"""Building the inventory from one snapshot (pure: no host access).

:func:`build_inventory` runs the phases in order, each a small function over the parsed
:class:`~vgpuvirt.services.inventory.parse.Index`: PCI devices, IOMMU groups, mdevs and their parents,
NVIDIA facts and vendor VFs (:mod:`~vgpuvirt.services.inventory.nvidia`), GPUs, and the warnings about
domains. The order of the warnings is part of the output, so the phases keep it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import OpResult, Snapshot
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.services.cordon import CORDON_FILE, parse_cordon
from vgpuvirt.services.inventory.health import HealthInputs, health_inputs, with_health
from vgpuvirt.services.inventory.host_resources import host_resources
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.inventory.nvidia import NvidiaFacts, RawVf, nvidia_facts, raw_vendor_vfs, vendor_vfs
from vgpuvirt.services.inventory.parse import (
    Index,
    TypeKey,
    Usage,
    class_name,
    entry_link,
    entry_text,
    int_name,
    parent_sort_key,
    pci_key,
    read_mdev_type,
    read_pci_device,
    type_sort_key,
)
from vgpuvirt.services.inventory.parts import (
    VENDOR_NAMES,
    Backend,
    Gpu,
    Mdev,
    MdevParent,
    MdevType,
    PciDevice,
    VendorVf,
)
from vgpuvirt.services.nvidia.nvml import NvmlReport
from vgpuvirt.services.nvidia.report import SmiReport, smi_report
from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts
from vgpuvirt.services.pci import parsers as P
from vgpuvirt.services.pci.sysfs import iommu_off


@dataclass(frozen=True)
class _SysfsPart:
    """What the inventory builds from the snapshot and the domains alone (no tool output): its bulk."""

    devices: dict[PciAddress, PciDevice]
    groups: dict[int, list[PciAddress]]
    iommu_enabled: bool
    mdevs: list[Mdev]
    parents: list[MdevParent]
    raw_vfs: list[RawVf]
    type_names: dict[int, str]
    warnings: tuple[str, ...]
    iommu_units: list[str]
    nvidia_version: str | None


class SysfsCache:
    """The sysfs part of the last inventory built from one host's snapshot, reused while that snapshot is the
    same (a collector scraping every 15 s mostly reads the same files: type tables, devices, groups).

    The key is the content itself: every path and what it held (the driver's version file and the types'
    names included) and the domains given, compared in full; any difference (a vGPU created, a driver
    reloaded, a reboot) rebuilds. Nothing can go stale, so there is nothing to invalidate. One per host
    (a :class:`~vgpuvirt.observe.collect.Collector` keeps one per host name); it holds one snapshot.
    ``hits`` / ``misses`` count its use (tests, benchmarks)."""

    def __init__(self) -> None:
        self._last: tuple[Snapshot, tuple[tuple[str, str], ...] | None, _SysfsPart] | None = None
        self.hits = 0
        self.misses = 0

    def part(self, snap: Snapshot, domains: tuple[tuple[str, str], ...] | None, usage: Usage) -> _SysfsPart:
        last = self._last     # one read: another thread may store a newer one meanwhile
        if last is not None and last[1] == domains and last[0] == snap:
            self.hits += 1
            return last[2]
        self.misses += 1
        part = _sysfs_part(snap, usage)
        self._last = (snap, domains, part)
        return part


def _sysfs_part(snap: Snapshot, usage: Usage) -> _SysfsPart:
    idx = Index(snap)
    warnings: list[str] = []
    devices = _devices(idx, usage)
    groups, iommu_enabled = _iommu(idx, warnings)
    mdevs = _mdevs(idx, usage)
    parents = _parents(idx, devices, mdevs)
    raw_vfs, type_names = raw_vendor_vfs(idx, devices, warnings)
    return _SysfsPart(devices, groups, iommu_enabled, mdevs, parents, raw_vfs, type_names, tuple(warnings),
                      sorted(idx.iommu_units), idx.nvidia_version)


def build_inventory(snap: Snapshot, *, host: str = "", domains: Iterable[tuple[str, str]] | None = None,
                    nvidia_smi: OpResult | SmiReport | None = None, nvml: NvmlReport | None = None,
                    mig_lgi: OpResult | None = None, mig_lgip: OpResult | None = None,
                    kernel_log: OpResult | None = None, health: HealthInputs | None = None,
                    cache: SysfsCache | None = None) -> Inventory:
    """The whole inventory from one snapshot (pure: no host access). ``mig_lgi``/``mig_lgip``:
    ``nvidia-smi mig -lgi`` / ``-lgip``; ``kernel_log``: ``dmesg`` (XIDs: with ``nvidia_smi``'s readings they
    give each GPU's health).
    ``health``: ``health_inputs(nvidia_smi, kernel_log)`` already parsed by the caller (a metrics collection
    uses the same parse), instead of parsing them here. ``cache``: the host's :class:`SysfsCache`, to reuse the
    sysfs part of the previous build when the snapshot and domains are the same (the result is equal)."""
    doms = tuple(domains) if domains is not None else None
    smi = smi_report(nvidia_smi)        # parsed once here when it comes raw: the facts and the health read it
    usage = Usage.from_domains(doms)
    part = cache.part(snap, doms, usage) if cache is not None else _sysfs_part(snap, usage)
    devices, groups, mdevs, parents = part.devices, part.groups, list(part.mdevs), list(part.parents)
    warnings: list[str] = [*usage.warnings, *part.warnings]
    sources: dict[str, str] = {"sysfs": "ok"}
    facts = nvidia_facts(smi, nvml, dict(part.type_names), warnings, sources, mig_lgi, mig_lgip)
    vfs = vendor_vfs(part.raw_vfs, facts.type_names, usage)
    gpus = _gpus(devices, groups, parents, mdevs, vfs, facts, warnings)
    if any(GUEST_NOTE in g.notes for g in gpus):
        warnings.append("this OS is a VM guest (nvidia-smi: Virtualization Mode Pass-Through): GPUs passed "
                        "through to it can be used here whole, not split into vGPUs or assigned to VMs"
                        + ("; its IOMMU is off, as in most guests" if not part.iommu_enabled else ""))
    gpus = with_health(gpus, health or health_inputs(smi, kernel_log), warnings, sources)
    if usage.given:
        _domain_warnings(usage, devices, mdevs, vfs, warnings)
    return Inventory(
        host=host,
        iommu_enabled=part.iommu_enabled,
        pci_devices=[devices[a] for a in sorted(devices)],
        iommu_groups={g: list(members) for g, members in sorted(groups.items())},
        mdev_parents=parents,
        mdevs=mdevs,
        vendor_vgpu=vfs,
        gpus=gpus,
        warnings=warnings,
        iommu_units=list(part.iommu_units),
        nvidia_driver_version=part.nvidia_version or facts.driver_version or (nvml.driver_version if nvml else None),
        sources=sources,
        cordon=parse_cordon(snap.text(CORDON_FILE)),
        resources=host_resources(snap),
    )


def _devices(idx: Index, usage: Usage) -> dict[PciAddress, PciDevice]:
    devices: dict[PciAddress, PciDevice] = {}
    for name, attrs in idx.pci.items():
        addr = P.pci_or_none(name)
        if addr is None:
            continue
        dev = read_pci_device(addr, attrs)
        if dev.address in usage.pci:
            dev = dataclasses.replace(dev, domain=usage.pci[dev.address])
        devices[addr] = dev
    # physfn (VF -> PF) and virtfnN (PF -> VF) describe the same relation; fill each side from the other.
    for dev in list(devices.values()):
        for vf in dev.virtfns:
            if vf in devices and devices[vf].physfn is None:
                devices[vf] = dataclasses.replace(devices[vf], physfn=dev.address)
    listed_vfs = {(dev.address, vf) for dev in devices.values() for vf in dev.virtfns}
    for dev in list(devices.values()):
        if dev.physfn is not None and dev.physfn in devices and (dev.physfn, dev.address) not in listed_vfs:
            pf = devices[dev.physfn]
            devices[pf.address] = dataclasses.replace(pf, virtfns=sorted([*pf.virtfns, dev.address]))
    return devices


def _iommu(idx: Index, warnings: list[str]) -> tuple[dict[int, list[PciAddress]], bool]:
    groups: dict[int, list[PciAddress]] = {}
    for g, members in idx.groups.items():
        gid = int_name(g)
        pci_members = sorted(a for a in (P.pci_or_none(m) for m in members) if a is not None)
        if gid is not None and pci_members:
            groups[gid] = pci_members
    iommu_enabled = bool(idx.groups) or bool(idx.iommu_units)
    if not iommu_enabled:
        hint = ""
        if idx.cmdline is not None and not re.search(r"\b(intel_iommu=on|amd_iommu=on|iommu=pt)\b", idx.cmdline):
            hint = " (the kernel command line has no intel_iommu=on / amd_iommu=on)"
        warnings.append("IOMMU off: " + iommu_off(idx.iommu_groups_dir) + hint
                        + "; no device can be assigned to a VM with VFIO "
                        "(enable VT-d/AMD-Vi in the firmware and the IOMMU on the kernel command line)")
    return groups, iommu_enabled


def _mdevs(idx: Index, usage: Usage) -> list[Mdev]:
    mdevs: list[Mdev] = []
    for uuid_s, attrs in sorted(idx.mdevs.items()):
        try:
            uuid = MdevUuid.parse(uuid_s)
        except InvalidSpec:
            continue
        link = attrs.get("")
        parent = None
        if link is not None and link.target:
            parts = [p for p in link.target.split("/") if p]
            parent = parts[-2] if len(parts) >= 2 else None
        parent = str(P.pci_or_none(parent)) if P.pci_or_none(parent) else parent
        domain = usage.mdev.get(uuid)
        mdevs.append(Mdev(
            uuid=uuid, parent=parent, type=entry_link(attrs.get("mdev_type")), domain=domain,
            orphan=(domain is None) if usage.given else None,
            iommu_group=int_name(entry_link(attrs.get("iommu_group"))), driver=entry_link(attrs.get("driver")),
            vgpu_params=entry_text(attrs.get("nvidia/vgpu_params")) or None,
        ))
    return mdevs


def _parents(idx: Index, devices: dict[PciAddress, PciDevice], mdevs: list[Mdev]) -> list[MdevParent]:
    counts: dict[tuple[str | None, str | None], int] = {}
    for m in mdevs:
        counts[(m.parent, m.type)] = counts.get((m.parent, m.type), 0) + 1
    parents: list[MdevParent] = []
    seen_types: dict[TypeKey, MdevType] = {}
    for name in sorted(idx.mdev_bus, key=parent_sort_key):
        addr = P.pci_or_none(name)
        key = str(addr) if addr else name
        physfn = devices[addr].physfn if addr is not None and addr in devices else None
        # A VF's static type attributes were read on one VF of its PF (see INVENTORY_GLOBS); its own win.
        shared = idx.vf_types.get(pci_key(idx, physfn), {}) if physfn is not None else {}
        types = [read_mdev_type(t, attrs, shared.get(t), counts.get((key, t), 0), seen_types)
                 for t, attrs in sorted(idx.types.get(name, {}).items(), key=lambda kv: type_sort_key(kv[0]))]
        parents.append(MdevParent(address=key, types=types, physfn=physfn))
    return parents


def _backend(dev: PciDevice, own: MdevParent | None, parent_by_addr: dict[str, MdevParent],
             vendor_by_addr: dict[PciAddress, VendorVf]) -> Backend:
    vfs = dev.virtfns
    if own is not None and own.types:
        gvt = dev.driver == "i915" or any(t.id.startswith("i915-") for t in own.types)
        return Backend.GVTG if gvt else Backend.MDEV
    if any(str(v) in parent_by_addr for v in vfs):
        return Backend.MDEV_SRIOV
    if any(v in vendor_by_addr for v in vfs):
        return Backend.VENDOR_VFIO
    return Backend.SRIOV_VF if vfs else Backend.PASSTHROUGH


def _gpus(devices: dict[PciAddress, PciDevice], groups: dict[int, list[PciAddress]], parents: list[MdevParent],
          mdevs: list[Mdev], vfs: list[VendorVf], facts: NvidiaFacts, warnings: list[str]) -> list[Gpu]:
    parent_by_addr = {p.address: p for p in parents}
    vendor_by_addr = {v.address: v for v in vfs}
    mdevs_by_parent: dict[str | None, int] = {}
    for m in mdevs:
        mdevs_by_parent[m.parent] = mdevs_by_parent.get(m.parent, 0) + 1
    by_slot: dict[tuple[int, int, int], list[PciAddress]] = {}    # the functions of each slot that are not VFs
    for a, d in devices.items():
        if d.physfn is None:
            by_slot.setdefault(a.device_slot, []).append(a)
    gpus: list[Gpu] = []
    for addr, dev in sorted(devices.items()):
        if not dev.is_gpu or dev.physfn is not None:
            continue
        backend = _backend(dev, parent_by_addr.get(str(addr)), parent_by_addr, vendor_by_addr)
        in_use = sum(mdevs_by_parent.get(p, 0) for p in {str(addr), *(str(v) for v in dev.virtfns)})
        in_use += sum(1 for v in dev.virtfns if v in vendor_by_addr and vendor_by_addr[v].current_type)
        functions = [a for a in by_slot.get(addr.device_slot, ()) if a != addr]
        peers = [a for a in groups.get(dev.iommu_group, []) if a != addr] if dev.iommu_group is not None else []
        gpus.append(Gpu(
            address=addr, vendor=dev.vendor, device=dev.device, driver=dev.driver, backend=backend,
            numa_node=dev.numa_node, vfs=list(dev.virtfns), vendor_name=VENDOR_NAMES.get(dev.vendor or ""),
            pci_class=dev.pci_class, iommu_group=dev.iommu_group, group_peers=peers, functions=sorted(functions),
            local_cpulist=dev.local_cpulist, reset_methods=dev.reset_methods,
            sriov_totalvfs=dev.sriov_totalvfs, sriov_numvfs=dev.sriov_numvfs, vgpus_in_use=in_use,
            domain=dev.domain, boot_vga=dev.boot_vga, nvidia=facts.by_address.get(addr),
            notes=_gpu_notes(dev, backend, facts.by_address.get(addr)),
        ))
        warnings.extend(_group_warnings(dev, peers, devices))
    return gpus


#: What nvidia-smi's Virtualization Mode says about where vgpuvirt runs (nvidia-smi -q, R580; a real H100
#: passed through to a VM guest said "Pass-Through", tests/fixtures/real/h100-580).
GUEST_NOTE = ("this OS is a VM guest: its hypervisor passes this GPU through to it (nvidia-smi: Virtualization "
              "Mode Pass-Through), and this driver is not a vGPU host driver: no vGPU can be created here; "
              "use the GPU whole in this OS, or run vgpuvirt on the hypervisor host")
NOT_VGPU_HOST_NOTE = ("this NVIDIA driver is not a vGPU host driver (nvidia-smi: Virtualization Mode None): "
                      "vGPU types appear only with NVIDIA's vGPU host driver; the GPU can be passed through whole")


def _gpu_notes(dev: PciDevice, backend: Backend, nvidia: NvidiaGpuFacts | None = None) -> list[str]:
    notes: list[str] = []
    mode = (nvidia.virtualization_mode or "") if nvidia is not None else ""
    if mode == "Pass-Through":
        notes.append(GUEST_NOTE)
    elif mode == "None" and backend is Backend.PASSTHROUGH and dev.pci_class == "0x030200":
        # a datacenter board (3D controller) on the plain datacenter driver: the usual reason for "no vGPU
        # types" that a user cannot see in sysfs
        notes.append(NOT_VGPU_HOST_NOTE)
    if backend is Backend.PASSTHROUGH and dev.vendor == "0x10de" and (dev.sriov_totalvfs or 0) > 0 \
            and not dev.sriov_numvfs and dev.driver == "nvidia":
        notes.append(f"SR-IOV capable ({dev.sriov_totalvfs} VFs) but no VF is enabled: vGPU on this board "
                     f"needs VFs (/usr/lib/nvidia/sriov-manage -e {dev.address})")
    if dev.driver is None:
        notes.append("no driver bound")
    return notes


def _group_warnings(dev: PciDevice, peers: list[PciAddress], devices: dict[PciAddress, PciDevice]) -> list[str]:
    # Sharing a group with the card's own functions or with bridges is normal; anything else means
    # the GPU can only be given to a VM together with it.
    # A peer of unknown class (its attributes were not readable) is not judged.
    addr = dev.address
    strangers = [a for a in peers if a.device_slot != addr.device_slot and a != dev.upstream
                 and a in devices and devices[a].pci_class is not None and not devices[a].is_bridge]
    out: list[str] = []
    for a in strangers:
        other = devices[a]
        drv = f", driver {other.driver}" if other.driver else ""
        out.append(f"GPU {addr} shares its IOMMU group {dev.iommu_group} with {a} ({class_name(other.pci_class)}"
                   f"{drv}): they can only be assigned to a VM together")
    return out


def _domain_warnings(usage: Usage, devices: dict[PciAddress, PciDevice], mdevs: list[Mdev],
                     vfs: list[VendorVf], warnings: list[str]) -> None:
    for m in mdevs:
        if m.orphan:
            warnings.append(f"mdev {m.uuid} ({m.type} on {m.parent}) is not used by any libvirt domain (orphan)")
    for v in vfs:
        if v.orphan:
            warnings.append(f"VF {v.address} holds vGPU type {v.current_type} but no libvirt domain uses it "
                            "(orphan)")
    existing = {m.uuid for m in mdevs}
    for u, name in sorted(usage.mdev.items()):
        if u not in existing:
            warnings.append(f"domain {name} uses mdev {u}, which does not exist on this host")
    for a, name in sorted(usage.pci.items()):
        if a not in devices:
            warnings.append(f"domain {name} uses PCI device {a}, which does not exist on this host")
