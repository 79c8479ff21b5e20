"""A layout's vGPU scheduler policies as steps (pure): the scheduler service's plan, on the layout's own read.

The layout's read already carries every GPU's scheduler (:func:`vgpuvirt.layout.verbs.read_gpus`); here
:func:`~vgpuvirt.services.scheduler.service.plan_from_read` decides, per GPU whose entry names a policy, how
it is set, with ``persist`` on: a layout is the state the host keeps, across driver loads too. So:

* NVML has the scheduler calls: set now (one NVML call per GPU) AND the registry key written, so that the
  next driver load (a reboot) runs the same policy; the boot unit has nothing to do for it;
* NVML lacks them: the registry key only: the step is "pending until the driver reloads", and the
  apply report lists it as pending, not as done.

The file step (vgpuvirt's own /etc/modprobe.d file, one per host) undoes to the file as it was; an NVML
step undoes to the policy NVML reported before. Both run in the phase-2 ("devices") batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpuvirt.change.scheduler import PENDING, SetSchedulerNvml, WriteSchedulerFile
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout.model import GpuLayout, Scheduler
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.layout.steps import LayoutStep
from vgpuvirt.model import PciAddress
from vgpuvirt.services.scheduler.model import SchedulerSetting, parse_setting
from vgpuvirt.services.scheduler.service import SchedulerRead, plan_from_read


def setting(gpu: PciAddress, want: Scheduler) -> SchedulerSetting:
    if want.average_factor is not None:
        raise InvalidSpec(f"scheduler average-factor for {gpu}", want.average_factor,
                          "none: vgpuvirt does not set the adaptive scheduler's average factor; leave it out")
    return parse_setting(want.policy, want.timeslice_ms * 1000 if want.timeslice_ms else None)


def plan(host: str, gpus: Sequence[GpuNow], wanted: Mapping[PciAddress, GpuLayout]
         ) -> tuple[list[LayoutStep], dict[PciAddress, list[str]], list[str]]:
    """Steps, per-GPU differences (what apply changes) and notes (a policy written, waiting for a driver
    reload that only the operator can do: not a difference)."""
    settings: dict[str, SchedulerSetting] = {}
    sched: SchedulerRead | None = None
    for g in gpus:
        want = wanted.get(g.address)
        if want is None or want.scheduler is None:
            continue
        if want.mode not in ("vgpu", "mig-vgpu"):
            raise InvalidSpec(f"scheduler for {g.address}", want.scheduler.policy,
                              "none with mode " + want.mode + ": the scheduler shares a GPU between time-sliced vGPUs")
        if g.scheduler is None:
            raise InvalidSpec(f"scheduler for {g.address} ({g.product or 'GPU'})", want.scheduler.policy,
                              "none: only NVIDIA vGPU GPUs have a vGPU scheduler (and vgpuvirt could read the "
                              "host's: see vgpuvirt scheduler show)")
        settings[str(g.address)] = setting(g.address, want.scheduler)
        sched = g.sched
    if not settings or sched is None:
        return [], {}, []
    sp = plan_from_read(host, sched, settings, persist=True)
    now = {g.address: g for g in sched.gpus}
    diffs: dict[PciAddress, list[str]] = {}
    notes: list[str] = []
    steps: list[LayoutStep] = []
    pending_gpus: list[PciAddress] = []
    for c in sp.changes:
        n = now[c.gpu]
        addr = PciAddress.parse(c.gpu)
        if c.via == "none":
            if n.current != c.after:
                notes.append(f"{c.gpu}: scheduler {c.after.describe()} {PENDING} (running: "
                             f"{n.current.describe() if n.current else 'unknown'})")
            continue
        if c.via == "registry":
            pending_gpus.append(PciAddress.parse(c.gpu))
            diffs.setdefault(addr, []).append(f"scheduler {n.pending.describe()} -> {c.after.describe()} ({PENDING})")
        elif n.current != c.after:
            was = n.current.describe() if n.current else "unknown"
            diffs.setdefault(addr, []).append(f"scheduler {was} -> {c.after.describe()}")
        else:
            diffs.setdefault(addr, []).append(f"scheduler {c.after.describe()} kept at the next driver load")
    for op in sp.ops:
        if op.op == "replace_file":
            first = PciAddress.parse(sorted(settings)[0])
            steps.append(LayoutStep(first, WriteSchedulerFile(host, "", str(op.value), sp.file_before,
                                                              tuple(pending_gpus))))
    for c in sp.changes:
        n = now[c.gpu]
        if c.via == "nvml" and n.current != c.after:
            addr = PciAddress.parse(c.gpu)
            steps.append(LayoutStep(addr, SetSchedulerNvml(host, "", addr, c.after, n.current)))
    return steps, diffs, notes
