"""A metrics snapshot as Prometheus metric families (pure: a snapshot in, families out).

Names: where dcgm-exporter has a metric of the same meaning, its name, unit and value (``DCGM_FI_DEV_GPU_UTIL``
in %, ``DCGM_FI_DEV_FB_USED`` in MiB, ``DCGM_FI_DEV_XID_ERRORS`` the last XID's code...), so that existing
dashboards work; everything else is ``vgpuvirt_*`` in base units (bytes, seconds, ratios 0..1). Every series
carries ``host``; GPU series ``gpu`` (the PCI address), ``UUID`` and ``modelName`` (dcgm-exporter's labels);
vGPU series ``vgpu``, ``type``, ``vm`` and ``vm_uuid``. A reading the host could not give is absent (no
sample), never 0. docs/observe.md lists every metric with its source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from vgpuvirt.services.metrics_model import GpuMetrics, HostMetrics, MetricsSnapshot, VgpuMetrics

MIB = 1 << 20
GPU_LABELS = ("host", "gpu", "UUID", "modelName")
VGPU_LABELS = ("host", "gpu", "vgpu", "type", "type_name", "vm", "vm_uuid")
TYPE_LABELS = ("host", "gpu", "type", "type_name")

Get = Callable[[GpuMetrics], float | int | bool | None]


@dataclass(frozen=True)
class Gauge:
    name: str
    help: str
    get: Get


def _pct(v: float | None) -> float | None:
    return None if v is None else v / 100.0


def _last_xid(g: GpuMetrics) -> int | None:
    if g.xids_since_boot is None:
        return None
    return g.xids_since_boot[-1] if g.xids_since_boot else 0    # dcgm-exporter: 0 = no XID


def _fb_free(g: GpuMetrics) -> int | None:
    # used does not count the memory the driver reserves: free is what is left of both (81079 MiB on an idle
    # H100 with 480 MiB reserved, as nvidia-smi prints it)
    if g.fb_total_mib is None or g.fb_used_mib is None:
        return None
    return g.fb_total_mib - g.fb_used_mib - (g.fb_reserved_mib or 0)


#: per GPU, dcgm-exporter's names (same meaning, same unit)
DCGM: tuple[Gauge, ...] = (
    Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.sm_util_pct),
    Gauge("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.memory_util_pct),
    Gauge("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", lambda g: g.encoder_util_pct),
    Gauge("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", lambda g: g.decoder_util_pct),
    Gauge("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda g: g.fb_total_mib),
    Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.fb_used_mib),
    Gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    Gauge("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda g: g.fb_reserved_mib),
    Gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    Gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    Gauge("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda g: g.power_limit_w),
    Gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    Gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.memory_clock_mhz),
    Gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none in the kernel log).",
          _last_xid),
    Gauge("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit volatile ECC errors.", lambda g: g.ecc.corrected_volatile),
    Gauge("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors.", lambda g: g.ecc.uncorrected_volatile),
    Gauge("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Single-bit aggregate ECC errors.", lambda g: g.ecc.corrected_aggregate),
    Gauge("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Double-bit aggregate ECC errors.",
          lambda g: g.ecc.uncorrected_aggregate),
    Gauge("DCGM_FI_DEV_RETIRED_SBE", "Pages retired for single-bit errors.", lambda g: g.memory_repair.retired_sbe),
    Gauge("DCGM_FI_DEV_RETIRED_DBE", "Pages retired for double-bit errors.", lambda g: g.memory_repair.retired_dbe),
    Gauge("DCGM_FI_DEV_RETIRED_PENDING", "Page retirement pending (1: a reset is needed).",
          lambda g: g.memory_repair.retired_pending),
    Gauge("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Rows remapped for correctable errors.",
          lambda g: g.memory_repair.remapped_correctable),
    Gauge("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Rows remapped for uncorrectable errors.",
          lambda g: g.memory_repair.remapped_uncorrectable),
    Gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Row remapping failed (1).", lambda g: g.memory_repair.remap_failure),
    Gauge("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation (current).", lambda g: g.pcie.gen_current),
    Gauge("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (current lanes).", lambda g: g.pcie.width_current),
    Gauge("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "PCIe link generation (maximum).", lambda g: g.pcie.gen_max),
    Gauge("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "PCIe link width (maximum lanes).", lambda g: g.pcie.width_max),
)

#: per GPU, vgpuvirt's own
OWN: tuple[Gauge, ...] = (
    Gauge("vgpuvirt_gpu_healthy", "1 when placement may use the GPU, 0 when it skips it "
          "(see vgpuvirt_gpu_health_reason).", lambda g: g.health.healthy),
    Gauge("vgpuvirt_gpu_vgpus", "vGPUs on the GPU.", lambda g: len(g.vgpus)),
    Gauge("vgpuvirt_gpu_vgpu_framebuffer_bytes", "Framebuffer the capacity model counts as given to vGPUs.",
          lambda g: None if g.vgpu_fb_used_mib is None else g.vgpu_fb_used_mib * MIB),
    Gauge("vgpuvirt_gpu_scheduler_timeslice_seconds", "The vGPU scheduler's time slice.",
          lambda g: None if g.scheduler.timeslice_us is None else g.scheduler.timeslice_us / 1e6),
)

VgpuGet = Callable[[VgpuMetrics], float | int | bool | None]

#: per vGPU
VGPU: tuple[tuple[str, str, VgpuGet], ...] = (
    ("vgpuvirt_vgpu_framebuffer_used_bytes", "Framebuffer the vGPU's guest uses.",
     lambda v: None if v.fb_used_mib is None else v.fb_used_mib * MIB),
    ("vgpuvirt_vgpu_framebuffer_total_bytes", "Framebuffer of the vGPU.",
     lambda v: None if v.fb_total_mib is None else v.fb_total_mib * MIB),
    ("vgpuvirt_vgpu_sm_utilization_ratio", "Share of the GPU's SMs the vGPU used (0..1).",
     lambda v: _pct(v.sm_util_pct)),
    ("vgpuvirt_vgpu_memory_utilization_ratio", "Memory controller use by the vGPU (0..1).",
     lambda v: _pct(v.memory_util_pct)),
    ("vgpuvirt_vgpu_encoder_utilization_ratio", "Encoder use by the vGPU (0..1).", lambda v: _pct(v.encoder_util_pct)),
    ("vgpuvirt_vgpu_decoder_utilization_ratio", "Decoder use by the vGPU (0..1).", lambda v: _pct(v.decoder_util_pct)),
    ("vgpuvirt_vgpu_encoder_sessions", "Active encoder sessions.", lambda v: v.encoder_sessions),
    ("vgpuvirt_vgpu_encoder_fps", "Average encoder frames per second.", lambda v: v.encoder_fps),
    ("vgpuvirt_vgpu_encoder_latency_seconds", "Average encoder latency.",
     lambda v: None if v.encoder_latency_us is None else v.encoder_latency_us / 1e6),
    ("vgpuvirt_vgpu_frame_rate_limit_fps", "The frame rate limiter's cap.", lambda v: v.frame_rate_limit_fps),
    ("vgpuvirt_vgpu_frame_rate_limiter_enabled", "1: the frame rate limiter is on.", lambda v: v.frl_enabled),
)

HOST_METRICS = ("vgpuvirt_host_up", "vgpuvirt_host_collection_duration_seconds", "vgpuvirt_host_round_trips",
                "vgpuvirt_host_info", "vgpuvirt_host_collection_age_seconds")
TYPE_METRICS = ("vgpuvirt_vgpu_type_fits_now", "vgpuvirt_vgpu_type_in_use", "vgpuvirt_vgpu_type_framebuffer_bytes")
INFO_METRICS = ("vgpuvirt_gpu_info", "vgpuvirt_gpu_health_reason", "vgpuvirt_gpu_scheduler_info", "vgpuvirt_vgpu_info",
                "vgpuvirt_gpu_vm_info")
XID_COUNTER = "vgpuvirt_gpu_xid_errors"       # exposed as vgpuvirt_gpu_xid_errors_total


def metric_names() -> list[str]:
    """Every metric name the exporter can emit (a dashboard may use only these)."""
    return sorted({g.name for g in DCGM + OWN} | {n for n, _, _ in VGPU} | set(HOST_METRICS) | set(TYPE_METRICS)
                  | set(INFO_METRICS) | {XID_COUNTER + "_total"})


def _num(v: float | int | bool | None) -> float | None:
    return None if v is None else float(v)


def _s(v: object) -> str:
    return "" if v is None else str(v)


def families(snapshot: MetricsSnapshot, xid_counts: dict[tuple[str, str, int], int] | None = None) -> Iterator[Metric]:
    """The snapshot's families. ``xid_counts`` ((host, gpu, code) -> count so far) backs the XID counter: a
    caller that collects repeatedly accumulates each collection's new XIDs into it."""
    hosts = snapshot.hosts
    yield from _host_families(hosts, snapshot.collected_at)
    gpus = [(h, g) for h in hosts if h.up for g in h.gpus]
    for spec in DCGM + OWN:
        fam = GaugeMetricFamily(spec.name, spec.help, labels=GPU_LABELS)
        for h, g in gpus:
            v = _num(spec.get(g))
            if v is not None:
                fam.add_metric(_gpu_labels(h, g), v)
        yield fam
    yield from _info_families(gpus)
    yield from _type_families(gpus)
    yield from _vgpu_families(gpus)
    xids = CounterMetricFamily(XID_COUNTER, "XIDs seen in the host's kernel log since this exporter started.",
                               labels=("host", "gpu", "xid"))
    for (host, gpu, code), n in sorted((xid_counts or {}).items()):
        xids.add_metric((host, gpu, str(code)), n)
    yield xids


