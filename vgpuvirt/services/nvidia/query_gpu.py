"""``nvidia-smi --query-gpu=... --format=csv``: the cheap NVIDIA read (pure; never raises on odd input).

On a real H100 (driver 580) ``nvidia-smi -q -x`` costs 108 ms a call and cannot be narrowed (``-d`` is refused
with ``-x``), while ``--query-gpu`` with these fields costs ~25 ms. It gives every reading a metrics collection
takes (utilisation, temperature, power, clocks, framebuffer, ECC, retired pages / remapped rows, PCIe link)
and the identity of each GPU (name, UUID, bus id, MIG mode current/pending, driver version); it does NOT give
the virtualization mode, the host vGPU mode, the heterogeneous (mixed-size) mode, brand or architecture: those
still come from ``-q -x`` (docs/observe.md, "Which fact comes from where").

Spellings are R580's (tests/fixtures/real/h100-580/query-gpu-field-by-field.csv): the header names a field's
unit (``memory.total [MiB]``), values carry it (``81559 MiB``, ``0 %``, ``71.58 W``, ``345 MHz``; a
temperature and a link width do not), and a value the GPU does not have is ``[N/A]`` (also ``[Not
Supported]``, ``[Unknown Error]``, ``[Requested functionality has been deprecated]``): None, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.services.metrics_model import Ecc, MemoryRepair, PcieLink
from vgpuvirt.services.nvidia.readings import GpuReadings, integer, number, yes_no

__all__ = ["QUERY_GPU_ARGV", "QUERY_GPU_FIELDS", "QueryGpuReport", "parse_query_gpu"]

#: The fields asked, in this order (each exists on R535-R580 drivers; the readings of :class:`GpuReadings`).
QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index", "pci.bus_id", "name", "uuid", "driver_version", "memory.total", "memory.used", "memory.reserved",
    "utilization.gpu", "utilization.memory", "utilization.encoder", "utilization.decoder", "temperature.gpu",
    "power.draw", "power.limit", "clocks.current.sm", "clocks.current.memory", "clocks.current.graphics", "pstate",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.sbe", "retired_pages.dbe", "retired_pages.pending",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "mig.mode.current", "mig.mode.pending",
)
QUERY_GPU_ARGV: tuple[str, ...] = ("nvidia-smi", "--query-gpu=" + ",".join(QUERY_GPU_FIELDS), "--format=csv")


@dataclass(frozen=True)
class QueryGpuReport:
    driver_version: str | None = None
    readings: dict[PciAddress, GpuReadings] = field(default_factory=dict)
    #: MIG mode (current, pending) per GPU: "Enabled", "Disabled" or None ([N/A]: no MIG on this board)
    mig_mode: dict[PciAddress, tuple[str | None, str | None]] = field(default_factory=dict)
    error: str | None = None


def _value(text: str) -> str | None:
    t = text.strip()
    if not t or (t.startswith("[") and t.endswith("]")) or t in ("N/A", "Not Supported"):
        return None
    return t


def _columns(header: str) -> list[str]:
    """``memory.total [MiB]`` -> ``memory.total``."""
    return [c.strip().split(" [", 1)[0] for c in header.split(",")]


def parse_query_gpu(text: str | None) -> QueryGpuReport:
    """One report from the CSV (with its header) of :data:`QUERY_GPU_ARGV`."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return QueryGpuReport(error="no output")
    columns = _columns(lines[0])
    if columns != list(QUERY_GPU_FIELDS):
        return QueryGpuReport(error=f"unexpected header: {lines[0][:120]!r}")
    readings: dict[PciAddress, GpuReadings] = {}
    mig: dict[PciAddress, tuple[str | None, str | None]] = {}
    driver = None
    for line in lines[1:]:
        cells = line.split(", ")
        if len(cells) != len(columns):
            return QueryGpuReport(error=f"a row with {len(cells)} values for {len(columns)} fields")
        v = {k: _value(c) for k, c in zip(columns, cells, strict=True)}
        try:
            address = PciAddress.from_nvml(v["pci.bus_id"] or "")
        except InvalidSpec:
            continue
        driver = driver or v["driver_version"]
        readings[address] = GpuReadings(
            address=address, name=v["name"], uuid=v["uuid"],
            fb_total_mib=integer(v["memory.total"]), fb_used_mib=integer(v["memory.used"]),
            fb_reserved_mib=integer(v["memory.reserved"]),
            sm_util_pct=number(v["utilization.gpu"]), memory_util_pct=number(v["utilization.memory"]),
            encoder_util_pct=number(v["utilization.encoder"]), decoder_util_pct=number(v["utilization.decoder"]),
            temperature_c=number(v["temperature.gpu"]), power_w=number(v["power.draw"]),
            power_limit_w=number(v["power.limit"]), sm_clock_mhz=integer(v["clocks.current.sm"]),
            memory_clock_mhz=integer(v["clocks.current.memory"]),
            graphics_clock_mhz=integer(v["clocks.current.graphics"]), performance_state=v["pstate"],
            ecc=Ecc(integer(v["ecc.errors.corrected.volatile.total"]),
                    integer(v["ecc.errors.uncorrected.volatile.total"]),
                    integer(v["ecc.errors.corrected.aggregate.total"]),
                    integer(v["ecc.errors.uncorrected.aggregate.total"])),
            memory_repair=MemoryRepair(
                retired_sbe=integer(v["retired_pages.sbe"]), retired_dbe=integer(v["retired_pages.dbe"]),
                retired_pending=yes_no(v["retired_pages.pending"]),
                remapped_correctable=integer(v["remapped_rows.correctable"]),
                remapped_uncorrectable=integer(v["remapped_rows.uncorrectable"]),
                remap_pending=yes_no(v["remapped_rows.pending"]), remap_failure=yes_no(v["remapped_rows.failure"])),
            pcie=PcieLink(gen_current=integer(v["pcie.link.gen.current"]), gen_max=integer(v["pcie.link.gen.max"]),
                          width_current=integer(v["pcie.link.width.current"]),
                          width_max=integer(v["pcie.link.width.max"])))
        mig[address] = (v["mig.mode.current"], v["mig.mode.pending"])
    return QueryGpuReport(driver, readings, mig)
