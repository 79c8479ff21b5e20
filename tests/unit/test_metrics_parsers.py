"""The metrics parsers against real formats: nvidia-smi -q -x readings (R555 and pre-R555 ECC layouts),
nvidia-smi vgpu -q, the driver's kernel-log lines; and the health rules on their results."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpuvirt.model import PciAddress
from vgpuvirt.services.metrics_model import Ecc, MemoryRepair, PcieLink
from vgpuvirt.services.nvidia.health import assess
from vgpuvirt.services.nvidia.kernel_log import parse_kernel_log, since
from vgpuvirt.services.nvidia.readings import GpuReadings, parse_readings
from vgpuvirt.services.nvidia.vgpu_query import parse_vgpu_query
from vgpuvirt.sim import SimHost

FIX = Path(__file__).resolve().parents[1] / "fixtures"
L4 = PciAddress.parse("0000:01:00.0")


def _without_comments(name: str) -> str:
    return "".join(line for line in (FIX / "hostdata" / name).read_text().splitlines(keepends=True)
                   if not line.startswith("#"))


def test_real_l4_readings_r555_layout():
    r = parse_readings((FIX / "nvidia-smi" / "readings_l4_555.xml").read_bytes())[L4]
    assert (r.name, r.uuid) == ("NVIDIA L4", "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4")
    assert (r.fb_total_mib, r.fb_used_mib) == (23034, 1)
    assert (r.sm_util_pct, r.memory_util_pct, r.encoder_util_pct, r.decoder_util_pct) == (2, 0, 0, 0)
    assert (r.temperature_c, r.power_w, r.power_limit_w) == (45, 27.22, 72)
    assert (r.sm_clock_mhz, r.memory_clock_mhz, r.graphics_clock_mhz) == (2040, 6250, 2040)
    assert r.performance_state == "P0"
    assert r.ecc == Ecc(0, 0, 0, 0)
    # Ampere+ board: pages are not retired (N/A -> None, never 0), rows are remapped.
    assert r.memory_repair == MemoryRepair(None, None, None, 0, 0, False, False)
    assert r.pcie == PcieLink(4, 4, 16, 16)
    assert assess(r).healthy


def test_r555_ecc_sums_sram_and_dram_uncorrectable():
    text = (FIX / "nvidia-smi" / "readings_l4_555.xml").read_text()
    text = text.replace("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>", 1)
    text = text.replace("<sram_uncorrectable_parity>0</sram_uncorrectable_parity>",
                        "<sram_uncorrectable_parity>1</sram_uncorrectable_parity>", 1)
    r = parse_readings(text)[L4]
    assert (r.ecc.uncorrected_volatile, r.ecc.uncorrected_aggregate) == (3, 0)
    assert assess(r).reasons == ("3 uncorrectable ECC error(s) since the driver loaded",)


def test_bare_metal_sample_has_readings_absent_not_zero():
    r = next(iter(parse_readings((FIX / "nvidia-smi" / "bare_metal_575.xml").read_bytes()).values()))
    # the trimmed sample holds no utilisation / ECC elements: every such reading is None
    assert r.sm_util_pct is None and r.ecc.uncorrected_volatile is None and r.pcie.width_current is None


def test_pre_r555_ecc_layout_from_the_simulator():
    h = SimHost.from_profile("t4x2")
    h.model.telemetry.inject_ecc("0000:3b:00.0", 4)
    out = h.run(["nvidia-smi", "-q", "-x"]).stdout
    assert "<single_bit>" in out and "<sram_correctable>" not in out
    r = parse_readings(out)[PciAddress.parse("0000:3b:00.0")]
    assert r.ecc == Ecc(0, 4, 0, 4)
    assert r.memory_repair.retired_dbe == 1 and r.memory_repair.remap_pending is None   # T4 retires pages


def test_unparseable_xml_gives_no_readings():
    assert parse_readings("<nvidia_smi_log><gpu") == {}
    assert parse_readings(None) == {}


def test_real_vgpu_query_transcript():
    (v,) = parse_vgpu_query(_without_comments("nvidia_vgpu_query.txt"))
    assert v.gpu == L4 and v.instance == 3251634190
    assert v.text("VM Name") == "win10test,debug-threads=on"
    assert v.vm_uuid is None                                # blank in the transcript: absent
    assert v.mdev_uuid == "00000000-0000-0000-0000-000000000101"
    assert v.integer("vGPU Type") == 525 and v.text("vGPU Name") == "NVIDIA RTXA6000-2Q"
    assert v.integer("FB Memory Usage/Total") == 2048 and v.integer("FB Memory Usage/Used") == 0
    assert v.num("Utilization/Gpu") == 0 and v.num("Encoder Stats/Average FPS") == 0
    assert v.integer("FBC Stats/Active Sessions") == 0 and v.text("PCI/Bus Id") == "00000000:00:00.0"
    assert v.frame_rate_limit == (None, None)               # "N/A"
    assert v.integer("GPU Instance ID") is None


@pytest.mark.parametrize(("raw", "want"), [("60 FPS", (True, 60)), ("Disabled", (False, None)), ("N/A", (None, None))])
def test_frame_rate_limit_values(raw, want):
    text = _without_comments("nvidia_vgpu_query.txt").replace("Frame Rate Limit                  : N/A",
                                                              f"Frame Rate Limit                  : {raw}")
    assert parse_vgpu_query(text)[0].frame_rate_limit == want


def test_kernel_log_xids_scheduler_and_cursor():
    log = parse_kernel_log(_without_comments("nvidia_xid_dmesg.txt"))
    assert {str(a): [x.code for x in xs] for a, xs in log.xids.items()} == {
        "0000:18:00.0": [79], "0000:b9:00.0": [74], "0000:01:00.0": [13]}
    (x79,) = log.xids[PciAddress.parse("0000:18:00.0")]
    assert x79.uptime_s == 12345.678901 and x79.message == "GPU has fallen off the bus."
    assert log.xids[PciAddress.parse("0000:b9:00.0")][0].message.startswith("NVLink: fatal error")
    s = log.schedulers[L4]
    assert (s.policy, s.enabled, s.source) == ("best-effort", False, "kernel-log")
    assert log.last_uptime_s == 13003.0
    allx = tuple(x for xs in log.xids.values() for x in xs)
    assert [x.code for x in since(allx, 13000.0)] == [74, 13]
    assert since(allx, None) == allx


def test_kernel_log_ctime_format_and_noise():
    log = parse_kernel_log("[Mon May 25 12:34:56 2026] NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off the bus.\n"
                           "garbage NVRM: Xid (PCI:zz): x\n")
    (x,) = log.xids[PciAddress.parse("0000:1a:00.0")]
    assert x.code == 79 and x.uptime_s is None and log.last_uptime_s is None


def _r(**kw) -> GpuReadings:
    return GpuReadings(address=L4, **kw)


@pytest.mark.parametrize(("readings", "xids", "reason"), [
    (None, [79], "GPU has fallen off the bus (XID 79)"),
    (None, [48], "double-bit ECC error (XID 48)"),
    (None, [63], "ECC page retirement / row remapping pending (XID 63): reset the GPU"),
    (_r(ecc=Ecc(uncorrected_volatile=1)), [], "1 uncorrectable ECC error(s) since the driver loaded"),
    (_r(memory_repair=MemoryRepair(retired_pending=True)), [],
     "retired pages pending (take effect at the next GPU reset)"),
    (_r(memory_repair=MemoryRepair(remap_pending=True)), [],
     "row remapping pending (takes effect at the next GPU reset)"),
    (_r(memory_repair=MemoryRepair(remap_failure=True)), [], "row remapping failed"),
    (_r(pcie=PcieLink(4, 4, 8, 16)), [], "PCIe link degraded: x8 of x16"),
    (_r(pcie=PcieLink(2, 4, 16, 16), performance_state="P0"), [], "PCIe link degraded: gen 2 of 4 while busy (P0)"),
])
def test_unhealthy(readings, xids, reason):
    h = assess(readings, xids)
    assert not h.healthy and h.reasons == (reason,)


@pytest.mark.parametrize(("readings", "xids", "warnings"), [
    (_r(pcie=PcieLink(1, 4, 16, 16), performance_state="P8"), [], ()),     # an idle GPU lowers its link speed
    (_r(pcie=PcieLink(None, 4, None, 16)), [], ()),                          # unknown is not degraded
    (None, [13, 31], ("XID 13 in the kernel log", "XID 31 in the kernel log")),  # application errors
    (_r(ecc=Ecc(uncorrected_volatile=0, uncorrected_aggregate=2)), [],
     ("2 uncorrectable ECC error(s) over the board's life",)),
])
def test_healthy(readings, xids, warnings):
    h = assess(readings, xids)
    assert h.healthy and h.reasons == () and h.warnings == warnings
