"""Metrics of the machine we run on through NVML (``nvidia-ml-py``'s ``pynvml``): the same readings as
``nvidia-smi -q -x`` / ``vgpu -q`` give a remote host, straight from the library (no process started).

NVML describes only this machine, so :class:`~vgpuvirt.observe.collect.Collector` asks it for a LocalHost
reading the real ``/``. Every call is guarded: NotSupported (a bare-metal driver has no vGPU calls; a GeForce
no ECC) or any other NVML error leaves that reading None. Units follow NVML's reference: power in mW, memory
in bytes, the scheduler's time slice in ns; they are converted to the snapshot's units here. Active vGPUs are
returned as :class:`~vgpuvirt.services.nvidia.vgpu_query.ActiveVgpu` with the keys ``nvidia-smi vgpu -q`` uses, so
one join serves both paths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vgpuvirt.model import PciAddress
from vgpuvirt.services.metrics_model import Ecc, MemoryRepair, PcieLink, Scheduler
from vgpuvirt.services.nvidia.nvml import fb_memory, handle_address, nvml_text
from vgpuvirt.services.nvidia.readings import GpuReadings
from vgpuvirt.services.nvidia.vgpu_query import ActiveVgpu

T = TypeVar("T")
_MIB = 1024 * 1024
_POLICIES = {1: "best-effort", 2: "equal-share", 3: "fixed-share"}
_ARR_ENABLE = 2


@dataclass
class NvmlMetrics:
    available: bool
    readings: dict[PciAddress, GpuReadings] = field(default_factory=dict)
    vgpus: list[ActiveVgpu] = field(default_factory=list)
    schedulers: dict[PciAddress, Scheduler] = field(default_factory=dict)
    error: str | None = None


def _q(nvml: Any, fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except nvml.NVMLError:
        return None


def _call(nvml: Any, name: str, *args: Any) -> Any:
    """``nvml.<name>(*args)``, or None on an NVML error."""
    try:
        return getattr(nvml, name)(*args)
    except nvml.NVMLError:
        return None


def _readings(nvml: Any, h: Any, addr: PciAddress) -> GpuReadings:
    def q(fn: Callable[[], T]) -> T | None:
        return _q(nvml, fn)

    util = q(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
    enc = q(lambda: nvml.nvmlDeviceGetEncoderUtilization(h))
    dec = q(lambda: nvml.nvmlDeviceGetDecoderUtilization(h))
    mem = fb_memory(nvml, h)
    power = q(lambda: nvml.nvmlDeviceGetPowerUsage(h))
    limit = q(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
    pstate = q(lambda: nvml.nvmlDeviceGetPerformanceState(h))
    rows = q(lambda: nvml.nvmlDeviceGetRemappedRows(h))
    pending = q(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
    sbe = q(lambda: nvml.nvmlDeviceGetRetiredPages(h, 0))
    dbe = q(lambda: nvml.nvmlDeviceGetRetiredPages(h, 1))

    def ecc(error_type: int, counter: int) -> int | None:
        n = q(lambda: nvml.nvmlDeviceGetTotalEccErrors(h, error_type, counter))
        return int(n) if n is not None else None

    def clock(kind: int) -> int | None:
        n = q(lambda: nvml.nvmlDeviceGetClockInfo(h, kind))
        return int(n) if n is not None else None

    def link(fn: str) -> int | None:
        n = q(lambda: getattr(nvml, fn)(h))
        return int(n) if n is not None else None

    return GpuReadings(
        address=addr, name=q(lambda: nvml_text(nvml.nvmlDeviceGetName(h))),
        uuid=q(lambda: nvml_text(nvml.nvmlDeviceGetUUID(h))),
        fb_total_mib=mem.total if mem is not None else None,
        fb_used_mib=mem.used if mem is not None else None,
        fb_reserved_mib=mem.reserved if mem is not None else None,
        sm_util_pct=float(util.gpu) if util is not None else None,
        memory_util_pct=float(util.memory) if util is not None else None,
        encoder_util_pct=float(enc[0]) if enc is not None else None,
        decoder_util_pct=float(dec[0]) if dec is not None else None,
        temperature_c=q(lambda: float(nvml.nvmlDeviceGetTemperature(h, 0))),     # NVML_TEMPERATURE_GPU
        power_w=int(power) / 1000 if power is not None else None,
        power_limit_w=int(limit) / 1000 if limit is not None else None,
        graphics_clock_mhz=clock(0), sm_clock_mhz=clock(1), memory_clock_mhz=clock(2),
        performance_state=f"P{int(pstate)}" if pstate is not None and int(pstate) < 32 else None,
        ecc=Ecc(ecc(0, 0), ecc(1, 0), ecc(0, 1), ecc(1, 1)),          # (corrected|uncorrected, volatile|aggregate)
        memory_repair=MemoryRepair(
            retired_sbe=len(sbe) if sbe is not None else None, retired_dbe=len(dbe) if dbe is not None else None,
            retired_pending=bool(pending) if pending is not None else None,
            remapped_correctable=int(rows[0]) if rows else None, remapped_uncorrectable=int(rows[1]) if rows else None,
            remap_pending=bool(rows[2]) if rows else None, remap_failure=bool(rows[3]) if rows else None),
        pcie=PcieLink(link("nvmlDeviceGetCurrPcieLinkGeneration"), link("nvmlDeviceGetMaxPcieLinkGeneration"),
                      link("nvmlDeviceGetCurrPcieLinkWidth"), link("nvmlDeviceGetMaxPcieLinkWidth")),
    )


def _scheduler(nvml: Any, h: Any) -> Scheduler | None:
    s = _q(nvml, lambda: nvml.nvmlDeviceGetVgpuSchedulerState(h))
    if s is None:
        return None
    arr = int(s.arrMode) == _ARR_ENABLE
    params = s.schedulerParams.vgpuSchedDataWithARR if arr else s.schedulerParams.vgpuSchedData
    ts = int(params.timeslice)
    return Scheduler(policy=_POLICIES.get(int(s.schedulerPolicy)), enabled=None,
                     timeslice_us=ts // 1000 if ts else None, adaptive=arr, source="nvml")


def _value(v: Any) -> str | None:
    # c_nvmlValue_t: vGPU utilisation samples are unsigned ints
    u = getattr(v, "uiVal", v)
    return str(int(u)) if u is not None else None


def _vgpus(nvml: Any, h: Any, addr: PciAddress) -> list[ActiveVgpu]:
    ids = _q(nvml, lambda: [int(i) for i in nvml.nvmlDeviceGetActiveVgpus(h)]) or []
    samples = {int(s.vgpuInstance): s for s in (_q(nvml, lambda: nvml.nvmlDeviceGetVgpuUtilization(h, 0)) or [])}
    out: list[ActiveVgpu] = []
    for i in ids:
        vm = _call(nvml, "nvmlVgpuInstanceGetVmID", i)
        fb = _call(nvml, "nvmlVgpuInstanceGetFbUsage", i)
        frl = _call(nvml, "nvmlVgpuInstanceGetFrameRateLimit", i)
        stats = _call(nvml, "nvmlVgpuInstanceGetEncoderStats", i)
        gi = _call(nvml, "nvmlVgpuInstanceGetGpuInstanceId", i)
        mdev = _call(nvml, "nvmlVgpuInstanceGetMdevUUID", i)
        vtype = _call(nvml, "nvmlVgpuInstanceGetType", i)
        s = samples.get(i)
        fields: dict[str, str | None] = {
            "VM UUID": nvml_text(vm[0]) if vm and int(vm[1]) == 1 else None,       # NVML_VGPU_VM_ID_UUID
            "MDEV UUID": nvml_text(mdev) or None if mdev is not None else None,
            "vGPU Type": str(int(vtype)) if vtype is not None else None,
            "GPU Instance ID": str(gi) if gi is not None and int(gi) < 0xFFFFFFFF else None,
            "Frame Rate Limit": f"{int(frl)} FPS" if frl else None,
            "FB Memory Usage/Used": f"{int(fb) // _MIB} MiB" if fb is not None else None,
            "Utilization/Gpu": _value(s.smUtil) if s is not None else None,
            "Utilization/Memory": _value(s.memUtil) if s is not None else None,
            "Utilization/Encoder": _value(s.encUtil) if s is not None else None,
            "Utilization/Decoder": _value(s.decUtil) if s is not None else None,
            "Encoder Stats/Active Sessions": str(int(stats[0])) if stats else None,
            "Encoder Stats/Average FPS": str(int(stats[1])) if stats else None,
            "Encoder Stats/Average Latency": str(int(stats[2])) if stats else None,
        }
        out.append(ActiveVgpu(addr, i, fields))
    return out


def collect_nvml(nvml: Any) -> NvmlMetrics:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return NvmlMetrics(available=False, error=str(exc))   # no driver / no libnvidia-ml: normal
    try:
        count = _q(nvml, lambda: int(nvml.nvmlDeviceGetCount()))
        if count is None:
            return NvmlMetrics(available=False, error="nvmlDeviceGetCount failed")
        out = NvmlMetrics(available=True)
        for n in range(count):
            h = _call(nvml, "nvmlDeviceGetHandleByIndex", n)
            addr = _q(nvml, lambda: handle_address(nvml, h)) if h is not None else None  # noqa: B023 (called at once)
            if addr is None:
                continue
            out.readings[addr] = _readings(nvml, h, addr)
            out.vgpus.extend(_vgpus(nvml, h, addr))
            sched = _scheduler(nvml, h)
            if sched is not None:
                out.schedulers[addr] = sched
        return out
    finally:
        _q(nvml, lambda: nvml.nvmlShutdown())
