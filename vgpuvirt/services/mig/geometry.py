"""From a wanted MIG geometry (``{"1g.10gb": 7}``, mixed ones too) to the :class:`MigAction` list that gets a GPU
there from its state as read (pure; run the list as change steps: :func:`vgpuvirt.change.mig.mig_steps` and the runner).

Minimal churn by default: GPU instances already there and wanted are kept; surplus ones are destroyed (their
compute instances first, highest id first); missing ones are created largest first (the driver puts a
one-slice instance at the top and larger ones from slice 0, so this order leaves the fewest holes).
A kept instance can sit where a wanted larger one must go (a 1g at slice 3 blocks a 4g): then the batch
fails and rolls back, and ``rebuild=True`` (destroy every instance, create all) is the way. An instance that
holds a vGPU (``in_use``) is never destroyed: asking for that is refused before anything is sent.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.services.mig.ops import MigAction, check_against
from vgpuvirt.services.mig.state import MigGpu


def _slices(name: str) -> int:
    head = name.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def geometry_actions(gpu: MigGpu, want: Mapping[str, int], *, default_ci: bool = False, rebuild: bool = False,
                     in_use: Collection[int] = ()) -> list[MigAction]:
    """The actions that leave ``gpu`` with exactly ``want`` GPU instances (MIG mode switched on first when it
    is off; never switched off here: that is a separate :meth:`MigAction.mode`); ``[]`` when it already has
    them (a rerun changes nothing)."""
    if not gpu.capable:
        raise InvalidSpec(f"MIG geometry of GPU {gpu.index}", dict(want), "a MIG-capable GPU (A100, A30, H100 ...)")
    for name, n in want.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidSpec(f"count of MIG profile {name}", n, "a whole number >= 0")
    want = {k: v for k, v in want.items() if v}
    actions: list[MigAction] = []
    if want and not gpu.enabled:
        actions.append(MigAction.mode(gpu.index, True))
    have = sorted(gpu.gpu_instances, key=lambda g: -g.id)
    keep: dict[str, int] = {} if rebuild else dict(want)
    doomed = []
    for gi in have:
        if keep.get(gi.profile, 0) > 0:
            keep[gi.profile] -= 1
        else:
            doomed.append(gi)
    busy = [gi.id for gi in doomed if gi.id in in_use]
    if busy:
        raise InvalidSpec(f"MIG geometry of GPU {gpu.index}", dict(want),
                          f"one that keeps GPU instance(s) {', '.join(map(str, busy))} (they hold vGPUs)")
    for gi in doomed:
        cis = [c.id for c in gpu.compute_instances if c.gi == gi.id]
        if cis:
            actions.append(MigAction.destroy_ci(gpu.index, gi.id, cis))
        actions.append(MigAction.destroy_gi(gpu.index, [gi.id]))
    kept = gpu.instance_counts()
    for gi in doomed:
        kept[gi.profile] -= 1
    missing = [name for name in sorted(want, key=lambda n: (-_slices(n), n))
               for _ in range(want[name] - kept.get(name, 0))]
    if missing:
        create = MigAction.create_gi(gpu.index, missing, default_ci=default_ci)
        check_against(create, gpu)
        actions.append(create)
    if not want and gpu.enabled and not gpu.gpu_instances:
        return []
    return actions
