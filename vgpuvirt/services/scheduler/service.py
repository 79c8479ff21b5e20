"""The time-sliced vGPU scheduler of NVIDIA GPUs: read (current and pending), plan, apply.

Reading is ONE round trip per host whatever the number of GPUs: a batch of read-only NVML calls (one per GPU,
``nvmlDeviceGetVgpuSchedulerState`` and its capabilities) with the modprobe.d files and the nvidia module's
loaded registry parameters (``/proc/driver/nvidia/params``) read after it. Where the driver has the NVML
scheduler calls, ``set`` changes the state at once (and, with ``persist``, also writes the registry key so that
the next driver load keeps it); where it does not, ``set`` writes the driver's registry key RmPVMRL into
vgpuvirt's own file in /etc/modprobe.d, which takes effect at the next load of the nvidia module: the change is
"pending", and :func:`read_schedulers` reports both the current and the pending setting. Writing is the change
engine's (:func:`vgpuvirt.change.scheduler.apply_schedulers`: one batch, and when its NVML part fails the runner
puts the file back and sets the GPUs already changed back).

:func:`plan_schedulers` (here) and ``apply_schedulers`` (change/) are the entry points other parts call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import DeviceError, DeviceNotFound, InvalidSpec
from vgpuvirt.host.base import Host, Op, OpResult, Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mutation import Explain, Planned
from vgpuvirt.services.scheduler.model import (
    MODPROBE_FILE,
    PROC_PARAMS,
    SchedulerSetting,
    effective,
    loaded_params,
    modprobe_options,
    registry_values,
    render_modprobe,
)

__all__ = ["READ_GLOBS", "GpuScheduler", "SchedulerChange", "SchedulerPlan", "SchedulerRead",
           "file_item", "nvidia_gpus", "nvml_item", "parse_read", "plan_from_read", "plan_schedulers", "read_ops",
           "read_schedulers"]

_PCI = "/sys/bus/pci/devices"
NVML_NOT_SUPPORTED, NVML_NOT_FOUND = 3, 6


class SchedulerError(DeviceError):
    """A scheduler change refused or failed on one GPU (nothing of it is left half-done)."""


@dataclass(frozen=True)
class GpuScheduler:
    address: str
    current: SchedulerSetting | None     # None: neither NVML nor the loaded module parameters tell it
    current_source: str                  # "nvml" or "module parameters"
    pending: SchedulerSetting            # what the next load of the nvidia module applies
    nvml: bool                           # whether the driver has the NVML scheduler calls for this GPU
    nvml_error: str | None = None
    nvml_code: int | None = None         # NVML's return code when it failed (3: NOT_SUPPORTED for this GPU)
    capabilities: Mapping[str, Any] | None = None
    log_entries: int | None = None       # nvmlDeviceGetVgpuSchedulerLog's entry count (runlist switches logged)

    @property
    def vgpu_capable(self) -> bool:
        """False when NVML answers NOT_SUPPORTED: the driver has the calls, this GPU (or driver) has no vGPU."""
        return self.nvml_code != NVML_NOT_SUPPORTED

    @property
    def differs(self) -> bool:
        """A change is waiting for the next driver load."""
        return self.current is not None and self.current != self.pending

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.address, "current": self.current.to_dict() if self.current else None,
                "current_source": self.current_source, "pending": self.pending.to_dict(),
                "pending_differs": self.differs, "nvml": self.nvml, "nvml_error": self.nvml_error,
                "vgpu_capable": self.vgpu_capable,
                "capabilities": dict(self.capabilities) if self.capabilities else None,
                "log_entries": self.log_entries}


@dataclass
class SchedulerRead:
    gpus: list[GpuScheduler]
    files: dict[str, str]
    ours: dict[str, int]                 # GPU -> RmPVMRL in vgpuvirt's own file
    foreign: list[str] = field(default_factory=list)   # other files setting the per-device key


def nvidia_gpus(host: Host) -> list[str]:
    """The NVIDIA display-class physical functions of a host (one read)."""
    snap = host.read([f"{_PCI}/*/vendor", f"{_PCI}/*/class", f"{_PCI}/*/physfn"])
    out = []
    for path in snap.glob(f"{_PCI}/*/vendor"):
        base = path.rsplit("/", 1)[0]
        cls = snap.int(f"{base}/class") or 0
        if snap.text(path) == "0x10de" and cls >> 16 == 0x03 and not snap.has(f"{base}/physfn"):
            out.append(base.rsplit("/", 1)[1])
    return sorted(out)


def _bus_id(addr: str) -> str:
    return PciAddress.parse(addr).nvml_bus_id


#: what a scheduler read takes from the host after its NVML calls (a layout's read adds these to its own)
READ_GLOBS = ("/etc/modprobe.d/*", PROC_PARAMS)


def read_ops(gpus: Sequence[str] | None) -> list[Op]:
    """The read-only NVML calls of a scheduler read: one per GPU, or ``None``: one call for every GPU NVML sees
    (for a caller that learns the GPUs from the same round trip)."""
    if gpus is None:
        return [Op.nvml("vgpu_scheduler_get", ["all"], read_only=True)]
    return [Op.nvml("vgpu_scheduler_get", [_bus_id(str(PciAddress.parse(g)))], read_only=True) for g in gpus]


def _answers(addrs: Sequence[str], results: Sequence[OpResult]) -> list[tuple[Any, str | None, int | None]]:
    """(NVML state or None, error, rc) per GPU, from per-GPU calls or from one ``all`` call."""
    if len(results) == len(addrs) and not (len(results) == 1 and (results[0].op.argv or ())[:1] == ("all",)):
        return [(json.loads(r.stdout or "{}"), None, None) if r.ok else (None, r.error, r.rc) for r in results]
    one = results[0]
    if not one.ok:                                   # no NVML, or no scheduler calls: the same for every GPU
        return [(None, one.error, one.rc) for _ in addrs]
    seen = {str(PciAddress.from_nvml(e["gpu"])): e for e in json.loads(one.stdout or "[]")}
    out: list[tuple[Any, str | None, int | None]] = []
    for a in addrs:
        e = seen.get(a)
        if e is None:
            out.append((None, "NVML does not see this GPU (not bound to nvidia)", NVML_NOT_FOUND))
        else:
            out.append((e["state"], None, None) if e.get("ok") else (None, e.get("error"), e.get("rc")))
    return out


def parse_read(host: str, gpus: Sequence[str], results: Sequence[OpResult], snap: Snapshot) -> SchedulerRead:
    """A scheduler read from the answers of :func:`read_ops` and a snapshot holding :data:`READ_GLOBS`."""
    addrs = [str(PciAddress.parse(g)) for g in gpus]
    for a in addrs:
        if snap.has(f"{_PCI}/{a}/vendor") and snap.text(f"{_PCI}/{a}/vendor") != "0x10de":
            raise DeviceNotFound(host, a, "no NVIDIA GPU at this address")
    files = {p: e.text for p, e in snap.items() if p.startswith("/etc/modprobe.d/") and e.text is not None
             and p.endswith(".conf")}
    options = modprobe_options(files)
    ours = registry_values(None, options.get(MODPROBE_FILE, {}).get("NVreg_RegistryDwordsPerDevice"))
    glob_, per_device, foreign = "", {}, []
    for path, opts in options.items():
        glob_ = opts.get("NVreg_RegistryDwords", glob_)
        if "NVreg_RegistryDwordsPerDevice" in opts:
            per_device.update(registry_values(None, opts["NVreg_RegistryDwordsPerDevice"]))
            if path != MODPROBE_FILE:
                foreign.append(path)
    pending_values = {**registry_values(glob_, None), **per_device}
    params = loaded_params(snap.text(PROC_PARAMS))
    loaded = registry_values(params.get("RegistryDwords"), params.get("RegistryDwordsPerDevice")) if params else {}
    params_known = params is not None and "RegistryDwords" in params
    out = []
    for a, (state, err, rc) in zip(addrs, _answers(addrs, results), strict=True):
        if state is not None:
            current: SchedulerSetting | None = SchedulerSetting.from_nvml(state)
            source, caps, log = "nvml", state.get("capabilities"), state.get("log_entries")
        else:
            current = effective(loaded, a) if params_known else None
            source, caps, log = "module parameters", None, None
        out.append(GpuScheduler(address=a, current=current, current_source=source,
                                pending=effective(pending_values, a), nvml=state is not None, nvml_error=err,
                                capabilities=caps, log_entries=log, nvml_code=rc))
    return SchedulerRead(out, files, ours, foreign)


def _read(host: Host, gpus: Sequence[str]) -> SchedulerRead:
    addrs = [str(PciAddress.parse(g)) for g in gpus]
    batch = host.apply(read_ops(addrs), lock=False, on_error="continue",
                       reads_after=[*READ_GLOBS, *(f"{_PCI}/{a}/vendor" for a in addrs)])
    for a in addrs:
        if batch.after.text(f"{_PCI}/{a}/vendor") != "0x10de":
            raise DeviceNotFound(host.name, a, "no NVIDIA GPU at this address")
    return parse_read(host.name, addrs, list(batch.results), batch.after)


def read_schedulers(host: Host, gpus: Sequence[str] | None = None) -> list[GpuScheduler]:
    """Each GPU's scheduler: current (NVML, or the loaded module parameters) and pending (modprobe.d)."""
    return _read(host, list(gpus) if gpus is not None else nvidia_gpus(host)).gpus


