"""A layout's vGPU scheduler policies as steps (pure): the scheduler service's plan, on the layout's own read.

The layout's read already carries every GPU's scheduler (:func:`vgpuvirt.layout.verbs.read_gpus`); here
:func:`~vgpuvirt.services.vgpu_scheduler.plan_from_read` decides, per GPU whose entry names a policy, how
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

from vgpuvirt.errors import DeviceError, InvalidSpec
from vgpuvirt.host.base import Op
from vgpuvirt.layout.model import GpuLayout, Scheduler
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mutation import Explain, Planned
from vgpuvirt.services.scheduler_model import MODPROBE_FILE, SchedulerSetting, parse_setting
from vgpuvirt.services.vgpu_scheduler import SchedulerRead, plan_from_read

#: (gpu, order, text, item, undo, pending until the driver reloads)
Step = tuple[PciAddress, int, str, Planned, Planned | None, bool]
FILE_ORDER, NVML_ORDER = 80, 81
PENDING = "pending until the driver reloads"


def setting(gpu: PciAddress, want: Scheduler) -> SchedulerSetting:
    if want.average_factor is not None:
        raise InvalidSpec(f"scheduler average-factor for {gpu}", want.average_factor,
                          "none: vgpuvirt does not set the adaptive scheduler's average factor; leave it out")
    return parse_setting(want.policy, want.timeslice_ms * 1000 if want.timeslice_ms else None)


def _explain(host: str, target: str, what: str) -> Explain:
    return lambda res: DeviceError(host, target, f"{what} failed: {res.error}")


def _nvml_item(host: str, gpu: str, s: SchedulerSetting) -> Planned:
    n = s.to_nvml()
    op = Op.nvml("vgpu_scheduler_set", [PciAddress.parse(gpu).nvml_bus_id, str(n["policy"]), str(n["arr"]),
                                        str(n["timeslice_ns"])], read_only=False)
    return Planned("scheduler.set", gpu, (op,), _explain(host, gpu, f"setting the vGPU scheduler to {s.describe()}"),
                   message=f"vGPU scheduler {s.describe()}")


def _file_item(host: str, text: str) -> Planned:
    return Planned("scheduler.registry", MODPROBE_FILE, (Op.replace_file(MODPROBE_FILE, text),),
                   _explain(host, MODPROBE_FILE, f"writing {MODPROBE_FILE}"), message=f"wrote {MODPROBE_FILE}")


def plan(host: str, gpus: Sequence[GpuNow], wanted: Mapping[PciAddress, GpuLayout]
         ) -> tuple[list[Step], dict[PciAddress, list[str]], list[str]]:
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
    steps: list[Step] = []
    pending_gpus: list[str] = []
    for c in sp.changes:
        n = now[c.gpu]
        addr = PciAddress.parse(c.gpu)
        if c.via == "none":
            if n.current != c.after:
                notes.append(f"{c.gpu}: scheduler {c.after.describe()} {PENDING} (running: "
                             f"{n.current.describe() if n.current else 'unknown'})")
            continue
        if c.via == "registry":
            pending_gpus.append(c.gpu)
            diffs.setdefault(addr, []).append(f"scheduler {n.pending.describe()} -> {c.after.describe()} ({PENDING})")
        elif n.current != c.after:
            was = n.current.describe() if n.current else "unknown"
            diffs.setdefault(addr, []).append(f"scheduler {was} -> {c.after.describe()}")
        else:
            diffs.setdefault(addr, []).append(f"scheduler {c.after.describe()} kept at the next driver load")
    for op in sp.ops:
        if op.op == "replace_file":
            first = PciAddress.parse(sorted(settings)[0])
            text = (f"write RmPVMRL for {', '.join(pending_gpus)} to {MODPROBE_FILE} ({PENDING})" if pending_gpus
                    else f"write RmPVMRL to {MODPROBE_FILE} (the policy at every driver load)")
            steps.append((first, FILE_ORDER, text, _file_item(host, str(op.value)),
                          _file_item(host, sp.file_before or ""), bool(pending_gpus)))
    for c in sp.changes:
        n = now[c.gpu]
        if c.via == "nvml" and n.current != c.after:
            undo = _nvml_item(host, c.gpu, n.current) if n.current is not None else None
            steps.append((PciAddress.parse(c.gpu), NVML_ORDER,
                          f"set the vGPU scheduler of {c.gpu} to {c.after.describe()} (now, through NVML)",
                          _nvml_item(host, c.gpu, c.after), undo, False))
    return steps, diffs, notes
