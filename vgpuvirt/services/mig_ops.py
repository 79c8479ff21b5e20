"""MIG changes as argv lists (never shell strings) and one batch that runs them, with per-item status
and a rollback of exactly what the batch created or changed.

Build :class:`MigAction` values with the constructors (:meth:`MigAction.mode`, :meth:`create_gi`,
:meth:`destroy_gi`, :meth:`create_ci`, :meth:`destroy_ci`, :meth:`reset`); every value is validated before
anything reaches a host (a GPU index, a MIG profile name such as ``1g.10gb`` / ``1g.10gb+me`` or a
profile id, instance ids). :func:`apply_mig` sends them in ONE locked round trip; when one fails
the rest are skipped and, unless ``rollback=False``, a second round trip undoes what the batch did
(created GIs/CIs destroyed in reverse order, changed modes set back).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vgpuvirt.errors import DeviceError, InvalidSpec
from vgpuvirt.host.base import Host, Op, OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mig import MigGpu, MigState
from vgpuvirt.services.mig_parse import (
    created_compute_instances,
    created_gpu_instances,
    destroyed_compute_instances,
    destroyed_gpu_instances,
    mode_change_pending,
)
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.nvidia_modes import nvidia_smi_bus_id

Kind = Literal["mode", "create-gi", "destroy-gi", "create-ci", "destroy-ci", "reset"]

#: A GPU-instance profile name as nvidia-smi prints it: "1g.10gb", "1g.10gb+me", "7g.80gb", "1g.24gb+me.all",
#: "1g.24gb-me" (newer drivers); or a compute-instance profile "1c.3g.20gb".
_GI_NAME = re.compile(r"^[1-8]g\.\d{1,4}gb(?:[+-](?:me|gfx)(?:\.all)?)?\Z")
_CI_NAME = re.compile(r"^(?:[1-8]c\.)?[1-8]g\.\d{1,4}gb(?:[+-](?:me|gfx)(?:\.all)?)?\Z")
_MAX_ID = 63


def _gpu(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise InvalidSpec("GPU index", value, "an nvidia-smi GPU index 0..255")
    return value


def _ids(what: str, values: Sequence[int]) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_ID:
            raise InvalidSpec(what, v, f"an instance id 0..{_MAX_ID}")
        out.append(v)
    if len(set(out)) != len(out):
        raise InvalidSpec(what, list(values), "distinct ids")
    return tuple(out)


def _profile(value: object, pattern: re.Pattern[str], what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_ID:
        return str(value)
    text = str(value).removeprefix("MIG ") if isinstance(value, str) else ""
    if text.isdigit() and int(text) <= _MAX_ID:
        return str(int(text))
    if not pattern.match(text):
        raise InvalidSpec(what, value, "a profile id or a name such as 1g.10gb, 1g.10gb+me, 3g.40gb")
    return text


@dataclass(frozen=True)
class MigAction:
    """One nvidia-smi MIG change on one GPU. ``profiles``: names or ids (as text); ``placements``: an optional
    start (memory slice) per profile; ``ids``: GI ids (destroy-gi) or CI ids (destroy-ci); ``gi``: the GPU
    instance a CI action works in."""

    kind: Kind
    gpu: int
    enabled: bool | None = None
    profiles: tuple[str, ...] = ()
    placements: tuple[int | None, ...] = ()
    ids: tuple[int, ...] = ()
    gi: int | None = None
    default_ci: bool = False

    # -- constructors (validate) -----------------------------------------------------------------

    @staticmethod
    def mode(gpu: int, enabled: bool) -> MigAction:
        return MigAction("mode", _gpu(gpu), enabled=bool(enabled))

    @staticmethod
    def create_gi(gpu: int, profiles: Sequence[str | int], *, placements: Sequence[int | None] | None = None,
                  default_ci: bool = False) -> MigAction:
        profs = tuple(_profile(p, _GI_NAME, "MIG profile") for p in profiles)
        if not profs:
            raise InvalidSpec("MIG profiles", list(profiles), "at least one profile")
        starts = tuple(placements) if placements is not None else (None,) * len(profs)
        if len(starts) != len(profs):
            raise InvalidSpec("MIG placements", list(starts), f"one start (or None) per profile ({len(profs)})")
        for s in starts:
            if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= 7):
                raise InvalidSpec("MIG placement start", s, "a memory slice 0..7")
        return MigAction("create-gi", _gpu(gpu), profiles=profs, placements=starts, default_ci=bool(default_ci))

    @staticmethod
    def destroy_gi(gpu: int, ids: Sequence[int]) -> MigAction:
        gis = _ids("GPU instance id", ids)
        if not gis:
            raise InvalidSpec("GPU instance ids", list(ids), "at least one id")
        return MigAction("destroy-gi", _gpu(gpu), ids=gis)

    @staticmethod
    def create_ci(gpu: int, gi: int, profiles: Sequence[str | int]) -> MigAction:
        profs = tuple(_profile(p, _CI_NAME, "compute instance profile") for p in profiles)
        if not profs:
            raise InvalidSpec("compute instance profiles", list(profiles), "at least one profile")
        return MigAction("create-ci", _gpu(gpu), profiles=profs, gi=_ids("GPU instance id", [gi])[0])

    @staticmethod
    def destroy_ci(gpu: int, gi: int, ids: Sequence[int]) -> MigAction:
        cis = _ids("compute instance id", ids)
        if not cis:
            raise InvalidSpec("compute instance ids", list(ids), "at least one id")
        return MigAction("destroy-ci", _gpu(gpu), ids=cis, gi=_ids("GPU instance id", [gi])[0])

    @staticmethod
    def reset(gpu: int) -> MigAction:
        return MigAction("reset", _gpu(gpu))

    # -- what runs --------------------------------------------------------------------------------

    def argv(self) -> list[str]:
        g = str(self.gpu)
        if self.kind == "mode":
            return ["nvidia-smi", "-i", g, "-mig", "1" if self.enabled else "0"]
        if self.kind == "reset":
            return ["nvidia-smi", "-i", g, "-r"]
        if self.kind == "create-gi":
            spec = ",".join(p if s is None else f"{p}:{s}" for p, s in zip(self.profiles, self.placements,
                                                                            strict=True))
            return ["nvidia-smi", "mig", "-i", g, "-cgi", spec] + (["-C"] if self.default_ci else [])
        if self.kind == "destroy-gi":
            return ["nvidia-smi", "mig", "-i", g, "-dgi", "-gi", ",".join(map(str, self.ids))]
        if self.kind == "create-ci":
            return ["nvidia-smi", "mig", "-i", g, "-gi", str(self.gi), "-cci", ",".join(self.profiles)]
        return ["nvidia-smi", "mig", "-i", g, "-gi", str(self.gi), "-dci", "-ci", ",".join(map(str, self.ids))]

    def describe(self) -> str:
        if self.kind == "mode":
            return f"GPU {self.gpu}: MIG mode {'on' if self.enabled else 'off'}"
        if self.kind == "reset":
            return f"GPU {self.gpu}: reset"
        if self.kind == "create-gi":
            return f"GPU {self.gpu}: create GPU instance(s) {','.join(self.profiles)}" + (
                " with compute instances" if self.default_ci else "")
        if self.kind == "destroy-gi":
            return f"GPU {self.gpu}: destroy GPU instance(s) {','.join(map(str, self.ids))}"
        if self.kind == "create-ci":
            return f"GPU {self.gpu} GI {self.gi}: create compute instance(s) {','.join(self.profiles)}"
        return f"GPU {self.gpu} GI {self.gi}: destroy compute instance(s) {','.join(map(str, self.ids))}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "gpu": self.gpu, "argv": self.argv(), "describe": self.describe()}


def check_against(action: MigAction, gpu: MigGpu) -> None:
    """Refuse (InvalidSpec, nothing sent) a create whose profile the GPU does not list in ``-lgip``, or whose
    start is not one of the profile's possible placements (``-lgipp``)."""
    if action.kind != "create-gi" or not gpu.profiles:
        return
    for p, start in zip(action.profiles, action.placements, strict=True):
        prof = gpu.profile(p)
        if prof is None:
            known = ", ".join(f"{q.name} ({q.id})" for q in gpu.profiles)
            raise InvalidSpec(f"MIG profile on GPU {gpu.index}", p, f"one of {known}")
        if start is not None and prof.placements and start not in prof.placements:
            raise InvalidSpec(f"placement of {prof.name} on GPU {gpu.index}", start,
                              f"one of its starts {{{','.join(map(str, prof.placements))}}} (nvidia-smi mig -lgipp)")


