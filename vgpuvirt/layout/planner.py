"""From a host's GPUs as they are (:mod:`.observe`) and a layout config to ordered steps and a diff.

Pure. Each step is a change of the one engine (:mod:`vgpuvirt.change`: its kind owns its ops and undo), so the
runner puts a whole phase of a host in ONE locked ``host.apply`` and a rollback in one more.
Phase 1 prepares the GPUs (vGPUs that go away, the sizing mode, SR-IOV, driver binding, MIG); phase 2
creates the vGPUs on the places phase 1 made (the VFs exist only then, so the runner plans phase 2 on
a fresh read). Within a phase, steps run in their kinds' ``rank``: removals, SR-IOV down, driver binding,
SR-IOV up, MIG mode, sizing, GPU instances; then vGPU types, mdevs, the scheduler.
"""

from __future__ import annotations

import uuid as _uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vgpuvirt.change.driver import BindDriver
from vgpuvirt.change.mdev import CreateMdev, RemoveMdev
from vgpuvirt.change.nvidia_mode import SetMixedSize
from vgpuvirt.change.sriov import vf_count_step
from vgpuvirt.change.vendor_vf import ClearVfType, SetVfType
from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.layout import mig_steps, sched_steps
from vgpuvirt.layout.model import VENDOR, VFIO, GpuLayout, LayoutConfig
from vgpuvirt.layout.observe import Claim, GpuNow, Vgpu
from vgpuvirt.layout.steps import LayoutStep
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.usage import Backend, GpuUse

__all__ = ["VENDOR_DRIVERS", "GpuDiff", "HostPlan", "LayoutStep", "layout_uuid", "plan_host"]

NAMESPACE = _uuid.UUID("3d0c6a51-8f7e-4b6f-9a39-1c5e2b7d40aa")
#: The vendor's own driver, when a GPU comes back from vfio-pci and the layout says ``vendor``.
VENDOR_DRIVERS = {"0x10de": "nvidia", "0x1002": "amdgpu", "0x8086": "i915"}


def layout_uuid(place: PciAddress, type_id: str, k: int) -> MdevUuid:
    """The UUID a layout gives its k-th mdev of a type on a parent: the same after a reboot (the boot unit
    re-creates exactly these, so domains that name them start again)."""
    return MdevUuid(str(_uuid.uuid5(NAMESPACE, f"{place}/{type_id}/{k}")))


@dataclass(frozen=True)
class GpuDiff:
    gpu: PciAddress
    product: str | None
    changes: tuple[str, ...]                     # "mode off -> vgpu", "A10-4Q 0 -> 6"

    def format(self) -> str:
        name = f" ({self.product})" if self.product else ""
        return f"{self.gpu}{name}: " + "; ".join(self.changes)


@dataclass(frozen=True)
class HostPlan:
    host: str
    steps: tuple[LayoutStep, ...]
    diffs: tuple[GpuDiff, ...]
    pending: tuple[str, ...] = ()                # what phase 2 will do once phase 1 made the places
    notes: tuple[str, ...] = ()                  # in the state, not active yet (a scheduler awaiting a reload)

    def phase(self, n: int) -> list[LayoutStep]:
        return sorted((s for s in self.steps if s.phase == n), key=LayoutStep.sort_key)

    @property
    def empty(self) -> bool:
        return not self.steps and not self.pending

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "steps": [s.to_dict() for s in self.phase(1) + self.phase(2)],
                "pending": list(self.pending), "diff": [d.format() for d in self.diffs], "notes": list(self.notes)}


