"""What placement works on: each physical GPU of each host as its capacity budget
(:class:`~vgpuvirt.services.capacity.budget.GpuBudget`) plus the places a request can take (vGPU
parents and VFs, plain VFs, the whole GPU), built from an :class:`~vgpuvirt.services.inventory.read.Inventory`.

The budget answers "how many more of this type fit"; placement asks it, and on each choice replaces
it with ``budget.with_vgpu(...)``, so a plan of 64 VMs never counts one free instance twice and never
proposes what the driver refuses. Whole-GPU candidates carry the verdict of the IOMMU pre-flight
(:mod:`vgpuvirt.services.iommu.from_inventory`, the rules of ``vgpuvirt iommu check``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from vgpuvirt.errors import NoCapacity
from vgpuvirt.libvirt_storage import LibvirtFacts
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.provision.request import TypeProfile, VmRequest, parse_resolution
from vgpuvirt.services.capacity.budget import GpuBudget, VgpuType
from vgpuvirt.services.capacity.build import gpu_budget, physical_gpus
from vgpuvirt.services.inventory.host_resources import HostResources
from vgpuvirt.services.inventory.read import Gpu, Inventory, MdevType
from vgpuvirt.services.iommu.from_inventory import check_from_inventory
from vgpuvirt.services.pci.parsers import classify_vgpu_name
from vgpuvirt.usage import Backend, GpuUse
from vgpuvirt.xml.refs import domain_device_refs


@dataclass
class Slot:
    """One place to create something: an mdev parent, a vGPU-17 VF, a plain VF, or the whole GPU."""

    address: PciAddress
    kind: GpuUse                    # MDEV, VENDOR_VF, VF or WHOLE
    is_vf: bool = False
    available: dict[str, int] = field(default_factory=dict)     # as the kernel showed it when read
    profiles: dict[str, TypeProfile] = field(default_factory=dict)
    functions: tuple[PciAddress, ...] = ()                      # whole GPU: every function to pass
    blocked: str | None = None                                  # why nothing may go here


@dataclass(frozen=True)
class Locality:
    """Where a PCI device sits: its NUMA node and the bridges above it (nearest first), to tell which
    devices share a PCIe switch or root port."""

    numa_node: int | None
    bridges: tuple[PciAddress, ...] = ()


def localities(inv: Inventory) -> dict[PciAddress, Locality]:
    up = {d.address: d.upstream for d in inv.pci_devices}
    out: dict[PciAddress, Locality] = {}
    for d in inv.pci_devices:
        chain: list[PciAddress] = []
        b = d.upstream
        while b is not None and b not in chain and len(chain) < 16:   # a malformed tree must not loop
            chain.append(b)
            b = up.get(b)
        out[d.address] = Locality(d.numa_node, tuple(chain))
    return out


@dataclass
class GpuState:
    host: str
    address: PciAddress
    vendor: str
    numa_node: int | None
    backend: str
    budget: GpuBudget
    slots: list[Slot] = field(default_factory=list)
    whole_blocked: str | None = None        # why it must not be passed through whole (IOMMU, boot VGA, ...)
    boot_vga: bool = False
    companions: tuple[PciAddress, ...] = ()  # same-slot functions in its IOMMU group: they go along
    whole_taken: str | None = None          # why the whole GPU is not free
    vfs_in_use: int = 0                     # plain VFs handed to domains (existing + planned)
    sriov_capable: int = 0                  # VFs a PF with SR-IOV off could enable (vGPU boards)
    switch_to_mixed: bool = False           # counted in mixed-size mode: the plan switches it (--heterogeneous)
    unhealthy: str | None = None            # why placement must not use it (XID, ECC, pending repair, PCIe link)
    cordoned: str | None = None             # its host is cordoned (why): placement skips it
    # Every vGPU type of its mdev parents and vGPU 17+ VFs, once each (a GPU's VFs repeat one table).
    type_profiles: dict[str, TypeProfile] = field(default_factory=dict)
    local_cpus: str | None = None           # the host CPUs nearest the GPU (sysfs local_cpulist)

    @property
    def residents(self) -> int:
        return len(self.budget.residents)

    @property
    def used(self) -> int:
        return self.residents + self.vfs_in_use + (1 if self.whole_taken else 0)

    def clone(self) -> GpuState:
        return replace(self, slots=[replace(s, available=dict(s.available)) for s in self.slots])


@dataclass
class HostState:
    name: str
    gpus: list[GpuState]
    free_nic_vfs: list[tuple[PciAddress, PciAddress]] = field(default_factory=list)   # (vf, pf)
    existing_mdevs: dict[MdevUuid, tuple[str, str]] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)        # name -> XML
    vf_types: dict[PciAddress, int] = field(default_factory=dict)  # vendor VF -> current type
    nic_pfs_off: list[tuple[PciAddress, int]] = field(default_factory=list)  # (NIC PF with SR-IOV off, total VFs)
    locality: Mapping[PciAddress, Locality] = field(default_factory=dict)   # read-only, shared by clones
    resources: HostResources = field(default_factory=HostResources)  # CPUs, free hugepages (pre-flight)
    libvirt: LibvirtFacts | None = None      # networks, pools, firmware (pre-flight); None: not read

    @property
    def used(self) -> int:
        return sum(g.used for g in self.gpus)

    # -- what a step's done_in asks (vgpuvirt.change.step.HostFacts) --------------------------------------
    def has_mdev(self, uuid: MdevUuid) -> bool:
        return uuid in self.existing_mdevs

    def vf_type(self, vf: PciAddress) -> int | None:
        return self.vf_types.get(vf)

    def domain_xml(self, name: str) -> str | None:
        return self.domains.get(name)

    def mixed_size(self, gpu: PciAddress) -> bool:
        return any(g.address == gpu and g.budget.sizing == "mixed" and not g.switch_to_mixed for g in self.gpus)

    def volumes(self, pool: str) -> frozenset[str] | None:
        p = self.libvirt.pools.get(pool) if self.libvirt is not None else None
        return frozenset(p.volumes) if p is not None else None

    def take_again(self, place: str, type_ids: Sequence[str], what: str) -> None:
        """Count one vGPU that is missing and will be made again on ``place`` (one of ``type_ids``: the forms a
        type may be named in); :class:`NoCapacity` with "0 of 1 fit" when the GPU has no room for it. A place
        or type the host does not show now (VFs gone) is left to the apply, which says why."""
        g = next((g for g in self.gpus if any(p.address == place for p in g.budget.places)), None)
        tid = next((t for t in type_ids if g is not None and t in g.budget.types), None)
        if g is None or tid is None:
            return
        fit = g.budget.fit(tid)
        if fit.fits_now < 1 or g.budget.free_place(tid, among=[place]) is None:
            raise NoCapacity(self.name, place, f"{what} is missing and cannot be made again on {place}: 0 of 1 fit "
                                               f"({fit.reason}); vGPUs no domain uses are listed by `vgpuvirt gc` "
                                               "and removed by `gc --apply`", fit=0, wanted=1)
        g.budget = g.budget.with_vgpu(tid, place)

    def clone(self) -> HostState:
        """A copy placement may change: GPU states and slots are copied; budgets and type profiles are
        immutable and shared (a deep copy of a large host cost ~30 ms, this ~1 ms)."""
        return HostState(self.name, [g.clone() for g in self.gpus], list(self.free_nic_vfs),
                         dict(self.existing_mdevs), dict(self.domains), dict(self.vf_types),
                         list(self.nic_pfs_off), self.locality, self.resources, self.libvirt)


def _profile(t: MdevType, vendor: str, vt: VgpuType | None) -> TypeProfile:
    cls = classify_vgpu_name(t.name) if vendor == "nvidia" else None
    series = t.series or (cls.series if cls else None)
    mig: bool | None = t.mig_backed or (cls.mig_backed if cls is not None and cls.series else None)
    if mig is None and vendor == "nvidia" and series:
        mig = False
    return TypeProfile(id=str(t.id), name=str(t.name or t.id), vendor=vendor,
                       framebuffer_mib=vt.framebuffer_mib if vt else t.framebuffer_mib, num_heads=t.num_heads,
                       max_resolution=parse_resolution(t.max_resolution), series=series, mig_backed=mig,
                       max_instances=t.max_instances)


def _vendor_profile(vt: VgpuType) -> TypeProfile:
    cls = classify_vgpu_name(vt.name)
    return TypeProfile(id=vt.id, name=str(vt.name or vt.id), vendor="nvidia", framebuffer_mib=vt.framebuffer_mib,
                       series=cls.series, mig_backed=cls.mig_backed if cls.series else None)


def _vgpu_slots(inv: Inventory, b: GpuBudget, vendor: str, used_pci: Mapping[PciAddress, str]) -> list[Slot]:
    parents = {p.address: p for p in inv.mdev_parents}
    slots: list[Slot] = []
    made: dict[str, TypeProfile] = {}           # a GPU's VFs repeat one type table: one profile per type
    for place in b.places:
        a = PciAddress.parse(place.address)
        if place.kind == GpuUse.MDEV:
            p = parents[place.address]
            profiles = {}
            for t in p.types:
                prof = made.get(t.id)
                if prof is None:
                    prof = made[t.id] = _profile(t, vendor, b.types.get(t.id))
                profiles[t.id] = prof
            slots.append(Slot(a, GpuUse.MDEV, place.is_vf, dict(place.kernel), profiles))
        else:
            profiles = {tid: _vendor_profile(b.types[tid]) for tid in place.kernel}
            # a VF another domain's definition names is that domain's even with no type set now (its VM is off,
            # or the host rebooted and the types went): typing it for a new VM would hand one VF to two domains,
            # and detach would then refuse to reset it
            blocked = ("VF holds a vGPU" if place.occupied
                       else f"used by domain {used_pci[a]}" if a in used_pci else None)
            slots.append(Slot(a, GpuUse.VENDOR_VF, True, dict(place.kernel), profiles, blocked=blocked))
    return slots


def _whole(inv: Inventory, g: Gpu, used_pci: Mapping[PciAddress, str]) -> tuple[str | None, tuple[PciAddress, ...]]:
    """Why ``g`` cannot be passed through whole (None: it can), and the functions that go along."""
    if not inv.iommu_enabled:
        return "IOMMU is off on this host", ()
    users = {a: [d] for a, d in used_pci.items()}
    check = check_from_inventory(inv, [g.address], users)[0]
    if check.blocking:
        return "IOMMU check: " + "; ".join(check.blocking), check.must_include
    return None, check.must_include


def host_state(inv: Inventory, domains: Iterable[tuple[str, str]] = ()) -> HostState:
    """Normalize one Inventory (+ the host's libvirt domains) for placement."""
    doms = dict(domains)
    used_pci: dict[PciAddress, str] = {}
    for name, xml in doms.items():
        for a in domain_device_refs(xml).pci:
            used_pci[a] = name
    pci = {d.address: d for d in inv.pci_devices}
    existing = {m.uuid: (str(m.parent), str(m.type)) for m in inv.mdevs if m.parent}
    hs = HostState(inv.host, [], existing_mdevs=existing, domains=doms,
                   vf_types={v.address: int(v.current_type) for v in inv.vendor_vgpu}, locality=localities(inv),
                   resources=inv.resources)
    for g in physical_gpus(inv):
        dev = pci.get(g.address)
        budget = gpu_budget(inv, g)
        vendor = budget.vendor
        holder = next((used_pci[a] for a in (g.address, *g.functions) if a in used_pci), None)
        if holder is not None and budget.whole_holder is None:
            budget = budget.whole_taken(holder)
        gs = GpuState(host=inv.host, address=g.address, vendor=vendor, numa_node=g.numa_node,
                      backend=g.backend, budget=budget, boot_vga=bool(g.boot_vga), local_cpus=g.local_cpulist,
                      unhealthy="; ".join(g.health.reasons) if g.health and not g.health.healthy else None,
                      cordoned=inv.cordon.reason if inv.cordon is not None else None)
        gs.slots = _vgpu_slots(inv, budget, vendor, used_pci)
        gs.type_profiles = {tid: p for s in reversed(gs.slots) for tid, p in s.profiles.items()}
        vfs = list(dev.virtfns) if dev is not None else []
        if g.backend is Backend.SRIOV_VF or (not budget.places and vfs):
            for va in vfs:
                slot = Slot(va, GpuUse.VF, is_vf=True, available={"vf": 1},
                            profiles={"vf": TypeProfile("vf", f"VF of {g.address}", vendor)})
                if va in used_pci:
                    slot.available["vf"] = 0
                    slot.blocked = f"used by domain {used_pci[va]}"
                    gs.vfs_in_use += 1
                gs.slots.append(slot)
        gs.whole_blocked, gs.companions = _whole(inv, g, used_pci)
        funcs = tuple(sorted({g.address, *g.functions, *gs.companions}))
        gs.slots.append(Slot(g.address, GpuUse.WHOLE, available={"passthrough": 1}, functions=funcs,
                             profiles={"passthrough": TypeProfile("passthrough", f"whole GPU {g.address}", vendor)}))
        if holder:
            gs.whole_taken = f"passed through to domain {holder}"
        if (vendor == "nvidia" and not vfs and not budget.places and g.driver == "nvidia"
                and (g.sriov_totalvfs or 0) > 0):
            gs.sriov_capable = int(g.sriov_totalvfs or 0)
        hs.gpus.append(gs)
    for d in inv.pci_devices:
        if (d.pci_class or "").startswith("0x02") and d.physfn is not None and d.address not in used_pci:
            hs.free_nic_vfs.append((d.address, d.physfn))
        elif ((d.pci_class or "").startswith("0x02") and d.physfn is None and (d.sriov_totalvfs or 0) > 0
              and not d.sriov_numvfs and d.driver and d.address not in used_pci):
            hs.nic_pfs_off.append((d.address, int(d.sriov_totalvfs or 0)))
    hs.gpus.sort(key=lambda g: g.address)
    return hs


def host_states(inventories: Mapping[str, Inventory] | Iterable[Inventory],
                domains: Mapping[str, Iterable[tuple[str, str]]] | None = None,
                libvirt: Mapping[str, LibvirtFacts] | None = None) -> dict[str, HostState]:
    invs = list(inventories.values()) if isinstance(inventories, Mapping) else list(inventories)
    out: dict[str, HostState] = {}
    for inv in invs:
        out[inv.host] = host_state(inv, (domains or {}).get(inv.host, ()))
        out[inv.host].libvirt = (libvirt or {}).get(inv.host)
    return out


def allow_mixed_size(hosts: Iterable[HostState]) -> None:
    """``--heterogeneous``: count idle GPUs that support mixed-size mode in that mode; the plan then
    switches those it uses (``nvidia-smi vgpu -i GPU -shm 1`` is refused while a GPU holds a vGPU)."""
    for h in hosts:
        for g in h.gpus:
            b = g.budget
            if b.sizing == "equal" and not b.residents and b.mixed_size_supported:
                g.budget = replace(b, sizing="mixed")
                g.switch_to_mixed = True
            elif b.sizing == "equal" and b.residents and b.mixed_size_supported:
                g.budget = replace(b, notes=(*b.notes, "equal-size mode with vGPUs: it can switch to mixed-size "
                                                       "mode only once it holds none"))
            elif b.sizing == "equal" and b.mixed_size_supported is False:
                g.budget = replace(b, notes=(*b.notes, "this GPU has no mixed-size mode (equal-size only)"))


@dataclass(frozen=True)
class SriovPrep:
    """Enable the VFs of a PF whose SR-IOV is off: an NVIDIA vGPU board (``purpose="vgpu"``: its vGPU
    types live on the VFs) or a NIC (``"nic"``: VMs asked for NIC VFs and none is free)."""

    host: str
    pf: PciAddress
    vfs: int
    purpose: str = "vgpu"

    def describe(self) -> str:
        if self.purpose == "nic":
            return (f"enable {self.vfs} SR-IOV VFs on NIC {self.pf} (a VM asks for a NIC VF and none is free; "
                    "disabled again if the run fails)")
        return f"enable {self.vfs} SR-IOV VFs on {self.pf} (its vGPU types appear on the VFs)"

    def to_dict(self) -> dict[str, object]:
        return {"action": "enable-sriov", "host": self.host, "pf": str(self.pf), "vfs": self.vfs,
                "purpose": self.purpose}


def sriov_preparation(hosts: Mapping[str, HostState], vms: Iterable[VmRequest]) -> list[SriovPrep]:
    """The VF enablements that could let vGPU requests be placed (NVIDIA boards with SR-IOV off), or []."""
    wanted = [vm for vm in vms if any(r.mode == "vgpu" for r in vm.gpus)]
    if not wanted:
        return []
    pinned = {vm.host for vm in wanted}
    out = []
    for h in hosts.values():
        if None not in pinned and h.name not in pinned:
            continue
        for g in h.gpus:
            if g.sriov_capable and not g.whole_taken:
                out.append(SriovPrep(h.name, g.address, g.sriov_capable))
    return out