def _gpu_labels(h: HostMetrics, g: GpuMetrics) -> tuple[str, ...]:
    return (h.host, g.address, _s(g.uuid), _s(g.name))


def _host_families(hosts: Sequence[HostMetrics], now: float) -> Iterable[Metric]:
    up = GaugeMetricFamily("vgpuvirt_host_up", "1 when the host answered the collection served, else 0.",
                           labels=("host",))
    age = GaugeMetricFamily("vgpuvirt_host_collection_age_seconds",
                            "Seconds between the served collection's start and this scrape's (an earlier "
                            "collection stands in while the host's current one runs late).", labels=("host",))
    dur = GaugeMetricFamily("vgpuvirt_host_collection_duration_seconds", "How long the host's collection took.",
                            labels=("host",))
    rts = GaugeMetricFamily("vgpuvirt_host_round_trips", "Round trips the host's collection took.", labels=("host",))
    info = GaugeMetricFamily("vgpuvirt_host_info", "The host's driver (and why it is down).",
                             labels=("host", "driver_version", "error"))
    for h in hosts:
        up.add_metric((h.host,), 1.0 if h.up else 0.0)
        if h.duration_s is not None:
            dur.add_metric((h.host,), h.duration_s)
        if h.round_trips is not None:
            rts.add_metric((h.host,), float(h.round_trips))
        info.add_metric((h.host, _s(h.driver_version), _s(h.error)), 1.0)
        if h.up:
            age.add_metric((h.host,), max(0.0, now - h.collected_at))
    return (up, dur, rts, info, age)


