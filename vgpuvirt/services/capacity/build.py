"""One :class:`~vgpuvirt.services.capacity.budget.GpuBudget` per physical GPU, from an inventory (pure).

What the inventory read is the state; the rules in :mod:`.budget` count from it. The facts
each budget needs and where they come from:

* types: mdev ``mdev_supported_types`` (framebuffer and ``max_instance`` from the description) and
  vGPU 17+ ``creatable_vgpu_types`` (framebuffer from the type name, ``NVIDIA L40S-8Q`` = 8 GiB);
* the GPU's framebuffer: nvidia-smi's ``fb_memory_usage/total``, else the largest mdev type's
  framebuffer x its maximum (the full-GPU type, e.g. ``T4-16Q`` x 1), else the largest vGPU 17+ type
  creatable on an empty GPU (the ``-48Q`` of an L40S); else unknown, and the kernel's counts rule;
* equal- or mixed-size mode: nvidia-smi's ``vgpu_heterogeneous_mode``, else equal-size (the driver's
  default) unless the GPU already holds vGPUs of several sizes;
* MIG mode and GPU instances: nvidia-smi ``mig_mode`` and ``nvidia-smi mig -lgi``;
* the GVT-g pool: a lower bound from the kernel's counts (each type's ``available_instances`` x its cost).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol

from vgpuvirt.services.capacity.budget import GpuBudget, Place, Resident, Sizing, VgpuType
from vgpuvirt.services.inventory.parts import (
    VENDOR_KEYS,
    Gpu,
    Mdev,
    MdevParent,
    MdevType,
    PciDevice,
    VendorType,
    VendorVf,
)
from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts
from vgpuvirt.services.pci import parsers as P
from vgpuvirt.usage import Backend, GpuUse


class Inventory(Protocol):
    """The parts of an inventory the capacity reads (:class:`~vgpuvirt.services.inventory.model.Inventory` has
    them; that class's JSON carries the budgets built here, so this module cannot import it)."""

    @property
    def host(self) -> str: ...
    @property
    def pci_devices(self) -> Sequence[PciDevice]: ...
    @property
    def mdev_parents(self) -> Sequence[MdevParent]: ...
    @property
    def mdevs(self) -> Sequence[Mdev]: ...
    @property
    def vendor_vgpu(self) -> Sequence[VendorVf]: ...
    @property
    def gpus(self) -> Sequence[Gpu]: ...

def _mdev_type(t: MdevType) -> VgpuType:
    cls = P.classify_vgpu_name(t.name)
    fb = t.framebuffer_mib
    if fb is None and cls.framebuffer_gib:
        fb = cls.framebuffer_gib * 1024
    mig = t.gi_profile if t.mig_backed else (cls.gi_profile if cls.mig_backed else None)
    gvt = None
    if t.gvtg is not None and None not in (t.gvtg.low_gm_mib, t.gvtg.high_gm_mib, t.gvtg.fence):
        gvt = (int(t.gvtg.low_gm_mib or 0), int(t.gvtg.high_gm_mib or 0), int(t.gvtg.fence or 0))
    return VgpuType(t.id, t.name, fb, t.max_instances, mig, gvt)


def _vendor_type(vt: VendorType) -> VgpuType:
    cls = vt.classification
    return VgpuType(f"nvidia-{vt.id}", vt.name or None, cls.framebuffer_gib * 1024 if cls.framebuffer_gib else None,
                    None, cls.gi_profile if cls.mig_backed else None)


def _vendor_vf_type(vf: VendorVf) -> VgpuType:
    return _vendor_type(VendorType(vf.current_type, vf.current_type_name or ""))


def _sizing(facts: NvidiaGpuFacts | None, residents: Iterable[Resident], vendor: str) -> Sizing | None:
    if vendor != "nvidia":
        return None
    mode = (facts.vgpu_heterogeneous_mode or "").lower() if facts else ""
    if mode == "enabled":
        return "mixed"
    if mode == "disabled":
        return "equal"
    sizes = {r.framebuffer_mib for r in residents if r.mig_profile is None and r.framebuffer_mib}
    return "mixed" if len(sizes) > 1 else "equal"


def _mixed_supported(facts: NvidiaGpuFacts | None) -> bool | None:
    # Mixed-size mode is a vGPU 17+ feature of SR-IOV (Ampere and later) time-sliced GPUs; the MIG-capable
    # compute boards (A100, A30, H100: mig_mode reported) do not offer it (NVIDIA vGPU user guide, "vGPU
    # modes"; INFERRED for boards the guide does not list). Unknown without nvidia-smi/NVML.
    if facts is None or facts.vgpu_heterogeneous_mode is None:
        return None
    if (facts.vgpu_heterogeneous_mode or "").lower() == "enabled":
        return True
    if facts.mixed_size_capable is not None:      # the driver says so (newer drivers)
        return facts.mixed_size_capable
    return (facts.host_vgpu_mode or "").lower() == "sr-iov" and facts.mig_mode_current in (None, "N/A")


def _framebuffer(facts: NvidiaGpuFacts | None, types: dict[str, VgpuType], mdev_types: list[MdevType],
                 empty: bool) -> int | None:
    if facts is not None and facts.memory_total_mib:
        return facts.memory_total_mib
    full = [(t.framebuffer_mib or 0) * t.max_instances for t in mdev_types
            if t.max_instances and t.framebuffer_mib and not t.mig_backed]
    if full:
        return max(full)
    if empty:
        # vGPU 17+: an empty GPU's VFs offer every type, the whole-GPU one included. An mdev parent's list says
        # nothing of the sort (a legacy board missing from the tables, a partial tree): its largest type is
        # no GPU size, and a count built on it would overrule the kernel's own.
        on_mdev = {t.id for t in mdev_types}
        sizes = [t.framebuffer_mib for t in types.values()
                 if t.framebuffer_mib and t.mig_profile is None and t.id not in on_mdev]
        return max(sizes) if sizes else None
    return None


def _gvtg_pool(parent: MdevParent) -> tuple[int, int, int] | None:
    # gvt/vgpu.c: available = min(low_free // low, high_free // high, fences_free // fence); each type's
    # count x its cost is therefore a lower bound of what is free in that dimension.
    if not parent.types or any(t.gvtg is None for t in parent.types):
        return None
    low = high = fences = 0
    for t in parent.types:
        g = t.gvtg
        assert g is not None
        n = t.available_instances or 0
        low = max(low, n * (g.low_gm_mib or 0))
        high = max(high, n * (g.high_gm_mib or 0))
        fences = max(fences, n * (g.fence or 0))
    return low, high, fences


def _mode(g: Gpu, residents: list[Resident], mig_enabled: bool | None, holder: str | None) -> GpuUse:
    if holder is not None:
        return GpuUse.WHOLE
    if g.backend is Backend.GVTG:
        return GpuUse.GVTG
    if residents:
        if any(r.mig_profile for r in residents):
            return GpuUse.MIG_VGPU
        return GpuUse.VENDOR_VF if g.backend is Backend.VENDOR_VFIO else GpuUse.MDEV
    if mig_enabled:
        return GpuUse.MIG
    if g.backend is Backend.SRIOV_VF:
        return GpuUse.VF
    return GpuUse.FREE


def gpu_budget(inv: Inventory, g: Gpu) -> GpuBudget:
    """The budget of one physical GPU of ``inv``."""
    parents = {p.address: p for p in inv.mdev_parents}
    vendor_vfs = {v.address: v for v in inv.vendor_vgpu}
    facts = g.nvidia
    vendor = VENDOR_KEYS.get((g.vendor or "").lower(), "other")
    types: dict[str, VgpuType] = {}
    places: list[Place] = []
    residents: list[Resident] = []
    mdev_types: list[MdevType] = []
    pool = None
    members = [g.address, *g.vfs]
    for a in members:
        p = parents.get(str(a))
        if p is not None:
            for t in p.types:
                if t.id not in types:            # a GPU's VFs repeat the same table: build each type once
                    types[t.id] = _mdev_type(t)
                    mdev_types.append(t)
            places.append(Place(p.address, GpuUse.MDEV, a != g.address,
                                {t.id: int(t.available_instances or 0) for t in p.types},
                                occupied=sum(t.instances for t in p.types) > 0))
            if a == g.address and g.backend is Backend.GVTG:
                pool = _gvtg_pool(p)
        vv = vendor_vfs.get(a)
        if vv is not None:
            offered = {}
            for vt in vv.creatable_types:
                vtype = _vendor_type(vt)
                types.setdefault(vtype.id, vtype)
                offered[vtype.id] = 1 if vv.free else 0
            if not vv.free:
                cur = _vendor_vf_type(vv)
                types.setdefault(cur.id, cur)
                residents.append(Resident(cur.id, cur.framebuffer_mib, str(a), cur.mig_profile))
            places.append(Place(str(a), GpuUse.VENDOR_VF, True, offered, occupied=not vv.free))
    on_places = {p.address for p in places if p.kind is GpuUse.MDEV}
    for m in inv.mdevs:
        if m.parent in on_places and m.type is not None:
            held = types.get(m.type) or VgpuType(m.type, None, None, None)
            residents.append(Resident(held.id, held.framebuffer_mib, m.parent, held.mig_profile))
    mig_enabled = None
    gis: dict[str, int] | None = None
    if facts is not None and facts.mig_mode_current in ("Enabled", "Disabled"):
        mig_enabled = facts.mig_mode_current == "Enabled"
        if facts.gpu_instances is not None:
            gis = dict(Counter(prof for _, prof in facts.gpu_instances))
    holder = g.domain or next((d.domain for d in inv.pci_devices if d.address in g.functions and d.domain), None)
    notes = []
    if vendor == "nvidia" and facts is None:
        notes.append("no nvidia-smi/NVML facts: framebuffer, sizing mode and MIG instances from sysfs only")
    return GpuBudget(
        host=inv.host, address=g.address, vendor=vendor, mode=_mode(g, residents, mig_enabled, holder),
        types=types, places=tuple(sorted(places, key=lambda p: (p.is_vf, p.address))),
        residents=tuple(residents),
        framebuffer_mib=_framebuffer(facts, types, mdev_types, not residents) if vendor == "nvidia" else None,
        sizing=_sizing(facts, residents, vendor), mixed_size_supported=_mixed_supported(facts),
        mig_enabled=mig_enabled, gpu_instances=gis, gvtg_pool=pool,
        gi_free=facts.gi_profiles_free if facts is not None and mig_enabled else None,
        vfs_total=g.sriov_totalvfs, vfs_enabled=len(g.vfs), whole_holder=holder, notes=tuple(notes))


def physical_gpus(inv: Inventory) -> list[Gpu]:
    """The inventory's GPUs less the VFs it also lists as GPUs (a VF is a place of its PF, not a GPU)."""
    gpu_addrs = {g.address for g in inv.gpus}
    pf_of = {d.address: d.physfn for d in inv.pci_devices}
    return [g for g in inv.gpus if pf_of.get(g.address) not in gpu_addrs]


def gpu_budgets(inv: Inventory) -> list[GpuBudget]:
    """One budget per physical GPU of ``inv``, in address order."""
    return [gpu_budget(inv, g) for g in sorted(physical_gpus(inv), key=lambda g: g.address)]
