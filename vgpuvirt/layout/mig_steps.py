"""The MIG part of a layout plan: GPU instances that go (their compute instances first), the MIG mode, and
the GPU instances to create, as steps over :mod:`vgpuvirt.services.mig_ops` (validated argv, never a shell).

Pure. A created GPU instance's id is known only from nvidia-smi's answer, so a create step's undo is
made from that answer (:func:`undo_created`); a destroyed one is re-created with its profile at its
placement. In mode ``mig`` every new GPU instance gets its default compute instance (``-C``: what
containers and passthrough use); in ``mig-vgpu`` none (the MIG-backed vGPU takes the whole GPU instance).
"""

from __future__ import annotations

from vgpuvirt.errors import DeviceError, InvalidSpec
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.layout.model import GpuLayout
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mig import MigGpu
from vgpuvirt.services.mig_ops import MigAction
from vgpuvirt.services.mig_parse import created_compute_instances, created_gpu_instances, mode_change_pending
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


def item(host: str, gpu: str, *actions: MigAction) -> Planned:
    """MIG actions as one batch item (their argv in one group of exec ops, run in order)."""
    first = actions[0]
    g = f"mig:{gpu}:{first.kind}:{'-'.join(map(str, first.ids or first.profiles))}"
    ops = tuple(Op.exec(argv_by_bus_id(a, gpu), timeout=300.0, group=g) for a in actions)
    what = "; ".join(a.describe() for a in actions)

    def explain(bad: OpResult) -> DeviceError:
        said = (bad.stderr or bad.stdout or bad.error or "").strip().splitlines()[-1:] or ["no output"]
        return DeviceError(host, gpu, f"{what} failed (exit {bad.rc}): {said[0]}")

    return Planned(f"mig.{first.kind}", gpu, ops, explain, first.to_dict(), intent=what, message=what,
                   dry_message="would " + what)


def undo_created(host: str, gpu: str, index: int, results: tuple[OpResult, ...]) -> Planned | None:
    """What undoes a create-gi that ran: its compute instances, then the GPU instances its answer names."""
    text = "\n".join(r.stdout for r in results)
    cis = created_compute_instances(text)
    gis = [gi for _, gi in created_gpu_instances(text)]     # one GPU per exec
    actions = [MigAction.destroy_ci(index, gi, [ci]) for _, gi, ci in reversed(cis)]
    if gis:
        actions.append(MigAction.destroy_gi(index, list(reversed(gis))))
    return item(host, gpu, *actions) if actions else None


def place(m: MigGpu, profiles: list[str]) -> list[int | None] | None:
    """A start (memory slice) for each profile on an empty GPU, from ``-lgipp``'s placements, such that none
    overlap; None when no arrangement fits. Without placement tables: no starts (nvidia-smi picks)."""
    info = {p.name: p for p in m.profiles}
    if not all(info.get(p) and info[p].placements and info[p].placement_size for p in profiles):
        return [None] * len(profiles)
    taken: list[tuple[int, int]] = []
    starts: list[int | None] = []

    def fit(i: int) -> bool:
        if i == len(profiles):
            return True
        prof = info[profiles[i]]
        size = prof.placement_size or 1
        for st in prof.placements:
            if all(st + size <= a or b <= st for a, b in taken):
                taken.append((st, st + size))
                starts.append(st)
                if fit(i + 1):
                    return True
                taken.pop()
                starts.pop()
        return False

    return starts if fit(0) else None


def _size(profile: str) -> int:
    """Compute slices of a GPU-instance profile (``3g.20gb`` -> 3): big ones first keeps placements free."""
    return int(profile.split("g.", 1)[0].rsplit(".", 1)[-1])


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
    steps: list[tuple[int, str, Planned, Planned | None, bool]] = []
    # A geometry that changes is laid out again from an empty GPU, biggest instances first: keeping some
    # instances where they sit can leave the slices the others need fragmented (as mig-parted does it too).
    relayout = {k: v for k, v in wanted.items() if v} != {k: v for k, v in have.items() if v}
    for gi in sorted(m.gpu_instances, key=lambda x: -x.id) if relayout or not on_want else ():
        cis = [c for c in m.compute_instances if c.gi == gi.id]
        actions = ([MigAction.destroy_ci(idx, gi.id, [c.id for c in cis])] if cis else []) + \
            [MigAction.destroy_gi(idx, [gi.id])]
        steps.append((GI_DOWN, f"destroy GPU instance {gi.id} ({gi.profile}) on {gpu}", item(host, gpu, *actions),
                      item(host, gpu, MigAction.create_gi(idx, [gi.profile], placements=[gi.start],
                                                          default_ci=bool(cis))), False))
    if on_now != on_want:
        steps.append((MODE, f"turn MIG mode {'on' if on_want else 'off'} on {gpu}",
                      item(host, gpu, MigAction.mode(idx, on_want)), item(host, gpu, MigAction.mode(idx, on_now)),
                      False))
    profiles = sorted((p for p, n in wanted.items() for _ in range(n)), key=lambda p: (-_size(p), p))
    # A GPU with MIG off lists no profiles or placements: its GPU instances wait for the next round, once the
    # mode is on and read again (apply re-reads after each round of preparation).
    if profiles and on_now and relayout:
        starts = place(m, profiles)
        if starts is None:
            raise InvalidSpec(f"mig-devices for {gpu} ({g.product or 'GPU'})", dict(wanted),
                              "GPU instances that fit the GPU's placements together (nvidia-smi mig -lgipp)")
        action = MigAction.create_gi(idx, profiles, placements=starts, default_ci=want.mode == "mig")
        steps.append((GI_UP, f"create GPU instances {','.join(profiles)} on {gpu}", item(host, gpu, action), None,
                      True))
    return steps, diff
