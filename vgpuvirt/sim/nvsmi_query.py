"""The simulated ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``, read off the simulated
``-q -x`` document of the same moment, so that both give the same facts.

Spellings are R580's (tests/fixtures/real/h100-580/query-gpu-field-by-field.csv): a header names a field with
its unit (``memory.total [MiB]``), a value carries it (``16384 MiB``, ``0 %``, ``70.00 W``, ``300 MHz``) except
temperatures and link widths (``45``, ``16``), and what the GPU does not have is ``[N/A]``. INFERRED (no real
sample yet): the message for a field the simulator does not know (exit 2), and that ``nounits`` leaves the
header's units in place.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

#: field -> (path below <gpu>, unit in the header); "@id" is the bus id attribute, "^driver_version" the root's
_FIELDS: dict[str, tuple[str, str]] = {
    "pci.bus_id": ("@id", ""), "name": ("product_name", ""), "uuid": ("uuid", ""),
    "driver_version": ("^driver_version", ""),
    "memory.total": ("fb_memory_usage/total", "MiB"), "memory.used": ("fb_memory_usage/used", "MiB"),
    "memory.reserved": ("fb_memory_usage/reserved", "MiB"), "memory.free": ("fb_memory_usage/free", "MiB"),
    "utilization.gpu": ("utilization/gpu_util", "%"), "utilization.memory": ("utilization/memory_util", "%"),
    "utilization.encoder": ("utilization/encoder_util", "%"),
    "utilization.decoder": ("utilization/decoder_util", "%"),
    "temperature.gpu": ("temperature/gpu_temp", ""), "power.draw": ("gpu_power_readings/power_draw", "W"),
    "power.limit": ("gpu_power_readings/current_power_limit", "W"),
    "clocks.current.sm": ("clocks/sm_clock", "MHz"), "clocks.current.memory": ("clocks/mem_clock", "MHz"),
    "clocks.current.graphics": ("clocks/graphics_clock", "MHz"), "pstate": ("performance_state", ""),
    "ecc.errors.corrected.volatile.total": ("ecc_errors/volatile/single_bit/total", ""),
    "ecc.errors.uncorrected.volatile.total": ("ecc_errors/volatile/double_bit/total", ""),
    "ecc.errors.corrected.aggregate.total": ("ecc_errors/aggregate/single_bit/total", ""),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_errors/aggregate/double_bit/total", ""),
    "retired_pages.sbe": ("retired_pages/multiple_single_bit_retirement/retired_count", ""),
    "retired_pages.dbe": ("retired_pages/double_bit_retirement/retired_count", ""),
    "retired_pages.pending": ("retired_pages/pending_retirement", ""),
    "remapped_rows.correctable": ("remapped_rows/remapped_row_corr", ""),
    "remapped_rows.uncorrectable": ("remapped_rows/remapped_row_unc", ""),
    "remapped_rows.pending": ("remapped_rows/remapped_row_pending", ""),
    "remapped_rows.failure": ("remapped_rows/remapped_row_failure", ""),
    "pcie.link.gen.current": ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", ""),
    "pcie.link.gen.max": ("pci/pci_gpu_link_info/pcie_gen/max_link_gen", ""),
    "pcie.link.width.current": ("pci/pci_gpu_link_info/link_widths/current_link_width", ""),
    "pcie.link.width.max": ("pci/pci_gpu_link_info/link_widths/max_link_width", ""),
    "mig.mode.current": ("mig_mode/current_mig", ""), "mig.mode.pending": ("mig_mode/pending_mig", ""),
}
_SPELLED = {"N/A": "[N/A]", "Not Supported": "[Not Supported]"}

#: ``power.draw`` is the 1 s average where the document has one (R560+ print ``average_power_draw`` and no
#: ``power_draw``; a real H100 on R580 answers power.draw with the average), the older element otherwise.
_POWER_DRAW = ("gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw",
               "gpu_power_readings/power_draw")
#: R555+ documents split ECC counts by memory (sram/dram); ``--query-gpu``'s ``.total`` is their sum (a real
#: H100 on R580: every part 0, total 0).
_ECC_PARTS = {"corrected": ("sram_correctable", "dram_correctable"),
              "uncorrected": ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "sram_uncorrectable",
                              "dram_uncorrectable")}


def _ecc_total(gpu: ET.Element, name: str) -> str | None:
    _ecc, _errors, kind, side, _total = name.split(".")
    el = gpu.find(f"ecc_errors/{side}")
    if el is None or el.find("single_bit") is not None:
        return None                                   # the pre-R555 path in _FIELDS answers
    parts = [(el.findtext(tag) or "").strip() for tag in _ECC_PARTS[kind]]
    numbers = [int(p) for p in parts if p.isdigit()]
    return str(sum(numbers)) if numbers else "N/A"


def _value(root: ET.Element, gpu: ET.Element, index: int, name: str, units: bool) -> str:
    if name == "index":
        return str(index)
    path, unit = _FIELDS[name]
    text = gpu.get("id") if path == "@id" else root.findtext(path[1:]) if path[0] == "^" else gpu.findtext(path)
    if name == "power.draw":
        text = next((v for v in (gpu.findtext(p) for p in _POWER_DRAW) if v and v.strip() != "N/A"), text)
    elif name.startswith("ecc.errors.") and name.endswith(".total"):
        text = _ecc_total(gpu, name) or text
    t = (text or "N/A").strip()
    if t in _SPELLED or not t:
        return _SPELLED.get(t, "[N/A]")
    for suffix in (" C", "x"):           # -q -x spells these units; --query-gpu prints the bare number
        if name in ("temperature.gpu", "pcie.link.width.current", "pcie.link.width.max") and t.endswith(suffix):
            t = t[: -len(suffix)].strip()
    if unit and not units and t.endswith(" " + unit):
        t = t[: -len(unit) - 1]
    return t


def query_gpu(root: ET.Element, fields: list[str], fmt: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``--query-gpu=FIELDS --format=FMT`` over an ``-q -x`` document."""
    opts = fmt.split(",")
    if not opts or opts[0] != "csv" or not set(opts[1:]) <= {"noheader", "nounits"}:
        return 2, "", f'"{fmt}" is not a valid format.\n'
    for f in fields:
        if f != "index" and f not in _FIELDS:
            return 2, "", f'Field "{f}" is not a valid field to query.\n\n'
    units = "nounits" not in opts
    out = []
    if "noheader" not in opts:
        out.append(", ".join(f + (f" [{_FIELDS[f][1]}]" if f in _FIELDS and _FIELDS[f][1] else "")
                             for f in fields))
    for i, gpu in enumerate(root.iterfind("gpu")):
        out.append(", ".join(_value(root, gpu, i, f, units) for f in fields))
    return 0, "".join(line + "\n" for line in out), ""
