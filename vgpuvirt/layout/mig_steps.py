"""The MIG part of a layout plan: GPU instances that go (their compute instances first), the MIG mode, and
the GPU instances to create, as steps over :mod:`vgpuvirt.services.mig_ops` (validated argv, never a shell).

Pure. A created GPU instance's id is known only from nvidia-smi's answer, so a create step's undo is
made from that answer (:func:`undo_created`); a destroyed one is re-created with its profile at its
placement. In mode ``mig`` every new GPU instance gets its default compute instance (``-C``: what
containers and passthrough use); in ``mig-vgpu`` none (the MIG-backed vGPU takes the whole GPU instance).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from vgpuvirt.errors import DeviceError, InvalidSpec
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.layout.model import GpuLayout
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mig import MigGpu
from vgpuvirt.services.mig_ops import MigAction
from vgpuvirt.services.mig_parse import (
    GpuInstance,
    created_compute_instances,
    created_gpu_instances,
    mode_change_pending,
)
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.nvidia_modes import nvidia_smi_bus_id

# step orders (see planner): after the vGPUs that go, around SR-IOV, before the vGPU types
GI_DOWN, MODE, GI_UP = 12, 42, 55


def argv_by_bus_id(action: MigAction, gpu: str) -> list[str]:
    """The action's argv with ``-i BUS-ID`` instead of nvidia-smi's index: the index is a GPU's position among
    the GPUs nvidia-smi sees, and a GPU the same batch binds to vfio-pci drops out of that count."""
    argv = action.argv()
    i = argv.index("-i")
    argv[i + 1] = nvidia_smi_bus_id(PciAddress.parse(gpu))
    return argv


def item(host: str, gpu: str, action: MigAction) -> Planned:
    """One MIG action as a batch item (its argv in one exec op)."""
    op = Op.exec(argv_by_bus_id(action, gpu), timeout=300.0, group=f"mig:{gpu}:{action.kind}")

    def explain(bad: OpResult) -> DeviceError:
        said = (bad.stderr or bad.stdout or bad.error or "").strip().splitlines()[-1:] or ["no output"]
        return DeviceError(host, gpu, f"{action.describe()} failed (exit {bad.rc}): {said[0]}")

    return Planned(f"mig.{action.kind}", gpu, (op,), explain, action.to_dict(), intent=action.describe(),
                   message=action.describe(), dry_message="would " + action.describe())


def undo_created(host: str, gpu: str, index: int, results: tuple[OpResult, ...]) -> Planned | None:
    """What undoes a create-gi that ran: destroying the GPU instances its answer says it created, their
    compute instances (``-C``) first (nvidia-smi refuses to destroy a GPU instance that has some)."""
    ids = [gi for r in results for _, gi in created_gpu_instances(r.stdout)]     # one GPU per exec
    if not ids:
        return None
    undo = item(host, gpu, MigAction.destroy_gi(index, ids))
    cis = [(gi, ci) for r in results for _, gi, ci in created_compute_instances(r.stdout)]
    first = tuple(Op.exec(argv_by_bus_id(MigAction.destroy_ci(index, gi, [ci]), gpu), timeout=300.0,
                          group=undo.ops[0].group) for gi, ci in cis)
    return replace(undo, ops=first + undo.ops)


def pending(results: tuple[OpResult, ...]) -> bool:
    """The mode change waits for a GPU reset (VFs bound to vfio-pci, processes): the layout is not reached."""
    return any(mode_change_pending(r.stdout + r.stderr) for r in results)


def mig_plan(g: GpuNow, want: GpuLayout) -> tuple[list[tuple[int, str, Planned, Planned | None, bool]], list[str]]:
    """(order, text, item, undo, undo-from-answer) per step, and the diff lines."""
    on_now, on_want = g.mig_enabled, want.resolved_mig()
    have: dict[str, int] = dict(g.budget.gpu_instances or {})
    wanted = (dict(want.mig_devices) if want.mig_devices or want.mig_exact else dict(have)) if on_want else {}
    if on_now == on_want and {k: v for k, v in wanted.items() if v} == {k: v for k, v in have.items() if v}:
        return [], []
    m = g.mig
    if m is None or not m.capable:
        raise InvalidSpec(f"MIG layout for {g.address}", dict(want.mig_devices) or on_want,
                          "a GPU whose MIG mode nvidia-smi reports (MIG-capable, nvidia-smi on the host)")
    host, gpu, idx = g.budget.host, str(g.address), m.index
    for prof, n in wanted.items():
        if n and m.profiles and m.profile(prof) is None:
            offered = ", ".join(sorted({p.name for p in m.profiles}))
            raise InvalidSpec(f"MIG profile for {gpu}", prof, f"one the GPU lists (-lgip): {offered}")
    diff: list[str] = []
    if on_now != on_want:
        diff.append(f"mig-enabled {str(on_now).lower()} -> {str(on_want).lower()}")
    for prof in sorted(set(have) | set(wanted)):
        if have.get(prof, 0) != wanted.get(prof, 0):
            diff.append(f"MIG {prof} {have.get(prof, 0)} -> {wanted.get(prof, 0)}")
    surplus = Counter({p: n - wanted.get(p, 0) for p, n in have.items() if n > wanted.get(p, 0)})
    new = [p for p, n in wanted.items() for _ in range(max(0, n - have.get(p, 0)))]
    going = _surplus_gis(m.gpu_instances, surplus)
    starts = place(m, [gi for gi in m.gpu_instances if gi not in going], new)
    if new and starts is None and want.mode == "mig" and not g.vgpus:
        # the kept GPU instances block the new ones: remake them all, as mig-parted does (nothing uses them that
        # the layout knows of: mode mig has no vGPUs)
        going = list(m.gpu_instances)
        new = [p for p, n in wanted.items() for _ in range(n)]
        starts = place(m, [], new)
    if new and starts is None:
        kept = sorted(gi.profile for gi in m.gpu_instances if gi not in going)
        raise InvalidSpec(f"MIG layout for {gpu}", dict(wanted), "GPU instances that fit the GPU's placements (-lgipp)"
                          + (f" next to the ones kept ({', '.join(kept)}): change or drain those" if kept else ""))
    steps: list[tuple[int, str, Planned, Planned | None, bool]] = []
    for gi in going:
        cis = [c for c in m.compute_instances if c.gi == gi.id]
        if cis:
            steps.append((GI_DOWN, f"destroy the compute instances of GPU instance {gi.id} ({gi.profile}) on {gpu}",
                          item(host, gpu, MigAction.destroy_ci(idx, gi.id, [c.id for c in cis])),
                          item(host, gpu, MigAction.create_ci(idx, gi.id, [c.profile for c in cis])), False))
        steps.append((GI_DOWN, f"destroy GPU instance {gi.id} ({gi.profile}) on {gpu}",
                      item(host, gpu, MigAction.destroy_gi(idx, [gi.id])),
                      item(host, gpu, MigAction.create_gi(idx, [gi.profile], placements=[gi.start],
                                                          default_ci=bool(cis))), False))
    if on_now != on_want:
        steps.append((MODE, f"turn MIG mode {'on' if on_want else 'off'} on {gpu}",
                      item(host, gpu, MigAction.mode(idx, on_want)), item(host, gpu, MigAction.mode(idx, on_now)),
                      False))
    for prof in dict.fromkeys(new):
        at = [s for p, s in zip(new, starts or [None] * len(new), strict=True) if p == prof]
        action = MigAction.create_gi(idx, [prof] * len(at), placements=at, default_ci=want.mode == "mig")
        where = f" at {', '.join(map(str, at))}" if starts is not None else ""
        steps.append((GI_UP, f"create {len(at)} x GPU instance {prof}{where} on {gpu}", item(host, gpu, action), None,
                      True))
    return steps, diff


def _surplus_gis(gis: tuple[GpuInstance, ...], surplus: Counter[str]) -> list[GpuInstance]:
    left = Counter(surplus)
    out = []
    for gi in sorted(gis, key=lambda x: -x.id):
        if left[gi.profile] > 0:
            left[gi.profile] -= 1
            out.append(gi)
    return out


def place(m: MigGpu, kept: list[GpuInstance], new: list[str]) -> list[int | None] | None:
    """A start (memory slice, from ``-lgipp``) for each new GPU instance next to the kept ones, largest
    first; None when they cannot all be placed. The driver's own choice (no start given) depends on the
    order of creation and can leave no room for a larger instance: the planner names the starts."""
    profs = {p.name: p for p in m.profiles}
    if any(p not in profs or not profs[p].placements for p in new):
        return [None] * len(new) if new else []
    occupied: set[int] = {s for gi in kept for s in range(gi.start, gi.start + gi.size)}
    order = sorted(range(len(new)), key=lambda i: -(profs[new[i]].placement_size or 1))
    starts: list[int | None] = [None] * len(new)

    def go(k: int, occ: set[int]) -> bool:
        if k == len(order):
            return True
        i = order[k]
        p = profs[new[i]]
        for s in p.placements:
            span = set(range(s, s + (p.placement_size or 1)))
            if not span & occ:
                starts[i] = s
                if go(k + 1, occ | span):
                    return True
        return False

    return starts if go(0, occupied) else None