def plan_host(host: str, gpus: Sequence[GpuNow], config: LayoutConfig) -> HostPlan:
    """The steps that take ``gpus`` (one host, as read) to ``config``. Raises InvalidSpec for a layout that
    cannot be (a type the GPU does not offer, more VFs than it has) and NoCapacity when counts do not fit."""
    chosen = config.resolve([(g.address, g.product, g.pci_id) for g in gpus])
    diffs: list[GpuDiff] = []
    pending: list[str] = []
    steps, sched_diff, notes = sched_steps.plan(host, gpus, {a: e.layout for a, e in chosen.items()})
    for g in gpus:
        entry = chosen.get(g.address)
        if entry is None:
            continue
        s, d, p = _plan_gpu(host, g, entry.layout)
        steps += s
        pending += p
        d += sched_diff.get(g.address, [])
        if d:
            diffs.append(GpuDiff(g.address, g.product, tuple(d)))
    return HostPlan(host, tuple(steps), tuple(diffs), tuple(pending), tuple(notes))


def want_vfs(g: GpuNow, want: GpuLayout) -> int:
    if want.sriov_vfs is not None:
        if want.sriov_vfs > g.vfs_total:
            raise InvalidSpec(f"sriov-vfs for {g.address}", want.sriov_vfs, f"0..{g.vfs_total} (its sriov_totalvfs)")
        return want.sriov_vfs
    if want.mode in ("passthrough", "off"):
        return 0
    if want.mode in ("vgpu", "mig-vgpu") and g.vfs_total and g.backend != Backend.MDEV:
        return g.vfs_total if not g.vfs else len(g.vfs)
    return len(g.vfs)


def _want_driver(g: GpuNow, want: GpuLayout, vendor: str | None) -> str | None:
    """The driver the GPU should have, or None to leave it (already a vendor driver)."""
    if want.mode == "passthrough":
        return VFIO
    if want.driver not in (None, VENDOR):
        return want.driver
    if g.driver == VFIO or g.driver is None:
        drv = VENDOR_DRIVERS.get(vendor or "")
        if drv is None:
            raise InvalidSpec(f"driver for {g.address}", want.driver, "a driver name (the vendor's is not known)")
        return drv
    return None


