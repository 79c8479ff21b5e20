"""Capacity per type, for ``vgpuvirt types`` and placement: how many vGPUs of one type each GPU (or
mdev parent) can still take, folded from an :class:`~vgpuvirt.services.inventory.model.Inventory`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vgpuvirt.services.capacity.build import gpu_budgets
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.inventory.parse import type_sort_key
from vgpuvirt.services.inventory.parts import MdevParent, MdevType, VendorType, VendorVf
from vgpuvirt.services.pci import parsers as P
from vgpuvirt.usage import Backend


@dataclass(frozen=True)
class TypeCapacity:
    """How many vGPUs of one type one GPU (or one mdev parent) can still take.

    GPU-level rows (a legacy mdev parent, or a PF with its VFs folded in) count with the capacity model:
    ``exact`` when the rules give the number, False where only the host's own figure is known. A VF's own
    rows (``parent=VF``) say what that VF offers (0 or 1).
    """

    parent: str
    backend: Backend
    id: str
    name: str | None
    available: int
    max_instances: int | None
    in_use: int
    exact: bool
    free_vfs: int | None = None
    framebuffer_mib: int | None = None
    series: str | None = None
    mig_backed: bool = False
    gi_profile: str | None = None
    reason: str | None = None                # the capacity model's arithmetic (GPU-level rows)
    device_api: str | None = None            # what the kernel says of the type (mdev rows), as mdevctl shows it
    description: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"parent": self.parent, "backend": self.backend, "id": self.id, "name": self.name,
                "available_instances": self.available, "max_instances": self.max_instances, "in_use": self.in_use,
                "exact": self.exact, "free_vfs": self.free_vfs, "framebuffer_mib": self.framebuffer_mib,
                "series": self.series, "mig_backed": self.mig_backed, "gi_profile": self.gi_profile,
                "reason": self.reason, "device_api": self.device_api, "description": self.description}


def _row_of(parent: str, backend: Backend, t: MdevType) -> TypeCapacity:
    return TypeCapacity(parent=parent, backend=backend, id=t.id, name=t.name,
                        available=t.available_instances or 0, max_instances=t.max_instances, in_use=t.instances,
                        exact=True, framebuffer_mib=t.framebuffer_mib, series=t.series, mig_backed=t.mig_backed,
                        gi_profile=t.gi_profile, device_api=t.device_api, description=t.description)


def type_capacity(inv: Inventory, *, parent: str | None = None, available_only: bool = False) -> list[TypeCapacity]:
    """Types with capacity: legacy mdev parents per parent, SR-IOV GPUs per PF (VF figures folded in).

    ``parent``: only that device; a VF address gives that VF's own rows, a PF its folded rows.
    """
    want: str | None = None
    if parent is not None:
        a = P.pci_or_none(parent)
        want = str(a) if a else parent
    rows: list[TypeCapacity] = []
    by_pf: dict[str, list[MdevParent]] = {}
    for p in inv.mdev_parents:
        if p.physfn is not None and want != p.address:
            by_pf.setdefault(str(p.physfn), []).append(p)
            continue
        if want is None or want == p.address:
            gpu = inv.gpu(p.address) if p.pci else None
            backend = gpu.backend if gpu else (Backend.MDEV_SRIOV if p.physfn else Backend.MDEV)
            rows.extend(_row_of(p.address, backend, t) for t in p.types)
    for pf, vfs in sorted(by_pf.items()):
        if want is not None and want != pf:
            continue
        on_gpu = sum(t.instances for v in vfs for t in v.types)
        folded: dict[str, list[MdevType]] = {}
        for v in vfs:
            for t in v.types:
                folded.setdefault(t.id, []).append(t)
        for tid, ts in sorted(folded.items(), key=lambda kv: type_sort_key(kv[0])):
            t0 = ts[0]
            free = sum(1 for t in ts if (t.available_instances or 0) > 0)
            avail = free if t0.max_instances is None else min(free, max(0, t0.max_instances - on_gpu))
            rows.append(TypeCapacity(parent=pf, backend=Backend.MDEV_SRIOV, id=tid, name=t0.name, available=avail,
                                     max_instances=t0.max_instances, in_use=sum(t.instances for t in ts),
                                     exact=False, free_vfs=free, framebuffer_mib=t0.framebuffer_mib,
                                     series=t0.series, mig_backed=t0.mig_backed, gi_profile=t0.gi_profile,
                                     device_api=t0.device_api, description=t0.description))
    vendor_by_pf: dict[str, list[VendorVf]] = {}
    for vf in inv.vendor_vgpu:
        if want is not None and want == str(vf.address):
            rows.extend(_vendor_vf_rows(vf))
            continue
        vendor_by_pf.setdefault(str(vf.physfn or vf.address), []).append(vf)
    for pf, vvs in sorted(vendor_by_pf.items()):
        if want is None or want == pf:
            rows.extend(_vendor_pf_rows(inv, pf, vvs))
    rows = _counted_by_budget(inv, rows)
    if available_only:
        rows = [r for r in rows if r.available > 0]
    return rows


def _counted_by_budget(inv: Inventory, rows: list[TypeCapacity]) -> list[TypeCapacity]:
    """GPU-level rows take their count from the capacity model (:mod:`.budget`): exact where the
    rules give a number, the kernel's own figure (``exact`` False) where the host is the only authority.
    A single VF's rows keep what that VF's sysfs says."""
    budgets = {str(b.address): b for b in gpu_budgets(inv)}
    out = []
    for r in rows:
        b = budgets.get(r.parent)
        tid = f"nvidia-{r.id}" if r.backend is Backend.VENDOR_VFIO else r.id
        if b is None or tid not in b.types:
            out.append(r)
            continue
        f = b.fit(tid)
        mx, _ = b.max_of(b.types[tid])
        out.append(replace(r, available=f.fits_now, exact=f.exact, reason=f.reason,
                           max_instances=r.max_instances if r.max_instances is not None else mx))
    return out



def _vendor_row(parent: str, vt: VendorType, **kw: Any) -> TypeCapacity:
    d = vt.to_dict()
    return TypeCapacity(parent=parent, backend=Backend.VENDOR_VFIO, id=str(vt.id), name=vt.name or None,
                        framebuffer_mib=d["framebuffer_mib"], series=d["series"], mig_backed=d["mig_backed"],
                        gi_profile=d["gi_profile"], **kw)


def _vendor_vf_rows(vf: VendorVf) -> list[TypeCapacity]:
    return [_vendor_row(str(vf.address), vt, available=1 if vf.current_type == 0 else 0, max_instances=None,
                        in_use=1 if vf.current_type == vt.id else 0, exact=True)
            for vt in vf.creatable_types]


def _vendor_pf_rows(inv: Inventory, pf: str, vfs: list[VendorVf]) -> list[TypeCapacity]:
    gpu = inv.gpu(pf) if P.pci_or_none(pf) else None
    nv_max: dict[int, int | None] = {}
    if gpu is not None and gpu.nvidia is not None:
        nv_max = {int(t["id"]): t.get("max_instances") for t in gpu.nvidia.supported_vgpu_types or []}
    on_gpu = sum(1 for vf in vfs if vf.current_type)
    seen: dict[int, VendorType] = {}
    for vf in vfs:
        for vt in vf.creatable_types:
            seen.setdefault(vt.id, vt)
    for vf in vfs:
        if vf.current_type and vf.current_type not in seen:
            seen[vf.current_type] = VendorType(vf.current_type, vf.current_type_name or "")
    rows = []
    for type_id, vt in seen.items():
        free = sum(1 for vf in vfs if vf.current_type == 0 and any(c.id == type_id for c in vf.creatable_types))
        mx = nv_max.get(type_id)
        rows.append(_vendor_row(pf, vt, available=free if mx is None else min(free, max(0, mx - on_gpu)),
                                max_instances=mx, in_use=sum(1 for vf in vfs if vf.current_type == type_id),
                                exact=False, free_vfs=free))
    return rows
