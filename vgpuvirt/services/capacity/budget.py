"""Every physical GPU as one shared budget: its mode, what it holds, and how many more of each vGPU
type fit now. Pure: :func:`~vgpuvirt.services.capacity.build.gpu_budgets` makes a
:class:`GpuBudget` per GPU from an inventory; placement adds planned vGPUs with
:meth:`GpuBudget.with_vgpu` and asks :meth:`GpuBudget.fit` again, so a plan never counts one
instance twice and never proposes what the driver would refuse.

The rules, and where they come from (the simulator implements the same documents on its own; the
property tests in tests/property set one against the other):

* **One mode at a time.** A GPU is free, passed through whole, a time-sliced vGPU host (mdev on the
  PF, mdev on SR-IOV VFs, or vGPU 17+ ``current_vgpu_type`` on VFs), in MIG mode (with MIG-backed
  vGPUs), a GVT-g pool, or a set of plain SR-IOV VFs. A GPU with any vGPU cannot go whole, and a PF
  with VFs enabled is not assignable whole (kernel ``drivers/pci/iov.c``; libvirt refuses both).
* **Equal-size mode** (NVIDIA vGPU user guide, "Virtual GPU Types"; the default): every time-sliced
  vGPU on one physical GPU has the same framebuffer size, and at most ``max_instances`` of that size
  exist ("If the number is 0, either an instance of another vGPU type already exists on the
  physical GPU, or the maximum number of allowed instances has already been created").
* **Mixed-size mode** (vGPU 17+, ``nvidia-smi vgpu -shm 1``, only while the GPU has no vGPU): sizes
  mix while the framebuffer they take together fits the GPU, each type still at most its maximum.
* **Maximum instances** of a type: the driver's ``max_instance`` where sysfs gives it (mdev
  descriptions); otherwise NVIDIA's tables, which are ``framebuffer // type framebuffer`` capped by
  the VFs the GPU has (e.g. L40S 48 GiB: 8Q -> 6, 1Q -> 32 = sriov_totalvfs).
* **SR-IOV GPUs** (Ampere and later) hold one vGPU per VF: a free VF is needed for each.
* **MIG-backed types** (NVIDIA MIG user guide; vGPU user guide "MIG-backed vGPU"): MIG mode must be on,
  one vGPU takes one unused GPU instance of its profile, and time-sliced types are not creatable
  while MIG is on.
* **GVT-g** (kernel ``gvt/vgpu.c``): instances draw low/high graphics memory and fences from one pool.

Where the host is the only authority (no framebuffer size known, no GPU-instance table: generic mdev
types, a legacy NVIDIA type missing from the tables, unknown vendors), the budget takes the kernel's own
figure for the current state, exactly (``exact`` False: "the host's own count"), never less and never more;
instances of the same type already planned are taken off it, and nothing more is planned once another
type is planned on the same GPU (how types share the device is then unknown). On SR-IOV GPUs each VF's
figure is only that VF's, so there one is planned at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vgpuvirt.model import PciAddress
from vgpuvirt.usage import GpuUse

Sizing = Literal["equal", "mixed"]


@dataclass(frozen=True)
class VgpuType:
    """A vGPU type as the rules see it."""

    id: str                                  # as created: "nvidia-231", "i915-GVTg_V5_4"; vGPU 17+: "nvidia-1152"
    name: str | None
    framebuffer_mib: int | None
    max_instances: int | None                # per physical GPU (equal-size mode), None: unknown
    mig_profile: str | None = None           # GPU-instance profile of a MIG-backed type ("1g.10gb")
    gvtg: tuple[int, int, int] | None = None  # GVT-g cost: (low gm MiB, high gm MiB, fences)


@dataclass(frozen=True)
class Place:
    """Where a vGPU is created: an mdev parent (a PF holds many, a VF one) or a vGPU 17+ VF."""

    address: str
    kind: GpuUse                             # MDEV or VENDOR_VF
    is_vf: bool
    kernel: Mapping[str, int]                # type id -> instances the kernel showed when read
    occupied: bool = False                   # a VF that holds its one vGPU (existing or planned)


@dataclass(frozen=True)
class Resident:
    """One vGPU on the GPU, existing or planned."""

    type_id: str
    framebuffer_mib: int | None
    place: str
    mig_profile: str | None = None
    planned: bool = False


@dataclass(frozen=True)
class TypeFit:
    """How many more vGPUs of one type fit on one GPU now, and the arithmetic that says so."""

    type_id: str
    fits_now: int
    exact: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.type_id, "fits_now": self.fits_now, "exact": self.exact, "reason": self.reason}


@dataclass(frozen=True)
class GpuBudget:
    host: str
    address: PciAddress
    vendor: str                              # nvidia | intel | amd | other
    mode: GpuUse
    types: Mapping[str, VgpuType] = field(default_factory=dict)
    places: tuple[Place, ...] = ()
    residents: tuple[Resident, ...] = ()
    framebuffer_mib: int | None = None
    sizing: Sizing | None = None             # NVIDIA time-sliced: equal- or mixed-size mode
    mixed_size_supported: bool | None = None
    mig_enabled: bool | None = None
    gpu_instances: Mapping[str, int] | None = None   # MIG profile -> GPU instances; None: not known
    gi_free: Mapping[str, int] | None = None         # MIG profile -> more GIs the free slices take (-lgip)
    gvtg_pool: tuple[int, int, int] | None = None    # free (low gm, high gm, fences), a lower bound
    vfs_total: int | None = None
    vfs_enabled: int = 0
    whole_holder: str | None = None          # the domain the whole GPU is passed through to
    notes: tuple[str, ...] = ()

    # -- rules ---------------------------------------------------------------------------------

    @property
    def sriov(self) -> bool:
        return any(p.is_vf for p in self.places)

    def fit(self, type_id: str) -> TypeFit:
        """How many more of ``type_id`` fit now, given every resident (existing and planned)."""
        t = self.types.get(type_id)
        if t is None:
            return TypeFit(type_id, 0, True, "not offered by this GPU")
        if self.whole_holder is not None:
            return TypeFit(type_id, 0, True, f"the whole GPU is passed through to domain {self.whole_holder}")
        if t.gvtg is not None and self.gvtg_pool is not None:
            n, exact, why = self._gvtg_fit(t)
        elif t.mig_profile is not None:
            n, exact, why = self._mig_fit(t)
        elif self.mig_enabled:
            return TypeFit(type_id, 0, True, "MIG mode is on: only MIG-backed types are creatable")
        else:
            n, exact, why = self._time_sliced_fit(t)
        if n <= 0:
            return TypeFit(type_id, 0, exact, why)
        n, exact, why = self._place_cap(t, n, exact, why)
        return TypeFit(type_id, max(0, n), exact, why)

    def max_of(self, t: VgpuType) -> tuple[int | None, str]:
        if t.max_instances is not None:
            return t.max_instances, f"max {t.max_instances} per GPU"
        if self.framebuffer_mib and t.framebuffer_mib:
            n = self.framebuffer_mib // t.framebuffer_mib
            if self.vfs_total and self.sriov:
                n = min(n, self.vfs_total)
            return n, f"max {n} per GPU ({_gib(self.framebuffer_mib)} / {_gib(t.framebuffer_mib)}" + (
                f", {self.vfs_total} VFs)" if self.vfs_total and self.sriov else ")")
        return None, "max unknown"

    def _time_sliced_fit(self, t: VgpuType) -> tuple[int, bool, str]:
        mx, mx_why = self.max_of(t)
        here = [r for r in self.residents if r.mig_profile is None]
        if self.sizing == "mixed":
            same = sum(1 for r in here if r.type_id == t.id)
            if mx is None or not self.framebuffer_mib or t.framebuffer_mib is None:
                return self._kernel_only(t, "mixed-size mode, framebuffer unknown")
            unsized = sorted({r.type_id for r in here if r.framebuffer_mib is None})
            if unsized:
                # A vGPU whose type this host did not name (vGPU 17+: a VF's current_vgpu_type is a number, and
                # only the types still creatable are listed): what is left of the framebuffer is unknown, and a
                # count that took it as 0 would plan vGPUs the driver refuses (EIO).
                return self._kernel_only(t, "mixed-size mode, framebuffer in use unknown (a vGPU of type "
                                            f"{', '.join(unsized)} of unknown size)")
            used = sum(r.framebuffer_mib or 0 for r in here)
            by_fb = (self.framebuffer_mib - used) // t.framebuffer_mib
            n = min(mx - same, by_fb)
            return n, True, (f"{_gib(self.framebuffer_mib)}, mixed-size mode, {_gib(used)} in use, "
                             f"{_gib(t.framebuffer_mib)} type ({mx_why}, {same} of it exist): {max(n, 0)} fit")
        sizes = sorted({r.framebuffer_mib for r in here if r.framebuffer_mib is not None})
        if sizes and (t.framebuffer_mib is None or sizes != [t.framebuffer_mib]):
            have = ", ".join(_gib(s) for s in sizes)
            return 0, True, (f"equal-size mode: the GPU holds {len(here)} vGPU(s) of {have}, this type is "
                             f"{_gib(t.framebuffer_mib) if t.framebuffer_mib else 'of unknown size'}")
        if mx is None:
            return self._kernel_only(t, "maximum unknown")
        n = mx - len(here)
        size = f"{_gib(self.framebuffer_mib)}, " if self.framebuffer_mib else ""
        return n, True, (f"{size}equal-size mode, {_gib(t.framebuffer_mib) if t.framebuffer_mib else '?'} type: "
                         f"{mx_why}, {len(here)} in use: {max(n, 0)} fit")

    def _mig_fit(self, t: VgpuType) -> tuple[int, bool, str]:
        if self.mig_enabled is False:
            return 0, True, "MIG mode is off (MIG-backed types need MIG mode and a GPU instance)"
        prof = t.mig_profile
        taken = sum(1 for r in self.residents if r.mig_profile == prof)
        if self.gpu_instances is not None:
            gis = self.gpu_instances.get(prof or "", 0)
            more = ""
            if self.gi_free is not None:
                more = (f" (the free slices take {self.gi_free.get(prof or '', 0)} more GPU instance(s) of it: "
                        "nvidia-smi mig -lgip)")
            return gis - taken, True, (f"MIG: {gis} GPU instance(s) of {prof}, {taken} hold a vGPU: "
                                       f"{max(gis - taken, 0)} fit{more}")
        return self._kernel_only(t, f"MIG: GPU-instance table not read (no nvidia-smi); {prof}")

    def _gvtg_fit(self, t: VgpuType) -> tuple[int, bool, str]:
        assert t.gvtg is not None and self.gvtg_pool is not None
        low, high, fences = self.gvtg_pool
        for r in self.residents:
            rt = self.types.get(r.type_id)
            if r.planned and rt is not None and rt.gvtg is not None:
                low, high, fences = low - rt.gvtg[0], high - rt.gvtg[1], fences - rt.gvtg[2]
        tl, th, tf = t.gvtg
        n = min(low // tl if tl else 1 << 30, high // th if th else 1 << 30, fences // tf if tf else 1 << 30)
        planned = any(r.planned for r in self.residents)
        return n, not planned, (f"GVT-g pool (at least {low} MiB low / {high} MiB high graphics memory, {fences} "
                                f"fences free), type takes {tl}/{th} MiB and {tf} fences: {max(n, 0)} fit"
                                + ("" if not planned else " (pool estimated from the kernel's counts)"))

    def _kernel_only(self, t: VgpuType, why: str) -> tuple[int, bool, str]:
        # The rules cannot count: the kernel's available_instances for the state as read is the count (each
        # instance of this type planned takes one of them); another type planned here makes it unknown.
        planned = [r for r in self.residents if r.planned]
        if any(r.type_id != t.id for r in planned):
            return 0, False, f"{why}: the host's own count no longer holds, another type is already planned here"
        k = self._kernel_now(t)
        if self.sriov:
            # each VF's figure is that VF's own (0 or 1), not the GPU's: their sum is no count of what the GPU
            # can still take (MIG-backed VFs share the GPU instances), so plan one at a time
            if planned:
                return 0, False, f"{why}: the host is the only authority and one more is already planned here"
            return min(k, 1), False, (f"{why}: the host is the only authority; its VFs show {k} now, 1 is planned "
                                      "at most")
        n = max(0, k - len(planned))
        done = f", {len(planned)} of it planned" if planned else ""
        return n, False, f"{why}: the host's own count: {k} available{done}: {n} fit"

    def _kernel_now(self, t: VgpuType) -> int:
        return sum(p.kernel.get(t.id, 0) for p in self.places if not (p.is_vf and p.occupied))

    def _place_cap(self, t: VgpuType, n: int, exact: bool, why: str) -> tuple[int, bool, str]:
        """Cap a rule's count by where vGPUs can go: free VFs offering the type, or the parent's own figure."""
        if self.sriov:
            free = [p for p in self.places if p.is_vf and not p.occupied and p.kernel.get(t.id, 0) > 0]
            if len(free) < n:
                return len(free), exact, f"{why}; {len(free)} free VF(s) offer it"
            return n, exact, why
        k = sum(p.kernel.get(t.id, 0) for p in self.places)
        if not any(r.planned for r in self.residents) and k < n:
            # The kernel's own figure for the state as read wins over the rules (a driver limit we
            # do not model): say so.
            return k, False, f"{why}; the host reports {k} free"
        return n, exact, why

    def free_place(self, type_id: str, among: Collection[str] | None = None,
                   exclude: Collection[str] = ()) -> Place | None:
        """Where the next vGPU of ``type_id`` goes (PF before VFs, lowest address first); ``among``
        limits the choice to those addresses, ``exclude`` leaves those out."""
        for p in self.places:
            if (among is not None and p.address not in among) or p.address in exclude:
                continue
            if p.kernel.get(type_id, 0) > 0 and not (p.is_vf and p.occupied):
                return p
        return None

    def with_vgpu(self, type_id: str, place: str) -> GpuBudget:
        """The budget once one more vGPU of ``type_id`` is planned on ``place``."""
        t = self.types[type_id]
        r = Resident(type_id, t.framebuffer_mib, place, t.mig_profile, planned=True)
        places = tuple(replace(p, occupied=True) if p.address == place and p.is_vf else p for p in self.places)
        mode = self.mode
        if mode in (GpuUse.FREE, GpuUse.MIG):
            mode = (GpuUse.MIG_VGPU if t.mig_profile else GpuUse.GVTG if t.gvtg else
                    GpuUse.VENDOR_VF if places and places[0].kind is GpuUse.VENDOR_VF else GpuUse.MDEV)
        return replace(self, residents=(*self.residents, r), places=places, mode=mode)

    def whole_taken(self, domain: str) -> GpuBudget:
        return replace(self, whole_holder=domain, mode=GpuUse.WHOLE)

    # -- output ----------------------------------------------------------------------------------

    def fits(self) -> list[TypeFit]:
        return [self.fit(tid) for tid in sorted(self.types, key=_type_order)]

    def to_dict(self) -> dict[str, Any]:
        used = sum(r.framebuffer_mib or 0 for r in self.residents if r.mig_profile is None)
        return {
            "mode": self.mode.capacity_word, "sizing": self.sizing, "mixed_size_supported": self.mixed_size_supported,
            "budget": {"framebuffer_mib": self.framebuffer_mib, "vfs_total": self.vfs_total,
                       "vfs_enabled": self.vfs_enabled, "mig_enabled": self.mig_enabled,
                       "gpu_instances": dict(self.gpu_instances) if self.gpu_instances is not None else None,
                       # only when -lgip was read (keeps the established shape of older reports)
                       **({"gpu_instance_profiles_free": dict(self.gi_free)} if self.gi_free is not None else {}),
                       "gvtg_pool_free": list(self.gvtg_pool) if self.gvtg_pool is not None else None},
            "used": {"vgpus": len(self.residents), "framebuffer_mib": used,
                     "vfs_in_use": sum(1 for p in self.places if p.is_vf and p.occupied),
                     "whole": self.whole_holder},
            "types": [f.to_dict() for f in self.fits()],
            "notes": list(self.notes),
        }


def _gib(mib: int | None) -> str:
    if mib is None:
        return "?"
    return f"{mib // 1024} GiB" if mib % 1024 == 0 else f"{mib} MiB"


def _type_order(tid: str) -> tuple[int, str]:
    tail = tid.rsplit("-", 1)[-1]
    return (int(tail), tid) if tail.isdigit() else (1 << 30, tid)