def _plan_gpu(host: str, g: GpuNow, want: GpuLayout) -> tuple[list[LayoutStep], list[str], list[str]]:
    steps: list[LayoutStep] = []
    diff: list[str] = []
    pending: list[str] = []
    mode_now = g.mode()
    if mode_now != want.mode:
        diff.append(f"mode {mode_now} -> {want.mode}")
    # -- vGPUs that go: other types, surplus of kept types, everything when the mode has none -------------
    wanted: dict[str, int | None] = {}
    unknown: list[str] = []
    if want.mode in ("vgpu", "mig-vgpu"):
        for vc in want.vgpu_devices:
            tid = g.type_id(vc.type)
            if tid is None:
                unknown.append(vc.type)
            else:
                wanted[tid] = vc.count
    vfs_want = want_vfs(g, want)
    vf_change = vfs_want != len(g.vfs)
    reshape = False
    if unknown and g.type_names and not vf_change:
        # A GPU holding vGPUs offers only their size (vGPU 17+ VFs list nothing else): a type of the same board
        # in another size is a reshape (drain, remove, then create once the GPU offers it), not a bad name.
        boards = {_board(g.short_name(t)) for t in g.type_names}
        reshape = bool(g.vgpus) and all(_board(u) in boards for u in unknown)
        if not reshape:
            offered = ", ".join(sorted({g.short_name(t) for t in g.type_names})[:12])
            raise InvalidSpec(f"vGPU type for {g.address} ({g.product or 'GPU'})", unknown[0],
                              f"one it offers: {offered}")
        diff.append(f"reshape: {', '.join(unknown)} offered once the vGPUs of another size are gone")
    sizing = want.sizing or g.budget.sizing
    sizes = {g.budget.types[t].framebuffer_mib for t in wanted if t in g.budget.types} - {None}
    if sizing == "equal" and len(sizes) > 1 and not any(g.budget.types[t].mig_profile for t in wanted):
        raise InvalidSpec(f"vgpu-devices for {g.address} ({g.product or 'GPU'})",
                          [g.short_name(t) for t in wanted],
                          "one vGPU size per GPU in equal-size mode "
                          "(sizing: mixed lets sizes mix, where the GPU has it)")
    counts = g.counts()
    remove: list[Vgpu] = []
    back = _claims_back(g, wanted, vf_change)
    for tid, have in sorted(counts.items()):
        w = wanted.get(tid, 0)
        keep = 0 if vf_change or reshape else have if w is None else w
        if back.get(tid) and w is not None:
            # idle vGPUs give way to those defined VMs name (a layout applied after a reboot made its own)
            busy = sum(1 for v in g.vgpus if v.type_id == tid and v.domain is not None)
            keep = max(busy, min(keep, w - len(back[tid])))
        if keep < have:
            # keep the ones domains use; remove the idle ones first
            ordered = sorted((v for v in g.vgpus if v.type_id == tid), key=lambda v: (v.domain is not None, v.place))
            remove += ordered[:have - keep]
        if keep != have or tid not in wanted:
            diff.append(f"{g.short_name(tid)} {have} -> {keep if tid in wanted else 0}")
    for v in remove:
        steps.append(_remove_step(host, g, v))
    # -- sizing, SR-IOV, driver --------------------------------------------------------------------------
    vendor = g.budget.vendor and {"nvidia": "0x10de", "amd": "0x1002", "intel": "0x8086"}.get(g.budget.vendor)
    drv = _want_driver(g, want, vendor)
    if vf_change:
        diff.append(f"sriov-vfs {len(g.vfs)} -> {vfs_want}")
        steps.append(LayoutStep(g.address, vf_count_step(host, g.address, len(g.vfs), vfs_want),
                                touches=tuple(str(v) for v in g.vfs)))
    if drv is not None and drv != g.driver:
        diff.append(f"driver {g.driver} -> {drv}")
        drivers = dict(zip(g.functions, g.function_drivers, strict=False))
        for a in (g.address, *(g.functions if drv == VFIO or g.driver == VFIO else ())):
            cur = g.driver if a == g.address else drivers.get(a)
            if a != g.address and drv != VFIO and cur == VFIO:
                continue        # the audio function stays on vfio-pci: its own driver is not ours to name
            if a != g.address and cur == drv:
                continue
            steps.append(LayoutStep(g.address, BindDriver(host, "", a, cur, drv), touches=(str(a),)))
    if want.sizing is not None and g.budget.sizing is not None and want.sizing != g.budget.sizing:
        if g.budget.mixed_size_supported is None:
            raise InvalidSpec(f"sizing for {g.address}", want.sizing, "none here: whether the GPU has a mixed-size "
                                                                      "mode is unknown (nvidia-smi was not read)")
        if not g.budget.mixed_size_supported:
            raise InvalidSpec(f"sizing for {g.address}", want.sizing, "equal: the GPU has no mixed-size mode")
        on = want.sizing == "mixed"
        diff.append(f"sizing {g.budget.sizing} -> {want.sizing}")
        steps.append(LayoutStep(g.address, SetMixedSize(host, "", g.address, on),
                                label=f"switch {g.address} to {want.sizing}-size mode"))
    mig_planned, mig_diff = mig_steps.mig_plan(g, want)
    diff += mig_diff
    steps += mig_planned
    # -- phase 2: the vGPUs to make, on places that exist now (or pending until phase 1 made them) ------
    if vf_change or remove or mig_planned or (drv is not None and drv != g.driver):
        if wanted or unknown:
            pending.append(f"{g.address}: " + ", ".join(f"{vc.type} x {vc.count if vc.count is not None else 'fill'}"
                                                         for vc in want.vgpu_devices))
            if not diff:
                diff.append("vGPUs re-made after the places change")
        return steps, diff, pending
    removed = Counter(v.type_id for v in remove)
    taken: set[PciAddress] = set()              # VFs this plan already gives a vGPU
    for tid, n in wanted.items():
        have = counts.get(tid, 0) - removed.get(tid, 0)
        target = have + g.budget.fit(tid).fits_now if n is None else n
        if target > have:
            steps += _create_steps(host, g, tid, target - have, remove, taken, back.get(tid, []))
            diff.append(f"{g.short_name(tid)} {have} -> {target}")
    return steps, diff, pending


