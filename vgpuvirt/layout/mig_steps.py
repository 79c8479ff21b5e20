"""The MIG part of a layout plan: GPU instances that go (their compute instances first), the MIG mode, and
the GPU instances to create, as change steps (:mod:`vgpuvirt.change.mig`: validated argv, never a shell).

Pure. A created GPU instance's id is known only from nvidia-smi's answer, so a create step's undo is
learned from that answer; a destroyed one is re-created with its profile at its placement. In mode ``mig``
every new GPU instance gets its default compute instance (``-C``: what containers and passthrough use); in
``mig-vgpu`` none (the MIG-backed vGPU takes the whole GPU instance).
"""

from __future__ import annotations

from vgpuvirt.change.mig import CreateGpuInstances, DestroyGpuInstance, SetMigMode
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout.model import GpuLayout
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.layout.steps import LayoutStep
from vgpuvirt.services.mig.state import MigGpu


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


def mig_plan(g: GpuNow, want: GpuLayout) -> tuple[list[LayoutStep], list[str]]:
    """The steps (ranked by their kinds) and the diff lines."""
    on_now, on_want = g.mig_enabled, want.resolved_mig()
    have: dict[str, int] = dict(g.budget.gpu_instances or {})
    wanted = (dict(want.mig_devices) if want.mig_devices or want.mig_exact else dict(have)) if on_want else {}
    if on_now == on_want and {k: v for k, v in wanted.items() if v} == {k: v for k, v in have.items() if v}:
        return [], []
    m = g.mig
    if m is None or not m.capable:
        raise InvalidSpec(f"MIG layout for {g.address}", dict(want.mig_devices) or on_want,
                          "a GPU whose MIG mode nvidia-smi reports (MIG-capable, nvidia-smi on the host)")
    host, addr, idx = g.budget.host, g.address, m.index
    gpu = str(addr)
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
    steps: list[LayoutStep] = []
    # A geometry that changes is laid out again from an empty GPU, biggest instances first: keeping some
    # instances where they sit can leave the slices the others need fragmented (as mig-parted does it too).
    relayout = {k: v for k, v in wanted.items() if v} != {k: v for k, v in have.items() if v}
    for gi in sorted(m.gpu_instances, key=lambda x: -x.id) if relayout or not on_want else ():
        cis = tuple(c.id for c in m.compute_instances if c.gi == gi.id)
        steps.append(LayoutStep(addr, DestroyGpuInstance(host, "", addr, idx, gi=gi.id, profile=gi.profile,
                                                         start=gi.start, cis=cis)))
    if on_now != on_want:
        steps.append(LayoutStep(addr, SetMigMode(host, "", addr, idx, on=on_want, was=on_now)))
    profiles = sorted((p for p, n in wanted.items() for _ in range(n)), key=lambda p: (-_size(p), p))
    # A GPU with MIG off lists no profiles or placements: its GPU instances wait for the next round, once the
    # mode is on and read again (apply re-reads after each round of preparation).
    if profiles and on_now and relayout:
        starts = place(m, profiles)
        if starts is None:
            raise InvalidSpec(f"mig-devices for {gpu} ({g.product or 'GPU'})", dict(wanted),
                              "GPU instances that fit the GPU's placements together (nvidia-smi mig -lgipp)")
        steps.append(LayoutStep(addr, CreateGpuInstances(host, "", addr, idx, profiles=tuple(profiles),
                                                         placements=tuple(starts), default_ci=want.mode == "mig")))
    return steps, diff
