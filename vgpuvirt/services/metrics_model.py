"""The metrics snapshot: hosts -> GPUs -> vGPUs, frozen and typed, JSON-able both ways.

This is the contract between collection (:mod:`vgpuvirt.observe.collect`) and what shows it (``vgpuvirt
metrics``, the Prometheus exporter, ``vgpuvirt top``). Every reading is optional: ``None`` means the host could
not give it (no driver, a field the GPU does not support, an ``N/A``), never zero. Units are in the field
names: ``_mib`` (MiB), ``_pct`` (percent, 0-100), ``_c`` (degrees Celsius), ``_w`` (watts), ``_mhz``,
``_us`` (microseconds), ``_s`` (seconds). docs/observe.md lists every field with its source.

:meth:`MetricsSnapshot.to_dict` gives the JSON of ``vgpuvirt metrics --json``; :meth:`MetricsSnapshot.from_dict`
reads it back (an exporter or a test may work from a saved snapshot).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

SCHEMA_VERSION = 1

T = TypeVar("T")


@dataclass(frozen=True)
class Xid:
    """One NVIDIA XID event from the host's kernel log (``NVRM: Xid (PCI:0000:3b:00): 79, ...``)."""

    code: int
    uptime_s: float | None            # the kernel log's timestamp: seconds since the host booted
    message: str                      # the rest of the line after the code (driver's words)


@dataclass(frozen=True)
class Ecc:
    """ECC error counts: ``volatile`` since the driver loaded, ``aggregate`` over the board's life."""

    corrected_volatile: int | None = None
    uncorrected_volatile: int | None = None
    corrected_aggregate: int | None = None
    uncorrected_aggregate: int | None = None


@dataclass(frozen=True)
class MemoryRepair:
    """Retired pages (pre-Ampere) and remapped rows (Ampere and later); pending ones need a GPU reset."""

    retired_sbe: int | None = None             # pages retired for multiple single-bit errors
    retired_dbe: int | None = None             # pages retired for double-bit errors
    retired_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None


@dataclass(frozen=True)
class PcieLink:
    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None


@dataclass(frozen=True)
class Health:
    """Whether placement may use the GPU; ``reasons`` says why not (empty when healthy), ``warnings`` what
    is worth a look but does not keep vGPUs off it."""

    healthy: bool = True
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scheduler:
    """The vGPU time-slice scheduler of one GPU (NVML ``nvmlDeviceGetVgpuSchedulerState`` or the driver's
    boot message ``software scheduler ENABLED with policy EQUAL_SHARE``)."""

    policy: str | None = None          # best-effort | equal-share | fixed-share
    enabled: bool | None = None
    timeslice_us: int | None = None
    adaptive: bool | None = None       # adaptive round robin (ARR)
    source: str | None = None          # nvml | kernel-log | sim


@dataclass(frozen=True)
class TypeUse:
    """One vGPU type of the GPU, from the capacity model."""

    id: str                            # mdev type id (nvidia-231) or vGPU 17+ type number ("1155")
    name: str | None
    framebuffer_mib: int | None
    fits_now: int                      # how many more fit now
    in_use: int                        # how many of this type the GPU holds


@dataclass(frozen=True)
class VgpuMetrics:
    """One vGPU: an mdev (on the PF or a VF) or a vGPU 17+ VF, time-sliced or MIG-backed."""

    id: str                            # mdev UUID, or the VF's PCI address for vGPU 17+ VFs
    kind: str                          # mdev | vendor-vf
    parent: str | None                 # the mdev parent / the VF (PCI address)
    type_id: str | None
    type_name: str | None
    mig_backed: bool | None = None
    gpu_instance_id: int | None = None
    vm_name: str | None = None         # owning libvirt domain (joined through its XML), else the driver's
    vm_uuid: str | None = None
    vgpu_instance: int | None = None   # NVML's vGPU instance id
    fb_total_mib: int | None = None
    fb_used_mib: int | None = None
    sm_util_pct: float | None = None
    memory_util_pct: float | None = None
    encoder_util_pct: float | None = None
    decoder_util_pct: float | None = None
    encoder_sessions: int | None = None
    encoder_fps: float | None = None
    encoder_latency_us: float | None = None
    frame_rate_limit_fps: int | None = None   # the limiter's cap; None with frl_enabled False: limiter off
    frl_enabled: bool | None = None