def _board(short_name: str) -> str:
    """``L40S`` of ``L40S-2Q``, ``A100D`` of ``A100D-1-10C``: the board a type name belongs to."""
    return short_name.split("-", 1)[0].casefold()


def _claims_back(g: GpuNow, wanted: dict[str, int | None], vf_change: bool) -> dict[str, list[Claim]]:
    """type -> the missing mdevs of defined VMs that the layout's vGPUs of that type make again."""
    out: dict[str, list[Claim]] = {}
    if vf_change:
        return out              # the VFs change: their mdevs are re-made on the next read, claims then
    for c in g.claimed:
        if c.type_id in wanted:
            out.setdefault(c.type_id, []).append(c)
    return out


def _remove_step(host: str, g: GpuNow, v: Vgpu) -> LayoutStep:
    name = g.short_name(v.type_id)
    if v.uuid is not None:
        u = MdevUuid.parse(v.uuid)
        return LayoutStep(g.address, RemoveMdev(host, "", u, v.place, MdevTypeId(v.type_id), name), removes=(v,),
                          touches=(str(u),))
    return LayoutStep(g.address, ClearVfType(host, "", v.place, VgpuTypeId.parse(v.type_id), name), removes=(v,),
                      touches=(str(v.place),))


def _create_steps(host: str, g: GpuNow, tid: str, n: int, removed: list[Vgpu],
                  taken: set[PciAddress], claims: Sequence[Claim] = ()) -> list[LayoutStep]:
    name = g.short_name(tid)
    gone = {v.place for v in removed}
    busy = ({v.place for v in g.vgpus} - gone) | taken
    out: list[LayoutStep] = []
    vendor_place = any(p.kind == GpuUse.VENDOR_VF for p in g.budget.places)
    if vendor_place:
        free = [PciAddress.parse(p.address) for p in g.budget.places
                if p.kind == GpuUse.VENDOR_VF and PciAddress.parse(p.address) not in busy and tid in p.kernel]
        if len(free) < n:
            raise NoCapacity(host, str(g.address), f"{n} x {name} wanted, {len(free)} free VF(s) offer it")
        t = VgpuTypeId.parse(tid)
        for vf in free[:n]:
            taken.add(vf)
            out.append(LayoutStep(g.address, SetVfType(host, "", vf, t), label=f"set vGPU type {name} on VF {vf}"))
        return out
    places = [p for p in g.budget.places if p.kind == GpuUse.MDEV and tid in p.kernel]
    if any(p.is_vf for p in places):
        slots = [PciAddress.parse(p.address) for p in places
                 if PciAddress.parse(p.address) not in busy and p.kernel.get(tid, 0) > 0]
    else:
        slots = [PciAddress.parse(p.address) for p in places for _ in range(p.kernel.get(tid, 0))]
    if len(slots) < n:
        raise NoCapacity(host, str(g.address), f"{n} x {name} wanted, room for {len(slots)} more")
    used = {v.uuid for v in g.vgpus} | {c.uuid for c in claims}
    # the mdevs defined VMs name come back first, with their UUIDs, on their parents where those are free
    made: list[tuple[PciAddress, MdevUuid, str]] = []
    free = list(slots)
    for c in claims:
        if len(made) < n and c.parent in free:
            free.remove(c.parent)
            made.append((c.parent, MdevUuid.parse(c.uuid), f" for VM {c.domain}"))
    k = 0
    for parent in free[:n - len(made)]:
        while str(u := layout_uuid(parent, tid, k)) in used:
            k += 1
        used.add(str(u))
        made.append((parent, u, ""))
    for parent, u, why in made:
        if parent != g.address:
            taken.add(parent)
        out.append(LayoutStep(g.address, CreateMdev(host, "", u, parent, MdevTypeId(tid)),
                              label=f"create mdev {u} ({name}) on {parent}{why}"))
    return out
