"""The readings of ``nvidia-smi -q -x`` per GPU (pure; never raises on odd input): utilisation, temperature,
power, clocks, ECC, retired pages, remapped rows, PCIe link.

Element names are the driver's (nvsmi_device_v12.dtd as printed by drivers 535-580; the fixtures in
tests/fixtures/nvidia-smi are real or cut from real output). Two ECC layouts exist: drivers before R555
print ``<volatile><single_bit><total>`` / ``<double_bit><total>``, R555 and later split SRAM and DRAM
(``<sram_correctable>``, ``<sram_uncorrectable_parity>``, ``<sram_uncorrectable_secded>``,
``<dram_correctable>``, ``<dram_uncorrectable>``); both are summed into corrected / uncorrected. ``N/A`` and
friends are None, never 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.services.metrics_model import Ecc, MemoryRepair, PcieLink
from vgpuvirt.services.nvidia.smi import clean, parse_root

_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:%|C|W|MHz|MiB|x|KB/s)?$")


@dataclass(frozen=True)
class GpuReadings:
    address: PciAddress
    name: str | None = None
    uuid: str | None = None
    fb_total_mib: int | None = None
    fb_used_mib: int | None = None        # allocated, NOT counting fb_reserved_mib (nvidia-smi's and NVML v2's)
    fb_reserved_mib: int | None = None    # held by the driver and firmware (480 MiB on an idle H100, R580)
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
    performance_state: str | None = None
    ecc: Ecc = field(default_factory=Ecc)
    memory_repair: MemoryRepair = field(default_factory=MemoryRepair)
    pcie: PcieLink = field(default_factory=PcieLink)


def number(text: str | None) -> float | None:
    """``"45 C"``, ``"27.22 W"``, ``"16x"``, ``"2 %"`` -> the number; N/A or anything else -> None."""
    t = clean(text)
    if t is None:
        return None
    m = _NUMBER.match(t)
    return float(m[1]) if m else None


def integer(text: str | None) -> int | None:
    n = number(text)
    return int(n) if n is not None else None


def yes_no(text: str | None) -> bool | None:
    t = (clean(text) or "").lower()
    return True if t == "yes" else False if t == "no" else None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc_side(g: Any, side: str) -> tuple[int | None, int | None]:
    el = g.find(f"ecc_errors/{side}")
    if el is None:
        return None, None

    def t(path: str) -> int | None:
        return integer(el.findtext(path))

    if el.find("single_bit") is not None or el.find("double_bit") is not None:   # before R555
        return t("single_bit/total"), t("double_bit/total")
    corr = _sum([t("sram_correctable"), t("dram_correctable")])
    unc = _sum([t("sram_uncorrectable_parity"), t("sram_uncorrectable_secded"), t("sram_uncorrectable"),
                t("dram_uncorrectable")])
    return corr, unc


#: Where the board's power draw is, newest driver first. R560+ print no ``power_draw``: ``average_power_draw``
#: (what ``--query-gpu=power.draw`` and NVML's power usage report on Ampere and newer: a 1 s average; a real
#: H100 on R580, tests/fixtures/real/h100-580) and ``instant_power_draw`` (the only one on GA100 and older,
#: where the average is N/A). R535-R555 print ``gpu_power_readings/power_draw``, older ``power_readings``.
_POWER_DRAW_PATHS = ("gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw",
                     "gpu_power_readings/power_draw", "power_readings/power_draw")


def _power_draw(t: Any) -> float | None:
    for path in _POWER_DRAW_PATHS:
        value = number(t(path))
        if value is not None:
            return value
    return None


def _gpu(g: Any, address: PciAddress) -> GpuReadings:
    def t(path: str) -> str | None:
        v = g.findtext(path)
        return str(v) if v is not None else None

    cv, uv = _ecc_side(g, "volatile")
    ca, ua = _ecc_side(g, "aggregate")
    limit = number(t("gpu_power_readings/current_power_limit")) or number(t("power_readings/power_limit"))
    power = _power_draw(t)
    link = "pci/pci_gpu_link_info"
    return GpuReadings(
        address=address, name=clean(t("product_name")), uuid=clean(t("uuid")),
        fb_total_mib=integer(t("fb_memory_usage/total")), fb_used_mib=integer(t("fb_memory_usage/used")),
        fb_reserved_mib=integer(t("fb_memory_usage/reserved")),
        sm_util_pct=number(t("utilization/gpu_util")), memory_util_pct=number(t("utilization/memory_util")),
        encoder_util_pct=number(t("utilization/encoder_util")),
        decoder_util_pct=number(t("utilization/decoder_util")),
        temperature_c=number(t("temperature/gpu_temp")), power_w=power, power_limit_w=limit,
        sm_clock_mhz=integer(t("clocks/sm_clock")), memory_clock_mhz=integer(t("clocks/mem_clock")),
        graphics_clock_mhz=integer(t("clocks/graphics_clock")),
        performance_state=clean(t("performance_state")),
        ecc=Ecc(cv, uv, ca, ua),
        memory_repair=MemoryRepair(
            retired_sbe=integer(t("retired_pages/multiple_single_bit_retirement/retired_count")),
            retired_dbe=integer(t("retired_pages/double_bit_retirement/retired_count")),
            retired_pending=yes_no(t("retired_pages/pending_retirement")),
            remapped_correctable=integer(t("remapped_rows/remapped_row_corr")),
            remapped_uncorrectable=integer(t("remapped_rows/remapped_row_unc")),
            remap_pending=yes_no(t("remapped_rows/remapped_row_pending")),
            remap_failure=yes_no(t("remapped_rows/remapped_row_failure"))),
        pcie=PcieLink(gen_current=integer(t(f"{link}/pcie_gen/current_link_gen")),
                      gen_max=integer(t(f"{link}/pcie_gen/max_link_gen")),
                      width_current=integer(t(f"{link}/link_widths/current_link_width")),
                      width_max=integer(t(f"{link}/link_widths/max_link_width"))),
    )


def parse_readings(text: str | bytes | None) -> dict[PciAddress, GpuReadings]:
    """Every ``<gpu>`` of an ``nvidia-smi -q -x`` document by PCI address; {} for an unreadable one."""
    root, _ = parse_root(text)
    return readings_of(root) if root is not None else {}


def readings_of(root: Any) -> dict[PciAddress, GpuReadings]:
    """The readings of a parsed ``-q -x`` document (:func:`~vgpuvirt.services.nvidia.smi.parse_root`)."""
    out: dict[PciAddress, GpuReadings] = {}
    for g in root.iterfind("gpu"):
        bus_id = g.get("id") or g.findtext("pci/pci_bus_id")
        try:
            address = PciAddress.from_nvml(bus_id) if bus_id else None
        except InvalidSpec:
            address = None
        if address is not None:
            out[address] = _gpu(g, address)
    return out
