"""The local NVML path (pynvml) against a stand-in with pynvml's surface (no GPU here): units converted
(mW -> W, bytes -> MiB, ns -> us), NotSupported readings None, vGPUs joined like nvidia-smi's, NVML winning
over nvidia-smi GPU by GPU."""

from __future__ import annotations

import types
from typing import Any

import pytest

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Op
from vgpuvirt.observe.build import build_host_metrics
from vgpuvirt.observe.collect import Collector
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS, build_inventory
from vgpuvirt.services.nvidia.nvml_readings import collect_nvml
from vgpuvirt.sim import SimHost

NOT_SUPPORTED = 3
MDEV = "0d15ea5e-0000-4000-8000-000000000001"


def fake_pynvml(*, ecc: bool = True) -> Any:
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    m.NVMLError = NVMLError
    ns = types.SimpleNamespace

    def unsupported(*_: Any) -> Any:
        raise NVMLError(NOT_SUPPORTED)

    sample = ns(vgpuInstance=7, smUtil=ns(uiVal=41), memUtil=ns(uiVal=12), encUtil=ns(uiVal=5), decUtil=ns(uiVal=0))
    sched = ns(schedulerPolicy=2, arrMode=1,
               schedulerParams=ns(vgpuSchedData=ns(timeslice=2_000_000), vgpuSchedDataWithARR=ns(timeslice=0)))
    calls = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: "h0",
        "nvmlDeviceGetPciInfo": lambda h: ns(busId=b"00000000:3B:00.0", domain=0, bus=0x3B, device=0),
        "nvmlDeviceGetName": lambda h: b"Tesla T4", "nvmlDeviceGetUUID": lambda h: b"GPU-1234",
        "nvmlDeviceGetUtilizationRates": lambda h: ns(gpu=43, memory=13),
        "nvmlDeviceGetEncoderUtilization": lambda h: [5, 167000],
        "nvmlDeviceGetDecoderUtilization": lambda h: [0, 167000],
        "nvmlDeviceGetMemoryInfo": lambda h: ns(total=16384 * 2**20, used=2048 * 2**20, free=14336 * 2**20),
        "nvmlDeviceGetPowerUsage": lambda h: 35123, "nvmlDeviceGetEnforcedPowerLimit": lambda h: 70000,
        "nvmlDeviceGetTemperature": lambda h, s: 48, "nvmlDeviceGetPerformanceState": lambda h: 0,
        "nvmlDeviceGetClockInfo": lambda h, k: {0: 1590, 1: 1590, 2: 5000}[k],
        "nvmlDeviceGetTotalEccErrors": (lambda h, t, c: {(0, 0): 3, (1, 0): 1, (0, 1): 9, (1, 1): 2}[(t, c)])
        if ecc else unsupported,
        "nvmlDeviceGetRetiredPages": (lambda h, cause: [0x1000] if cause == 1 else []) if ecc else unsupported,
        "nvmlDeviceGetRetiredPagesPendingStatus": (lambda h: 1) if ecc else unsupported,
        "nvmlDeviceGetRemappedRows": unsupported,                     # a Turing board: no row remapper
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 3, "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 3,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16, "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetActiveVgpus": lambda h: [7], "nvmlDeviceGetVgpuUtilization": lambda h, ts: [sample],
        "nvmlDeviceGetVgpuSchedulerState": lambda h: sched,
        "nvmlVgpuInstanceGetVmID": lambda i: (b"5e0b7c1a-1111-4222-8333-444455556666", 1),
        "nvmlVgpuInstanceGetMdevUUID": lambda i: MDEV.upper().encode(),
        "nvmlVgpuInstanceGetType": lambda i: 231, "nvmlVgpuInstanceGetFbUsage": lambda i: 700 * 2**20,
        "nvmlVgpuInstanceGetFrameRateLimit": lambda i: 60, "nvmlVgpuInstanceGetEncoderStats": lambda i: (1, 58, 4100),
        "nvmlVgpuInstanceGetGpuInstanceId": lambda i: 0xFFFFFFFF,
    }
    for name, fn in calls.items():
        setattr(m, name, fn)
    return m


def test_nvml_readings_units_and_vgpus():
    rep = collect_nvml(fake_pynvml())
    assert rep.available
    (r,) = rep.readings.values()
    assert str(r.address) == "0000:3b:00.0" and r.name == "Tesla T4"
    assert (r.power_w, r.power_limit_w, r.fb_used_mib, r.temperature_c) == (35.123, 70.0, 2048, 48.0)
    assert (r.ecc.corrected_volatile, r.ecc.uncorrected_volatile, r.ecc.uncorrected_aggregate) == (3, 1, 2)
    rep_ = r.memory_repair
    assert (rep_.retired_dbe, rep_.retired_pending, rep_.remap_pending) == (1, True, None)
    (s,) = rep.schedulers.values()
    assert (s.policy, s.timeslice_us, s.adaptive, s.source) == ("equal-share", 2000, False, "nvml")
    (v,) = rep.vgpus
    assert v.mdev_uuid == MDEV and v.num("Utilization/Gpu") == 41 and v.frame_rate_limit == (True, 60)
    assert v.integer("GPU Instance ID") is None                      # 0xFFFFFFFF: not MIG-backed


def test_not_supported_is_none():
    (r,) = collect_nvml(fake_pynvml(ecc=False)).readings.values()
    assert r.ecc.uncorrected_volatile is None and r.memory_repair.retired_pending is None


def test_no_driver_is_unavailable():
    m = fake_pynvml()

    def fail() -> None:
        raise m.NVMLError(9)

    m.nvmlInit = fail
    assert not collect_nvml(m).available


def test_nvml_wins_over_nvidia_smi_and_joins_the_mdev():
    h = SimHost.from_profile("t4x2")
    assert h.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create", MDEV)]).ok
    batch = h.apply([Op.exec(("nvidia-smi", "-q", "-x"), read_only=True)], lock=False, reads_after=INVENTORY_GLOBS)
    inv = build_inventory(batch.after, host="x", nvidia_smi=batch[0])
    m = build_host_metrics(inv, smi=batch[0], vgpu_query=None, klog=None, cursor=None, domains=(), sources={},
                           collected_at=0.0, duration_s=None, round_trips=1, nvml=collect_nvml(fake_pynvml()))
    g = m.gpus[0]
    assert (g.sm_util_pct, g.power_w, g.scheduler.source) == (43.0, 35.123, "nvml")
    # one uncorrectable volatile ECC error and a pending retirement (NVML's word): unhealthy
    assert not g.health.healthy and any("uncorrectable ECC" in r for r in g.health.reasons)
    (v,) = g.vgpus
    assert (v.id, v.sm_util_pct, v.fb_used_mib, v.encoder_fps, v.vm_uuid) == (
        MDEV, 41.0, 700, 58.0, "5e0b7c1a-1111-4222-8333-444455556666")
    assert m.gpus[1].scheduler.source is None or m.gpus[1].scheduler.source != "nvml"


def test_nvml_only_for_the_local_machine():
    with pytest.raises(InvalidSpec):
        Collector(use_nvml=True).collect(SimHost.from_profile("t4x2"))
    assert Collector(nvml_module=fake_pynvml()).collect(SimHost.from_profile("t4x2")).sources.get("nvml") == "not used"


