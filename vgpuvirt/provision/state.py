"""What placement works on: each physical GPU of each host, with the places a vGPU (or the whole
GPU, or a VF) can go, built from an :class:`~vgpuvirt.services.inventory.Inventory`.

The kernel's numbers (``available_instances``, ``creatable_vgpu_types``) are the starting truth;
placement then subtracts what the plan itself will create, following the same rules
(:func:`vgpuvirt.services.capacity.may_place`), so a plan of 64 VMs never counts one free
instance twice.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.provision.request import VENDOR_IDS, TypeProfile, parse_resolution
from vgpuvirt.services.inventory import Inventory, MdevType, VendorType
from vgpuvirt.services.parsers import classify_vgpu_name, domain_device_refs

SlotKind = Literal["mdev", "vendor-vf", "vf", "whole"]


@dataclass
class Slot:
    """One place to create something: an mdev parent, a vGPU-17 VF, a plain VF, or the whole GPU."""

    address: PciAddress
    kind: SlotKind
    is_vf: bool = False
    available: dict[str, int] = field(default_factory=dict)     # type id -> instances creatable now
    profiles: dict[str, TypeProfile] = field(default_factory=dict)
    functions: tuple[PciAddress, ...] = ()                      # whole GPU: every function to pass
    blocked: str | None = None                                  # why nothing may go here


@dataclass
class GpuState:
    host: str
    address: PciAddress
    vendor: str
    numa_node: int | None
    backend: str
    slots: list[Slot] = field(default_factory=list)
    residents: list[int | None] = field(default_factory=list)  # framebuffer per vGPU on it (existing + planned)
    vfs_in_use: int = 0                                         # plain VFs handed to domains (existing + planned)
    heterogeneous: bool = False
    total_fb_mib: int | None = None
    whole_taken: str | None = None                              # why the whole GPU is not free
    vfs_enabled: int = 0                                        # SR-IOV VFs present on this PF
    whole_blocked: str | None = None                            # why it must not be passed through whole
    planned: int = 0
    # MIG-backed types on VFs: every VF says "1" while a free GPU instance of that profile remains, so
    # the GPU-wide count is the largest per-VF figure, not the sum (the GI table is not in sysfs):
    # conservative, a rerun places more once the kernel shows them.
    mig_budget: dict[str, int] = field(default_factory=dict)

    @property
    def used(self) -> int:
        return len(self.residents) + self.vfs_in_use + (1 if self.whole_taken else 0)


@dataclass
class HostState:
    name: str
    gpus: list[GpuState]
    free_nic_vfs: list[tuple[PciAddress, PciAddress]] = field(default_factory=list)   # (vf, pf)
    existing_mdevs: dict[MdevUuid, tuple[str, str]] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)        # name -> XML
    vf_types: dict[PciAddress, int] = field(default_factory=dict)  # vendor VF -> current type

    @property
    def used(self) -> int:
        return sum(g.used for g in self.gpus)

    def clone(self) -> HostState:
        return copy.deepcopy(self)


def _vendor(v: str | None) -> str:
    return VENDOR_IDS.get((v or "").lower(), "other")


def _profile(t: MdevType, vendor: str) -> TypeProfile:
    cls = classify_vgpu_name(t.name) if vendor == "nvidia" else None
    fb = t.framebuffer_mib
    if fb is None and cls is not None and cls.framebuffer_gib:
        fb = cls.framebuffer_gib * 1024
    series = t.series or (cls.series if cls else None)
    mig: bool | None = t.mig_backed or (cls.mig_backed if cls is not None and cls.series else None)
    if mig is None and vendor == "nvidia" and series:
        mig = False
    return TypeProfile(id=str(t.id), name=str(t.name or t.id), vendor=vendor, framebuffer_mib=fb,
                       num_heads=t.num_heads, max_resolution=parse_resolution(t.max_resolution),
                       series=series, mig_backed=mig, max_instances=t.max_instances)


def _vendor_profile(vt: VendorType) -> TypeProfile:
    cls = classify_vgpu_name(vt.name)
    return TypeProfile(id=f"nvidia-{int(vt.id)}", name=str(vt.name), vendor="nvidia",
                       framebuffer_mib=cls.framebuffer_gib * 1024 if cls.framebuffer_gib else None,
                       series=cls.series, mig_backed=cls.mig_backed if cls.series else None)


def host_state(inv: Inventory, domains: Iterable[tuple[str, str]] = (), *, heterogeneous: bool = False) -> HostState:
    """Normalize one Inventory (+ the host's libvirt domains) for placement."""
    doms = dict(domains)
    used_pci: dict[PciAddress, str] = {}
    for name, xml in doms.items():
        refs = domain_device_refs(xml)
        for a in refs.pci:
            used_pci[a] = name
    pci = {d.address: d for d in inv.pci_devices}
    parents = {str(p.address): p for p in inv.mdev_parents}
    vendor_vfs = {v.address: v for v in inv.vendor_vgpu}
    gpu_addrs = {g.address for g in inv.gpus}
    existing = {m.uuid: (str(m.parent), str(m.type)) for m in inv.mdevs if m.parent}
    hs = HostState(inv.host, [], existing_mdevs=existing, domains=doms,
                   vf_types={v.address: int(v.current_type) for v in inv.vendor_vgpu})
    for g in inv.gpus:
        dev = pci.get(g.address)
        if dev is not None and dev.physfn is not None and dev.physfn in gpu_addrs:
            continue  # a VF listed as a GPU: it is a slot of its PF, not a GPU of its own
        vendor = _vendor(g.vendor)
        gs = GpuState(host=inv.host, address=g.address, vendor=vendor, numa_node=g.numa_node,
                      backend=g.backend, heterogeneous=heterogeneous)
        vfs = list(dev.virtfns) if dev is not None else []
        gs.vfs_enabled = len(vfs)
        if g.boot_vga:
            gs.whole_blocked = "boot VGA device (the host's console)"
        elif not inv.iommu_enabled:
            gs.whole_blocked = "IOMMU is off on this host"
        parent_addrs = [a for a in [g.address, *vfs] if str(a) in parents]
        fbs: list[int] = []
        for pa in parent_addrs:
            slot = Slot(pa, "mdev", is_vf=pa != g.address)
            for t in parents[str(pa)].types:
                prof = _profile(t, vendor)
                slot.profiles[prof.id] = prof
                slot.available[prof.id] = int(t.available_instances or 0)
                if prof.framebuffer_mib and prof.max_instances:
                    fbs.append(prof.framebuffer_mib * prof.max_instances)
            gs.slots.append(slot)
        parent_names = {str(a) for a in parent_addrs}
        prof_by_id = {pid: p for s in gs.slots for pid, p in s.profiles.items()}
        for m in inv.mdevs:
            if m.parent in parent_names:
                p = prof_by_id.get(str(m.type))
                gs.residents.append(p.framebuffer_mib if p else None)
        for va in vfs:
            vv = vendor_vfs.get(va)
            if vv is None:
                continue
            slot = Slot(va, "vendor-vf", is_vf=True)
            for vt in vv.creatable_types:
                prof = _vendor_profile(vt)
                slot.profiles[prof.id] = prof
                slot.available[prof.id] = 1 if int(vv.current_type) == 0 else 0
                if prof.framebuffer_mib:
                    fbs.append(prof.framebuffer_mib)
            if int(vv.current_type) != 0:
                cls = classify_vgpu_name(vv.current_type_name)
                gs.residents.append(cls.framebuffer_gib * 1024 if cls.framebuffer_gib else None)
                slot.blocked = f"VF has vGPU type {vv.current_type}"
            gs.slots.append(slot)
        if g.backend == "sriov-vf" or (not parent_addrs and not any(a in vendor_vfs for a in vfs) and vfs):
            for va in vfs:
                slot = Slot(va, "vf", is_vf=True, available={"vf": 1},
                            profiles={"vf": TypeProfile("vf", f"VF of {g.address}", vendor)})
                if va in used_pci:
                    slot.available["vf"] = 0
                    slot.blocked = f"used by domain {used_pci[va]}"
                    gs.vfs_in_use += 1
                gs.slots.append(slot)
        for slot in gs.slots:
            if slot.is_vf:
                for tid, prof in slot.profiles.items():
                    if prof.mig_backed:
                        gs.mig_budget[tid] = max(gs.mig_budget.get(tid, 0), slot.available.get(tid, 0))
        funcs = tuple(sorted({g.address, *g.functions}))
        whole = Slot(g.address, "whole", available={"passthrough": 1}, functions=funcs or (g.address,),
                     profiles={"passthrough": TypeProfile("passthrough", f"whole GPU {g.address}", vendor)})
        holder = next((used_pci[a] for a in whole.functions if a in used_pci), None)
        if holder:
            gs.whole_taken = f"passed through to domain {holder}"
        gs.slots.append(whole)
        gs.total_fb_mib = (max(fbs) + (sum(r or 0 for r in gs.residents) if not parent_addrs else 0)) if fbs else None
        hs.gpus.append(gs)
    for d in inv.pci_devices:
        cls_hex = (d.pci_class or "")
        if cls_hex.startswith("0x02") and d.physfn is not None and d.address not in used_pci:
            hs.free_nic_vfs.append((d.address, d.physfn))
    hs.gpus.sort(key=lambda g: g.address)
    return hs


def host_states(inventories: Mapping[str, Inventory] | Iterable[Inventory],
                domains: Mapping[str, Iterable[tuple[str, str]]] | None = None, *,
                heterogeneous: bool = False) -> dict[str, HostState]:
    invs = list(inventories.values()) if isinstance(inventories, Mapping) else list(inventories)
    out: dict[str, HostState] = {}
    for inv in invs:
        out[inv.host] = host_state(inv, (domains or {}).get(inv.host, ()), heterogeneous=heterogeneous)
    return out
