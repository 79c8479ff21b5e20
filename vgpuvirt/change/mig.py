"""MIG (A100/A30/H100/H200): the MIG mode of a GPU, its GPU instances and their compute instances.

Every kind runs nvidia-smi argv built by :mod:`vgpuvirt.services.mig.ops` (validated values, ``-i BUS-ID``,
never a shell string). nvidia-smi chooses the ids of what it creates, so a create's undo is learned from its
answer (``undo_learned``: even a create that failed part-way names what it made); a destroy's undo creates the
instance again at its placement (the driver gives it the same id there). A mode change that nvidia-smi accepts
may still wait for a GPU reset: ``check`` reads that from the answer and the runner stops there.

MIG state lives in the driver, not in sysfs: no kind has a ``state_path``, so a cut batch's rollback runs the
undos it knows (a destroy of an instance that was not made fails harmlessly and is reported).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from vgpuvirt.change.step import HostFacts, HostStep, Phase
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mig.ops import (
    CreateCi,
    CreateGi,
    DestroyCi,
    DestroyGi,
    MigAction,
    MigMode,
    created_undo_item,
    mig_item,
)
from vgpuvirt.services.mig.ops import ResetGpu as ResetGpuAction
from vgpuvirt.services.mig.parse import mode_change_pending
from vgpuvirt.services.mig.state import MigGpu
from vgpuvirt.services.mutation import Planned

#: Why a mode change that nvidia-smi accepted did not take effect.
PENDING_RESET = ("the MIG mode change is pending until the GPU is reset (VFs bound to vfio-pci or processes use "
                 "it): stop them, or reboot, and apply again")

#: MigAction kind -> the step kind that runs such an action (filled by each kind's ``action``).
ACTION_STEPS: dict[str, type[MigStep]] = {}


@dataclass(frozen=True)
class MigStep(HostStep):
    """A MIG change on one GPU: ``gpu`` (its PCI address: the argv name it by bus id) and ``index`` (nvidia-smi's
    index, which the actions are validated with). The base of the MIG kinds; it has no kind of its own."""

    phase: ClassVar[Phase] = Phase.PREPARE
    host: str
    vm: str
    gpu: PciAddress
    index: int

    #: the :class:`~vgpuvirt.services.mig.ops.MigAction` class whose actions this kind runs (``of``)
    action: ClassVar[type[MigAction] | None] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        act = cls.__dict__.get("action")
        if act is not None:
            ACTION_STEPS[act.kind] = cls

    @property
    def target(self) -> str:
        return str(self.gpu)

    def done_in(self, facts: HostFacts) -> bool:
        return False        # planned from a fresh MIG read (nvidia-smi mig -lgi/-lci): what is there is not planned

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        """The steps that run ``action`` on ``gpu`` (as read: what a destroy's undo makes again)."""
        raise NotImplementedError(f"{cls.__name__} runs no MigAction")


@dataclass(frozen=True)
class SetMigMode(MigStep):
    """Turn a GPU's MIG mode on or off (``was``: the mode it had, for the undo)."""

    kind: ClassVar[str] = "mig-mode"
    rank: ClassVar[int] = 42            # after the SR-IOV VFs went (they hold the GPU), before GPU instances
    action: ClassVar[type[MigAction] | None] = MigMode
    on: bool = True
    was: bool = False
    #: a change that waits for a GPU reset is what was asked (``vgpuvirt mig enable``): not a failure
    pending_ok: bool = False

    def describe(self) -> str:
        return f"turn MIG mode {'on' if self.on else 'off'} on {self.gpu}"

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        assert isinstance(action, MigMode)
        # the mode it would have after a reset: a pending change counts as made
        was = gpu.mode_pending == "Enabled" if gpu.pending else gpu.enabled
        return [cls(host, "", _address(gpu), gpu.index, on=action.enabled, was=was)]

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "mig": "on" if self.on else "off"}

    def item(self, wait_timeout: float) -> Planned:
        return mig_item(self.host, self.gpu, MigAction.mode(self.index, self.on))

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return None if self.was == self.on else mig_item(self.host, self.gpu, MigAction.mode(self.index, self.was))

    def check(self, results: tuple[OpResult, ...]) -> str | None:
        if self.pending_ok:
            return None
        return PENDING_RESET if any(mode_change_pending(r.stdout + r.stderr) for r in results) else None

    def undone(self) -> str:
        return f"turned MIG mode {'on' if self.was else 'off'} on {self.gpu} again"


