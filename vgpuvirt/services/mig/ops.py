"""MIG changes as argv lists (never shell strings): one :class:`MigAction` subclass per kind of change.

Build them with the constructors (:meth:`MigAction.mode`, :meth:`create_gi`, :meth:`destroy_gi`,
:meth:`create_ci`, :meth:`destroy_ci`, :meth:`reset`); every value is validated before anything reaches a host
(a GPU index, a MIG profile name such as ``1g.10gb`` / ``1g.10gb+me`` or a profile id, instance ids).
They run as the change engine's MIG kinds (:mod:`vgpuvirt.change.mig`): :func:`mig_item` puts actions in a host's
locked batch, :func:`created_undo_item` reads the undo of a create from nvidia-smi's answer; the runner
(:mod:`vgpuvirt.change.runner`) journals and rolls back.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from vgpuvirt.errors import DeviceError, InvalidSpec
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mig.parse import created_compute_instances, created_gpu_instances
from vgpuvirt.services.mig.state import MigGpu
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.nvidia.modes import nvidia_smi_bus_id

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


class MigAction(ABC):
    """One nvidia-smi MIG change on one GPU (``gpu``: its nvidia-smi index): one subclass per kind of change,
    each with its argv and its line. Build them with the validating constructors."""

    kind: ClassVar[str]
    gpu: int
    #: GI ids (destroy-gi) or CI ids (destroy-ci); () for the other kinds
    ids: tuple[int, ...] = ()
    #: profile names or ids (as text) of a create; () for the other kinds
    profiles: tuple[str, ...] = ()

    @abstractmethod
    def argv(self) -> list[str]: ...

    @abstractmethod
    def describe(self) -> str: ...

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "gpu": self.gpu, "argv": self.argv(), "describe": self.describe()}

    # -- constructors (validate) -----------------------------------------------------------------

    @staticmethod
    def mode(gpu: int, enabled: bool) -> MigAction:
        return MigMode(_gpu(gpu), bool(enabled))

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
        return CreateGi(_gpu(gpu), profs, starts, bool(default_ci))

    @staticmethod
    def destroy_gi(gpu: int, ids: Sequence[int]) -> MigAction:
        gis = _ids("GPU instance id", ids)
        if not gis:
            raise InvalidSpec("GPU instance ids", list(ids), "at least one id")
        return DestroyGi(_gpu(gpu), gis)

    @staticmethod
    def create_ci(gpu: int, gi: int, profiles: Sequence[str | int]) -> MigAction:
        profs = tuple(_profile(p, _CI_NAME, "compute instance profile") for p in profiles)
        if not profs:
            raise InvalidSpec("compute instance profiles", list(profiles), "at least one profile")
        return CreateCi(_gpu(gpu), _ids("GPU instance id", [gi])[0], profs)

    @staticmethod
    def destroy_ci(gpu: int, gi: int, ids: Sequence[int]) -> MigAction:
        cis = _ids("compute instance id", ids)
        if not cis:
            raise InvalidSpec("compute instance ids", list(ids), "at least one id")
        return DestroyCi(_gpu(gpu), _ids("GPU instance id", [gi])[0], cis)

    @staticmethod
    def reset(gpu: int) -> MigAction:
        return ResetGpu(_gpu(gpu))


@dataclass(frozen=True)
class MigMode(MigAction):
    kind: ClassVar[str] = "mode"
    gpu: int
    enabled: bool

    def argv(self) -> list[str]:
        return ["nvidia-smi", "-i", str(self.gpu), "-mig", "1" if self.enabled else "0"]

    def describe(self) -> str:
        return f"GPU {self.gpu}: MIG mode {'on' if self.enabled else 'off'}"


@dataclass(frozen=True)
class ResetGpu(MigAction):
    kind: ClassVar[str] = "reset"
    gpu: int

    def argv(self) -> list[str]:
        return ["nvidia-smi", "-i", str(self.gpu), "-r"]

    def describe(self) -> str:
        return f"GPU {self.gpu}: reset"


@dataclass(frozen=True)
class CreateGi(MigAction):
    """``placements``: a start (memory slice) per profile, None where nvidia-smi picks; ``default_ci``: ``-C``."""

    kind: ClassVar[str] = "create-gi"
    gpu: int
    profiles: tuple[str, ...] = ()
    placements: tuple[int | None, ...] = ()      # a default only because the base gives ``profiles`` one
    default_ci: bool = False

    def argv(self) -> list[str]:
        spec = ",".join(p if s is None else f"{p}:{s}" for p, s in zip(self.profiles, self.placements, strict=True))
        return ["nvidia-smi", "mig", "-i", str(self.gpu), "-cgi", spec] + (["-C"] if self.default_ci else [])

    def describe(self) -> str:
        return f"GPU {self.gpu}: create GPU instance(s) {','.join(self.profiles)}" + (
            " with compute instances" if self.default_ci else "")


@dataclass(frozen=True)
class DestroyGi(MigAction):
    kind: ClassVar[str] = "destroy-gi"
    gpu: int
    ids: tuple[int, ...]

    def argv(self) -> list[str]:
        return ["nvidia-smi", "mig", "-i", str(self.gpu), "-dgi", "-gi", ",".join(map(str, self.ids))]

    def describe(self) -> str:
        return f"GPU {self.gpu}: destroy GPU instance(s) {','.join(map(str, self.ids))}"


@dataclass(frozen=True)
class CreateCi(MigAction):
    kind: ClassVar[str] = "create-ci"
    gpu: int
    gi: int
    profiles: tuple[str, ...]

    def argv(self) -> list[str]:
        return ["nvidia-smi", "mig", "-i", str(self.gpu), "-gi", str(self.gi), "-cci", ",".join(self.profiles)]

    def describe(self) -> str:
        return f"GPU {self.gpu} GI {self.gi}: create compute instance(s) {','.join(self.profiles)}"


@dataclass(frozen=True)
class DestroyCi(MigAction):
    kind: ClassVar[str] = "destroy-ci"
    gpu: int
    gi: int
    ids: tuple[int, ...]

    def argv(self) -> list[str]:
        return ["nvidia-smi", "mig", "-i", str(self.gpu), "-gi", str(self.gi), "-dci", "-ci",
                ",".join(map(str, self.ids))]

    def describe(self) -> str:
        return f"GPU {self.gpu} GI {self.gi}: destroy compute instance(s) {','.join(map(str, self.ids))}"


def check_against(action: MigAction, gpu: MigGpu) -> None:
    """Refuse (InvalidSpec, nothing sent) a create whose profile the GPU does not list in ``-lgip``, or whose
    start is not one of the profile's possible placements (``-lgipp``)."""
    if not isinstance(action, CreateGi) or not gpu.profiles:
        return
    for p, start in zip(action.profiles, action.placements, strict=True):
        prof = gpu.profile(p)
        if prof is None:
            known = ", ".join(f"{q.name} ({q.id})" for q in gpu.profiles)
            raise InvalidSpec(f"MIG profile on GPU {gpu.index}", p, f"one of {known}")
        if start is not None and prof.placements and start not in prof.placements:
            raise InvalidSpec(f"placement of {prof.name} on GPU {gpu.index}", start,
                              f"one of its starts {{{','.join(map(str, prof.placements))}}} (nvidia-smi mig -lgipp)")


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
    actions: list[MigAction] = [MigAction.destroy_ci(index, gi, [ci])
                                for _, gi, ci in reversed(created_compute_instances(text))]
    gis = [gi for _, gi in created_gpu_instances(text)]     # one GPU per exec
    if gis:
        actions.append(MigAction.destroy_gi(index, list(reversed(gis))))
    return mig_item(host, gpu, *actions) if actions else None