def _info_families(gpus: Sequence[tuple[HostMetrics, GpuMetrics]]) -> Iterable[Metric]:
    info = GaugeMetricFamily("vgpuvirt_gpu_info", "The GPU's mode (capacity model) and sizing.",
                             labels=(*GPU_LABELS, "mode", "sizing"))
    why = GaugeMetricFamily("vgpuvirt_gpu_health_reason", "Why placement skips the GPU (one series per reason).",
                            labels=("host", "gpu", "reason"))
    sched = GaugeMetricFamily("vgpuvirt_gpu_scheduler_info", "The vGPU scheduler's policy.",
                              labels=("host", "gpu", "policy", "adaptive", "source"))
    # Per-VM use of a passed-through GPU: its DCGM_FI_DEV_* series joined on (host, gpu) to this one.
    vm = GaugeMetricFamily("vgpuvirt_gpu_vm_info", "The VM a whole GPU is passed through to (its readings are "
                           "that VM's use).", labels=("host", "gpu", "vm", "vm_uuid"))
    for h, g in gpus:
        info.add_metric((*_gpu_labels(h, g), _s(g.mode), _s(g.sizing)), 1.0)
        if g.vm_name is not None:
            vm.add_metric((h.host, g.address, g.vm_name, _s(g.vm_uuid)), 1.0)
        for r in g.health.reasons:
            why.add_metric((h.host, g.address, r), 1.0)
        s = g.scheduler
        if s.policy is not None:
            sched.add_metric((h.host, g.address, s.policy, _s(s.adaptive).lower(), _s(s.source)), 1.0)
    return (info, why, sched, vm)


def _type_families(gpus: Sequence[tuple[HostMetrics, GpuMetrics]]) -> Iterable[Metric]:
    fits = GaugeMetricFamily("vgpuvirt_vgpu_type_fits_now", "How many more vGPUs of the type fit on the GPU now.",
                             labels=TYPE_LABELS)
    used = GaugeMetricFamily("vgpuvirt_vgpu_type_in_use", "vGPUs of the type on the GPU.", labels=TYPE_LABELS)
    fb = GaugeMetricFamily("vgpuvirt_vgpu_type_framebuffer_bytes", "Framebuffer of one vGPU of the type.",
                           labels=TYPE_LABELS)
    for h, g in gpus:
        for t in g.types:
            labels = (h.host, g.address, t.id, _s(t.name))
            fits.add_metric(labels, float(t.fits_now))
            used.add_metric(labels, float(t.in_use))
            if t.framebuffer_mib is not None:
                fb.add_metric(labels, float(t.framebuffer_mib * MIB))
    return (fits, used, fb)


def _vgpu_families(gpus: Sequence[tuple[HostMetrics, GpuMetrics]]) -> Iterable[Metric]:
    rows = [(h, g, v) for h, g in gpus for v in g.vgpus]
    info = GaugeMetricFamily("vgpuvirt_vgpu_info", "One vGPU, its kind and the VM that owns it.",
                             labels=(*VGPU_LABELS, "kind", "mig_backed"))
    for h, g, v in rows:
        info.add_metric((*_vgpu_labels(h, g, v), v.kind, _s(v.mig_backed).lower()), 1.0)
    out: list[Metric] = [info]
    for name, doc, get in VGPU:
        fam = GaugeMetricFamily(name, doc, labels=VGPU_LABELS)
        for h, g, v in rows:
            val = _num(get(v))
            if val is not None:
                fam.add_metric(_vgpu_labels(h, g, v), val)
        out.append(fam)
    return out


def _vgpu_labels(h: HostMetrics, g: GpuMetrics, v: VgpuMetrics) -> tuple[str, ...]:
    return (h.host, g.address, v.id, _s(v.type_id), _s(v.type_name), _s(v.vm_name), _s(v.vm_uuid))