@dataclass(frozen=True)
class SchedulerChange:
    gpu: str
    before: SchedulerSetting | None
    after: SchedulerSetting
    via: str                             # "nvml" (now), "registry" (pending: next driver load), "none"
    persist: bool = False

    def describe(self) -> str:
        if self.via == "none":
            return f"{self.gpu}: already {self.after.describe()}"
        when = ("now" + (" and at every driver load" if self.persist else ", until the driver reloads")
                if self.via == "nvml" else "pending: takes effect at the next load of the nvidia module")
        was = self.before.describe() if self.before else "unknown"
        return f"{self.gpu}: {was} -> {self.after.describe()} ({when})"

    @property
    def pending(self) -> bool:
        """Only the registry key carries it: it takes effect at the next load of the nvidia module."""
        return self.via == "registry"

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "before": self.before.to_dict() if self.before else None,
                "after": self.after.to_dict(), "via": self.via, "persist": self.persist,
                "pending": self.via == "registry", "description": self.describe()}


@dataclass(frozen=True)
class SchedulerPlan:
    host: str
    changes: tuple[SchedulerChange, ...]
    ops: tuple[Op, ...]
    file_before: str | None              # vgpuvirt's modprobe.d file as it was (for the undo)
    file_text: str | None = None         # what the file becomes; None: it stays as it is

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "changes": [c.to_dict() for c in self.changes]}