@dataclass(frozen=True)
class MigItemResult:
    action: MigAction
    status: Literal["ok", "pending", "failed", "skipped"]
    rc: int | None
    message: str                                   # the tool's last line (error or confirmation)
    created_gis: tuple[tuple[int, int], ...] = ()  # (GPU, GI id)
    created_cis: tuple[tuple[int, int, int], ...] = ()  # (GPU, GI id, CI id)
    destroyed_gis: tuple[tuple[int, int], ...] = ()
    destroyed_cis: tuple[tuple[int, int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**self.action.to_dict(), "status": self.status, "rc": self.rc, "message": self.message,
                "created_gis": [list(x) for x in self.created_gis],
                "created_cis": [list(x) for x in self.created_cis]}


@dataclass(frozen=True)
class MigApplyResult:
    items: tuple[MigItemResult, ...]
    rollback: tuple[str, ...] = field(default_factory=tuple)   # one line per undo ("FAILED ..." if it failed)
    round_trips: int = 0

    @property
    def ok(self) -> bool:
        return all(i.status in ("ok", "pending") for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "items": [i.to_dict() for i in self.items], "rollback": list(self.rollback)}


def _last_line(r: OpResult) -> str:
    """A failure's last error line (stderr first), or a success's first confirmation line."""
    if r.ok:
        lines = [ln for ln in r.stdout.strip().splitlines() if ln.strip() and ln.strip() != "All done."]
        return lines[0] if lines else ""
    lines = [ln for ln in (r.stderr.strip() or r.stdout.strip()).splitlines() if ln.strip()]
    return lines[-1] if lines else (r.error or "")


def _item(action: MigAction, r: OpResult) -> MigItemResult:
    status: Literal["ok", "pending", "failed", "skipped"]
    if r.skipped:
        status = "skipped"
    elif not r.ok:
        status = "failed"
    elif action.kind == "mode" and mode_change_pending(r.stdout + r.stderr):
        status = "pending"
    else:
        status = "ok"
    return MigItemResult(action, status, r.rc, _last_line(r) if not r.skipped else "not run (an earlier item failed)",
                         tuple(created_gpu_instances(r.stdout)), tuple(created_compute_instances(r.stdout)),
                         tuple(destroyed_gpu_instances(r.stdout)), tuple(destroyed_compute_instances(r.stdout)))


def _recreate(it: MigItemResult, before: MigState | None) -> list[MigAction]:
    """Re-create what ``it`` destroyed, at the same placement (the driver gives a GI at a placement the same id),
    GPU instances before their compute instances; only what ``before`` describes."""
    if before is None:
        return []
    out: list[MigAction] = []
    for gpu, gi in reversed(it.destroyed_gis):
        g = before.gpu(gpu)
        was = next((x for x in g.gpu_instances if x.id == gi), None) if g is not None else None
        if was is not None:
            out.append(MigAction.create_gi(gpu, [was.profile], placements=[was.start]))
    for gpu, gi, ci in reversed(it.destroyed_cis):
        g = before.gpu(gpu)
        wci = next((c for c in g.compute_instances if c.gi == gi and c.id == ci), None) if g is not None else None
        if wci is not None:
            out.append(MigAction.create_ci(gpu, gi, [str(wci.profile_id)]))
    return out


def undo_actions(items: Sequence[MigItemResult], previous_modes: dict[int, bool] | None = None,
                 before: MigState | None = None) -> list[MigAction]:
    """What undoes ``items``' effects, in reverse order: created CIs and GIs destroyed (also those a failed
    item created before it failed), destroyed GIs and CIs created again (when ``before`` describes them),
    changed modes set back (when ``previous_modes`` or ``before`` says what they were)."""
    if previous_modes is None and before is not None:
        previous_modes = {g.index: g.mode_pending == "Enabled" if g.pending else g.enabled
                          for g in before.gpus if g.capable}
    undo: list[MigAction] = []
    for it in reversed(items):
        undo.extend(_recreate(it, before))
        cis = list(it.created_cis)
        for gpu, gi, ci in reversed(cis):
            undo.append(MigAction.destroy_ci(gpu, gi, [ci]))
        if it.action.kind == "create-gi":
            for gpu, gi in reversed(it.created_gis):
                undo.append(MigAction.destroy_gi(gpu, [gi]))
        if (it.action.kind == "mode" and it.status in ("ok", "pending") and previous_modes is not None
                and it.action.gpu in previous_modes and previous_modes[it.action.gpu] != it.action.enabled):
            undo.append(MigAction.mode(it.action.gpu, previous_modes[it.action.gpu]))
    return undo


def apply_mig(host: Host, actions: Sequence[MigAction], *, rollback: bool = True,
              previous_modes: dict[int, bool] | None = None, before: MigState | None = None) -> MigApplyResult:
    """Run ``actions`` in ONE locked batch, stopping at the first failure; then (``rollback``) undo what the
    batch did in a second round trip. ``before`` (the :func:`~vgpuvirt.services.mig.read_mig_state` the actions
    were planned from) lets destroyed instances be created again and changed modes be set back;
    ``previous_modes`` (GPU index -> MIG on) does the latter alone."""
    if not actions:
        return MigApplyResult(())
    batch = host.apply([Op.exec(a.argv(), timeout=300.0) for a in actions], lock=True, on_error="stop")
    items = tuple(_item(a, r) for a, r in zip(actions, batch.results, strict=True))
    if all(i.status in ("ok", "pending") for i in items) or not rollback:
        return MigApplyResult(items, round_trips=1)
    undo = undo_actions(items, previous_modes, before)
    if not undo:
        return MigApplyResult(items, round_trips=1)
    res = host.apply([Op.exec(a.argv(), timeout=300.0) for a in undo], lock=True, on_error="continue")
    lines = tuple(f"{a.describe()}: {'ok' if r.ok else 'FAILED ' + _last_line(r)}"
                  for a, r in zip(undo, res.results, strict=True))
    return MigApplyResult(items, lines, round_trips=2)


# -- batch items (the change engine's MIG kinds, vgpuvirt.change.mig, put them in a host's locked batch) ----------

def argv_by_bus_id(action: MigAction, gpu: PciAddress) -> list[str]:
    """The action's argv with ``-i BUS-ID`` instead of nvidia-smi's index: the index is a GPU's position among
    the GPUs nvidia-smi sees, and a GPU the same batch binds to vfio-pci drops out of that count."""
    argv = action.argv()
    i = argv.index("-i")
    argv[i + 1] = nvidia_smi_bus_id(gpu)
    return argv


def mig_item(host: str, gpu: PciAddress, *actions: MigAction) -> Planned:
    """MIG actions on one GPU as one batch item (their argv in one group of exec ops, run in order)."""
    first = actions[0]
    g = f"mig:{gpu}:{first.kind}:{'-'.join(map(str, first.ids or first.profiles))}"
    ops = tuple(Op.exec(argv_by_bus_id(a, gpu), timeout=300.0, group=g) for a in actions)
    what = "; ".join(a.describe() for a in actions)

    def explain(bad: OpResult) -> DeviceError:
        said = (bad.stderr or bad.stdout or bad.error or "").strip().splitlines()[-1:] or ["no output"]
        return DeviceError(host, str(gpu), f"{what} failed (exit {bad.rc}): {said[0]}")

    return Planned(f"mig.{first.kind}", str(gpu), ops, explain, first.to_dict(), intent=what, message=what,
                   dry_message="would " + what)


def created_undo_item(host: str, gpu: PciAddress, index: int, results: Sequence[OpResult]) -> Planned | None:
    """What undoes creates that ran (in full or in part): the compute instances their answer names, then the GPU
    instances; None when the answer names nothing made."""
    text = "\n".join(r.stdout for r in results)
    actions = [MigAction.destroy_ci(index, gi, [ci]) for _, gi, ci in reversed(created_compute_instances(text))]
    gis = [gi for _, gi in created_gpu_instances(text)]     # one GPU per exec
    if gis:
        actions.append(MigAction.destroy_gi(index, list(reversed(gis))))
    return mig_item(host, gpu, *actions) if actions else None