@dataclass(frozen=True)
class DestroyGpuInstance(MigStep):
    """Destroy a GPU instance, its compute instances (``cis``) first; the undo creates it again with its profile at
    its placement (``start``), with its default compute instance when it had compute instances."""

    kind: ClassVar[str] = "destroy-gpu-instance"
    rank: ClassVar[int] = 12            # after the vGPUs that used it went, before the mode or new instances
    action: ClassVar[type[MigAction] | None] = DestroyGi
    gi: int = 0
    profile: str = ""
    start: int | None = None
    cis: tuple[int, ...] = ()

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        assert isinstance(action, DestroyGi)
        out: list[MigStep] = []
        for gi in action.ids:
            was = next((x for x in gpu.gpu_instances if x.id == gi), None)
            if was is None:
                raise InvalidSpec(f"GPU instance of GPU {gpu.index}", gi,
                                  "one it has (" + (", ".join(str(x.id) for x in gpu.gpu_instances) or "none") + ")")
            # its compute instances go with it only where the action's caller destroyed them first (a
            # destroy-ci step): the undo then makes them again itself
            out.append(cls(host, "", _address(gpu), gpu.index, gi=gi, profile=was.profile, start=was.start))
        return out

    def describe(self) -> str:
        return f"destroy GPU instance {self.gi} ({self.profile}) on {self.gpu}"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "gi": str(self.gi), "profile": self.profile}

    def item(self, wait_timeout: float) -> Planned:
        actions = [MigAction.destroy_ci(self.index, self.gi, list(self.cis))] if self.cis else []
        return mig_item(self.host, self.gpu, *actions, MigAction.destroy_gi(self.index, [self.gi]))

    def undo_item(self, wait_timeout: float) -> Planned:
        return mig_item(self.host, self.gpu, MigAction.create_gi(self.index, [self.profile], placements=[self.start],
                                                                 default_ci=bool(self.cis)))

    def undone(self) -> str:
        at = f" at placement {self.start}" if self.start is not None else ""
        return f"created GPU instance {self.profile} on {self.gpu}{at} again"


@dataclass(frozen=True)
class CreateGpuInstances(MigStep):
    """Create GPU instances (one per profile, at its start in ``placements``; None: nvidia-smi picks), each with its
    default compute instance when ``default_ci`` (``-C``). The undo destroys what the answer says was made."""

    kind: ClassVar[str] = "create-gpu-instances"
    rank: ClassVar[int] = 55            # once the mode is on and the old instances are gone
    undo_learned: ClassVar[bool] = True
    action: ClassVar[type[MigAction] | None] = CreateGi
    profiles: tuple[str, ...] = ()
    placements: tuple[int | None, ...] = ()
    default_ci: bool = False

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        assert isinstance(action, CreateGi)
        return [cls(host, "", _address(gpu), gpu.index, profiles=action.profiles, placements=action.placements,
                    default_ci=action.default_ci)]

    def describe(self) -> str:
        return f"create GPU instances {','.join(self.profiles)} on {self.gpu}"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "profiles": ",".join(self.profiles)}

    def item(self, wait_timeout: float) -> Planned:
        return mig_item(self.host, self.gpu, MigAction.create_gi(
            self.index, list(self.profiles), placements=list(self.placements) or None, default_ci=self.default_ci))

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return None         # the ids are nvidia-smi's choice: known from its answer only

    def undo_from(self, results: tuple[OpResult, ...], wait_timeout: float) -> Planned | None:
        return created_undo_item(self.host, self.gpu, self.index, results)

    def undone(self) -> str:
        return f"destroyed the GPU instances {','.join(self.profiles)} made on {self.gpu}"