def plan_schedulers(host: Host, settings: Mapping[str, SchedulerSetting], *, persist: bool = False) -> SchedulerPlan:
    """What setting each GPU takes and how (one read). Refuses, changing nothing, a timeslice the GPU (or the
    registry key) cannot take, and another modprobe.d file setting the same per-device key."""
    if not settings:
        raise InvalidSpec("GPU list", [], "at least one GPU")
    wanted = {str(PciAddress.parse(g)): s for g, s in settings.items()}
    return plan_from_read(host.name, _read(host, list(wanted)), wanted, persist=persist)


def plan_from_read(host: str, r: SchedulerRead, wanted: Mapping[str, SchedulerSetting], *,
                   persist: bool = False) -> SchedulerPlan:
    """:func:`plan_schedulers` on a read already made (a layout's one read round trip carries it)."""
    missing = sorted(set(wanted) - {g.address for g in r.gpus})
    if missing:
        raise DeviceNotFound(host, missing[0], "not in the scheduler read")
    r = SchedulerRead([g for g in r.gpus if g.address in wanted], r.files, r.ours, r.foreign)
    values = dict(r.ours)
    changes, nvml_ops = [], []
    for g in r.gpus:
        want = wanted[g.address]
        if not g.vgpu_capable:
            raise SchedulerError(host, g.address, "NVML reports the vGPU scheduler not supported on this GPU "
                                 "(no vGPU host driver for it): there is no time-sliced vGPU to schedule")
        if g.nvml:
            caps = g.capabilities or {}
            ts = (want.timeslice_us or 0) * 1000
            lo, hi = caps.get("min_timeslice_ns"), caps.get("max_timeslice_ns")
            if ts and lo is not None and hi is not None and not lo <= ts <= hi:
                raise InvalidSpec("timeslice (us)", want.timeslice_us,
                                  f"{lo // 1000}..{hi // 1000} us on {host} {g.address} (its NVML capabilities)")
            if want.adaptive and caps.get("adaptive") is False:
                raise SchedulerError(host, g.address, "this GPU has no adaptive round robin scheduler")
            via = "none" if g.current == want and (not persist or g.pending == want) else "nvml"
            if via == "nvml" and g.current != want:
                n = want.to_nvml()
                nvml_ops.append(Op.nvml("vgpu_scheduler_set", [_bus_id(g.address), str(n["policy"]), str(n["arr"]),
                                                               str(n["timeslice_ns"])], read_only=False))
            if persist:
                values[g.address] = want.to_rmpvmrl()
        else:
            values[g.address] = want.to_rmpvmrl()      # validates the registry key's timeslice range
            # compared as the key encodes them: "adaptive" and the driver's default are one value there
            via = "none" if g.pending.to_rmpvmrl() == values[g.address] else "registry"
        changes.append(SchedulerChange(g.address, g.current, want, via, persist and g.nvml))
    ops: list[Op] = []
    text: str | None = None
    if values != r.ours:
        if r.foreign:
            raise SchedulerError(host, ", ".join(wanted), f"{', '.join(r.foreign)} also sets the nvidia "
                                 "module's NVreg_RegistryDwordsPerDevice: only one file can; merge it into "
                                 f"{MODPROBE_FILE} or remove it first")
        text = render_modprobe(values)
        ops.append(Op.replace_file(MODPROBE_FILE, text))
    return SchedulerPlan(host, tuple(changes), tuple(ops + nvml_ops), r.files.get(MODPROBE_FILE), text)