@dataclass(frozen=True)
class GpuMetrics:
    address: str                       # PCI address of the physical GPU (PF), dddd:bb:ss.f
    name: str | None = None
    uuid: str | None = None
    mode: str | None = None            # capacity model's mode: free | whole | mdev-vgpu | vf-vgpu | mig | ...
    sizing: str | None = None          # equal | mixed (NVIDIA time-sliced)
    # the libvirt domain the whole GPU is passed through to: its readings are that VM's use
    vm_name: str | None = None
    vm_uuid: str | None = None
    fb_total_mib: int | None = None
    fb_used_mib: int | None = None        # allocated, not counting the reserved (one meaning for NVML and nvidia-smi)
    fb_reserved_mib: int | None = None    # held by the driver and firmware, reported apart
    vgpu_fb_used_mib: int | None = None   # framebuffer the capacity model counts as given to vGPUs
    types: tuple[TypeUse, ...] = ()
    sm_util_pct: float | None = None
    memory_util_pct: float | None = None
    encoder_util_pct: float | None = None
    decoder_util_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    graphics_clock_mhz: int | None = None
    performance_state: str | None = None  # P0 .. P12
    ecc: Ecc = field(default_factory=Ecc)
    memory_repair: MemoryRepair = field(default_factory=MemoryRepair)
    pcie: PcieLink = field(default_factory=PcieLink)
    xids: tuple[Xid, ...] | None = None   # new since the previous collection of this collector; None: unknown
    xids_since_boot: tuple[int, ...] | None = None   # every XID code still in the kernel log
    scheduler: Scheduler = field(default_factory=Scheduler)
    health: Health = field(default_factory=Health)
    vgpus: tuple[VgpuMetrics, ...] = ()


@dataclass(frozen=True)
class HostMetrics:
    host: str
    up: bool                           # False: the host did not answer (``error`` says why)
    collected_at: float                # Unix time the collection started
    duration_s: float | None = None
    round_trips: int | None = None
    driver_version: str | None = None
    sources: dict[str, str] = field(default_factory=dict)   # nvidia_smi / vgpu_query / kernel_log / nvml: how each went
    error: str | None = None
    warnings: tuple[str, ...] = ()
    gpus: tuple[GpuMetrics, ...] = ()


@dataclass(frozen=True)
class MetricsSnapshot:
    collected_at: float
    hosts: tuple[HostMetrics, ...] = ()
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _plain(self)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsSnapshot:
        return _build(cls, data)

    def host(self, name: str) -> HostMetrics | None:
        return next((h for h in self.hosts if h.host == name), None)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj


# from_dict: nested dataclasses by field name (the annotations are strings under postponed evaluation).
_NESTED: dict[str, type] = {"ecc": Ecc, "memory_repair": MemoryRepair, "pcie": PcieLink, "scheduler": Scheduler,
                            "health": Health}
_LISTS: dict[str, type | None] = {"types": TypeUse, "vgpus": VgpuMetrics, "xids": Xid, "gpus": GpuMetrics,
                                  "hosts": HostMetrics, "reasons": None, "warnings": None, "xids_since_boot": None}


def _build(cls: type[T], data: dict[str, Any]) -> T:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        v = data[f.name]
        if f.name in _NESTED and isinstance(v, dict):
            v = _build(_NESTED[f.name], v)
        elif f.name in _LISTS and isinstance(v, list):
            item = _LISTS[f.name]
            v = tuple(_build(item, x) if item is not None else x for x in v)
        kwargs[f.name] = v
    return cls(**kwargs)