@dataclass(frozen=True)
class CreateComputeInstances(MigStep):
    """Create compute instances (``profiles``: names or ids) in GPU instance ``gi``; the undo destroys those the
    answer names."""

    kind: ClassVar[str] = "create-compute-instances"
    rank: ClassVar[int] = 56            # in GPU instances made at 55
    undo_learned: ClassVar[bool] = True
    action: ClassVar[type[MigAction] | None] = CreateCi
    gi: int = 0
    profiles: tuple[str, ...] = ()

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        assert isinstance(action, CreateCi)
        return [cls(host, "", _address(gpu), gpu.index, gi=action.gi, profiles=action.profiles)]

    def describe(self) -> str:
        return f"create compute instances {','.join(self.profiles)} in GPU instance {self.gi} on {self.gpu}"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "gi": str(self.gi), "profiles": ",".join(self.profiles)}

    def item(self, wait_timeout: float) -> Planned:
        return mig_item(self.host, self.gpu, MigAction.create_ci(self.index, self.gi, list(self.profiles)))

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return None

    def undo_from(self, results: tuple[OpResult, ...], wait_timeout: float) -> Planned | None:
        return created_undo_item(self.host, self.gpu, self.index, results)

    def undone(self) -> str:
        return f"destroyed the compute instances made in GPU instance {self.gi} on {self.gpu}"


@dataclass(frozen=True)
class DestroyComputeInstances(MigStep):
    """Destroy compute instances ``ids`` of GPU instance ``gi``; ``profiles`` (one per id, as nvidia-smi's profile
    ids) lets the undo create them again."""

    kind: ClassVar[str] = "destroy-compute-instances"
    rank: ClassVar[int] = 11            # before their GPU instance goes (12)
    action: ClassVar[type[MigAction] | None] = DestroyCi
    gi: int = 0
    ids: tuple[int, ...] = ()
    profiles: tuple[str, ...] = ()

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        assert isinstance(action, DestroyCi)
        was = {c.id: c for c in gpu.compute_instances if c.gi == action.gi}
        missing = [i for i in action.ids if i not in was]
        if missing:
            raise InvalidSpec(f"compute instance of GPU {gpu.index} GI {action.gi}", missing[0],
                              "one it has (" + (", ".join(map(str, sorted(was))) or "none") + ")")
        return [cls(host, "", _address(gpu), gpu.index, gi=action.gi, ids=action.ids,
                    profiles=tuple(str(was[i].profile_id) for i in action.ids))]

    def describe(self) -> str:
        return f"destroy compute instances {','.join(map(str, self.ids))} of GPU instance {self.gi} on {self.gpu}"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "gi": str(self.gi), "ids": ",".join(map(str, self.ids))}

    def item(self, wait_timeout: float) -> Planned:
        return mig_item(self.host, self.gpu, MigAction.destroy_ci(self.index, self.gi, list(self.ids)))

    def undo_item(self, wait_timeout: float) -> Planned | None:
        if not self.profiles:
            return None
        return mig_item(self.host, self.gpu, MigAction.create_ci(self.index, self.gi, list(self.profiles)))

    def undone(self) -> str:
        return f"created compute instances {','.join(self.profiles)} in GPU instance {self.gi} on {self.gpu} again"


@dataclass(frozen=True)
class ResetGpu(MigStep):
    """Reset a GPU (``nvidia-smi -r``: a pending MIG mode takes effect). Nothing undoes a reset; it makes no
    instance, so the rollback has nothing to do for it."""

    kind: ClassVar[str] = "gpu-reset"
    rank: ClassVar[int] = 43            # right after a mode change it makes take effect
    action: ClassVar[type[MigAction] | None] = ResetGpuAction

    @classmethod
    def of(cls, host: str, gpu: MigGpu, action: MigAction) -> list[MigStep]:
        return [cls(host, "", _address(gpu), gpu.index)]

    def describe(self) -> str:
        return f"reset GPU {self.gpu}"

    def item(self, wait_timeout: float) -> Planned:
        return mig_item(self.host, self.gpu, MigAction.reset(self.index))

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return None

    def undone(self) -> str:
        return f"nothing undoes the reset of {self.gpu}"


def _address(gpu: MigGpu) -> PciAddress:
    if gpu.address is None:
        raise InvalidSpec("GPU", gpu.index, "a GPU whose PCI address nvidia-smi reports")
    return gpu.address


def mig_steps(host: str, gpu: MigGpu, actions: Sequence[MigAction]) -> list[MigStep]:
    """The steps that run ``actions`` (planned on ``gpu`` as read), in their order: each action by the kind
    registered for its class."""
    return [s for a in actions for s in ACTION_STEPS[a.kind].of(host, gpu, a)]
