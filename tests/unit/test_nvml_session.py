"""One NVML session for the inventory's two NVML collectors: on the real H100 each collector's own init, handle
lookup and shutdown were ~10 ms of the 34 ms an inventory took through NVML (benchmarks/bench_nvml_read.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from test_real_h100 import fake_h100_pynvml  # type: ignore[import-not-found]

from vgpuvirt.services.nvidia import nvml as nvml_facts
from vgpuvirt.services.nvidia.nvml_readings import collect_nvml
from vgpuvirt.services.nvidia.nvml_session import shared

COUNTED = ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByIndex")


def counting(module: Any) -> tuple[Any, Counter[str]]:
    calls: Counter[str] = Counter()
    for name in COUNTED:
        real = getattr(module, name)

        def count(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        setattr(module, name, count)
    return module, calls


def test_both_collectors_share_one_init_one_handle_and_one_shutdown() -> None:
    alone, alone_calls = counting(fake_h100_pynvml())
    facts_alone, readings_alone = nvml_facts.collect(alone), collect_nvml(alone)
    assert alone_calls == Counter({name: 2 for name in COUNTED})      # the baseline: each pays them
    module, calls = counting(fake_h100_pynvml())
    with shared(module) as session:
        facts, readings = nvml_facts.collect(session), collect_nvml(session)
    assert calls == Counter({name: 1 for name in COUNTED})
    assert (facts, readings) == (facts_alone, readings_alone)          # the same answers


def test_where_nvml_does_not_start_each_collector_reports_it_as_alone() -> None:
    module = fake_h100_pynvml()

    def no_driver() -> None:
        raise module.NVMLError(9)

    module.nvmlInit = no_driver
    with shared(module) as session:
        facts, readings = nvml_facts.collect(session), collect_nvml(session)
    assert not facts.available and not readings.available and readings.error


def test_a_failed_handle_is_asked_again_not_kept() -> None:
    module = fake_h100_pynvml()
    tries = Counter[int]()
    real = module.nvmlDeviceGetHandleByIndex

    def flaky(i: int) -> Any:
        tries[i] += 1
        if tries[i] == 1:
            raise module.NVMLError(15)       # NVML_ERROR_GPU_IS_LOST, once
        return real(i)

    module.nvmlDeviceGetHandleByIndex = flaky
    with shared(module) as session:
        facts = nvml_facts.collect(session)
        readings = collect_nvml(session)
    assert facts.gpus[0].errors == {"handle": str(module.NVMLError(15))} and readings.readings
