"""The NVIDIA vGPU scheduler: set a GPU's policy now through NVML, and vgpuvirt's modprobe.d file that carries it to
the next driver load (the ``RmPVMRL`` registry key).

* :class:`SetSchedulerNvml`: one NVML call; its undo sets the policy NVML reported before.
* :class:`WriteSchedulerFile`: vgpuvirt's own file (one per host); its undo puts the file back as it was. When NVML
  cannot set a GPU's policy, the file is the only carrier: the step is ``reload_pending`` (reported apart: it
  takes effect at the next load of the nvidia module, which only the operator does).

Both run in the DEVICES phase, after the vGPUs are made (the file first: the NVML call is the one that can fail on a
busy GPU, and the file's undo is the cheaper one). :func:`apply_schedulers` is ``vgpuvirt scheduler set``: a
:class:`~vgpuvirt.services.scheduler.service.SchedulerPlan` as these steps, through the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.runner import Report, run_host
from vgpuvirt.change.step import HostFacts, HostStep
from vgpuvirt.host.base import Host, Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.scheduler import service as vgpu_scheduler
from vgpuvirt.services.scheduler.model import MODPROBE_FILE, SchedulerSetting
from vgpuvirt.services.scheduler.service import SchedulerPlan

PENDING = "pending until the driver reloads"


@dataclass(frozen=True)
class SetSchedulerNvml(HostStep):
    """Set ``gpu``'s vGPU scheduler to ``setting`` now (NVML); ``before``: what NVML reported (None: unknown, the
    undo then has nothing to go back to)."""

    kind: ClassVar[str] = "scheduler-nvml"
    rank: ClassVar[int] = 81
    host: str
    vm: str
    gpu: PciAddress
    setting: SchedulerSetting
    before: SchedulerSetting | None = None

    @property
    def target(self) -> str:
        return str(self.gpu)

    def describe(self) -> str:
        return f"set the vGPU scheduler of {self.gpu} to {self.setting.describe()} (now, through NVML)"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "policy": self.setting.describe(),
                "before": self.before.describe() if self.before is not None else ""}

    def done_in(self, facts: HostFacts) -> bool:
        return False        # planned from NVML's answer in the same read: a policy already set is not planned

    def item(self, wait_timeout: float) -> Planned:
        return vgpu_scheduler.nvml_item(self.host, self.gpu, self.setting)

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return vgpu_scheduler.nvml_item(self.host, self.gpu, self.before) if self.before is not None else None

    def undone(self) -> str:
        was = self.before.describe() if self.before is not None else "unknown"
        return f"set the vGPU scheduler of {self.gpu} back to {was}"


@dataclass(frozen=True)
class WriteSchedulerFile(HostStep):
    """Replace vgpuvirt's modprobe.d file with ``text`` (the scheduler of every GPU it names, at each driver load).
    ``before``: the file as it was (None: absent, and the undo removes it).
    ``pending``: the GPUs whose policy only this file carries (NVML cannot set it): the step takes effect at the
    next driver load."""

    kind: ClassVar[str] = "scheduler-file"
    rank: ClassVar[int] = 80
    host: str
    vm: str
    text: str
    before: str | None = None
    pending: tuple[PciAddress, ...] = ()

    @property
    def target(self) -> str:
        return MODPROBE_FILE

    def describe(self) -> str:
        if self.pending:
            return f"write RmPVMRL for {', '.join(map(str, self.pending))} to {MODPROBE_FILE} ({PENDING})"
        return f"write RmPVMRL to {MODPROBE_FILE} (the policy at every driver load)"

    def details(self) -> dict[str, str]:
        return {"path": MODPROBE_FILE, "pending": ",".join(map(str, self.pending))}

    def done_in(self, facts: HostFacts) -> bool:
        return False        # planned from the file as read: a file that already says it is not planned

    @property
    def reload_pending(self) -> bool:
        return bool(self.pending)

    def item(self, wait_timeout: float) -> Planned:
        return vgpu_scheduler.file_item(self.host, self.text)

    def undo_item(self, wait_timeout: float) -> Planned:
        return vgpu_scheduler.file_item(self.host, self.before)

    def state_path(self) -> str:
        return MODPROBE_FILE

    def happened(self, snap: Snapshot) -> bool:
        return snap.raw(self.state_path()) == self.text

    def undone(self) -> str:
        return f"put {MODPROBE_FILE} back as it was" if self.before is not None else f"removed {MODPROBE_FILE} again"


def scheduler_steps(plan: SchedulerPlan) -> list[HostStep]:
    """The steps that carry out ``plan``: the file (when it changes), then one NVML set per GPU whose running
    policy changes."""
    steps: list[HostStep] = []
    if plan.file_text is not None:
        pending = tuple(PciAddress.parse(c.gpu) for c in plan.changes if c.pending)
        steps.append(WriteSchedulerFile(plan.host, "", plan.file_text, plan.file_before, pending))
    steps += [SetSchedulerNvml(plan.host, "", PciAddress.parse(c.gpu), c.after, c.before) for c in plan.changes
              if c.via == "nvml" and c.before != c.after]
    return steps


def apply_schedulers(host: Host, plan: SchedulerPlan, *, wait_timeout: float = 10.0) -> Report:
    """Run the plan in one batch; a failure (a GPU whose NVML set is refused) undoes what ran: the file is put back
    (or removed again where there was none), the GPUs already set get their policy back (ProvisioningError)."""
    steps = scheduler_steps(plan)
    if not steps:
        return Report(kept=[f"{host.name}: {c.describe()}" for c in plan.changes])
    return run_host(host, steps, what="scheduler set", wait_timeout=wait_timeout,
                    kept=[f"{host.name}: {c.describe()}" for c in plan.changes if c.via == "none"])