# -- batch items (the change engine's scheduler kinds, vgpuvirt.change.scheduler, put them in a host's batch) ------

def _explain(host: str, target: str, what: str) -> Explain:
    return lambda res: DeviceError(host, target, f"{what} failed: {res.error}")


def nvml_item(host: str, gpu: PciAddress, s: SchedulerSetting) -> Planned:
    """Set one GPU's vGPU scheduler now, through NVML."""
    n = s.to_nvml()
    op = Op.nvml("vgpu_scheduler_set", [gpu.nvml_bus_id, str(n["policy"]), str(n["arr"]), str(n["timeslice_ns"])],
                 read_only=False)
    return Planned("scheduler.set", str(gpu), (op,),
                   _explain(host, str(gpu), f"setting the vGPU scheduler to {s.describe()}"),
                   message=f"vGPU scheduler {s.describe()}")


def file_item(host: str, text: str | None) -> Planned:
    """Replace vgpuvirt's modprobe.d file (the registry key the driver reads at its next load) with ``text``;
    None: remove it (the undo of a change that created it)."""
    if text is None:
        return Planned("scheduler.registry", MODPROBE_FILE, (Op.remove_file(MODPROBE_FILE),),
                       _explain(host, MODPROBE_FILE, f"removing {MODPROBE_FILE}"), message=f"removed {MODPROBE_FILE}")
    return Planned("scheduler.registry", MODPROBE_FILE, (Op.replace_file(MODPROBE_FILE, text),),
                   _explain(host, MODPROBE_FILE, f"writing {MODPROBE_FILE}"), message=f"wrote {MODPROBE_FILE}")
