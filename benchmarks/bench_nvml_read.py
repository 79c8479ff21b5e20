"""Where an inventory's time goes on a real NVIDIA host (this machine, pynvml installed), in one run.

    python3 benchmarks/bench_nvml_read.py [--repeat 20]

Needs a real GPU and pynvml: it says so and exits 2 elsewhere (the simulator has no NVML). Prints, best and
median of --repeat runs, in-process on a LocalHost:
* the parts of an inventory's round trip: NVML's facts (nvml.collect), NVML's readings (collect_nvml: what
  each GPU's health is judged on), the sysfs read, the kernel log (dmesg);
* the whole inventory through NVML, through `nvidia-smi -q -x`, and from sysfs alone (the baseline);
* a whole metrics collection;
* the ten slowest NVML functions, by total time per readings + facts pass (every pynvml call is timed through
  a wrapper), so a slow call is named rather than guessed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpuvirt.host.local import LocalHost
from vgpuvirt.host.ops import Op
from vgpuvirt.observe.collect import Collector
from vgpuvirt.services.inventory.host_read import INVENTORY_GLOBS
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.nvidia import nvml as nvml_facts
from vgpuvirt.services.nvidia.nvml_readings import collect_nvml


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return min(samples), statistics.median(samples)


def timing_proxy(module: Any, totals: dict[str, float]) -> Any:
    """``module`` with every nvml* function timed into ``totals`` (the rest passed through)."""
    proxy = types.ModuleType(module.__name__)
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("nvml") and callable(value):
            def wrap(fn: Callable[..., Any], label: str = name) -> Callable[..., Any]:
                def call(*args: Any, **kw: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return fn(*args, **kw)
                    finally:
                        totals[label] += time.perf_counter() - t0
                return call
            setattr(proxy, name, wrap(value))
        else:
            setattr(proxy, name, value)
    return proxy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    try:
        import pynvml
    except ImportError:
        print("needs pynvml (nvidia-ml-py) on a host with an NVIDIA GPU", file=sys.stderr)
        return 2
    if not collect_nvml(pynvml).available:
        print("NVML does not answer here (no NVIDIA driver)", file=sys.stderr)
        return 2
    host = LocalHost()
    rows: list[tuple[str, Callable[[], object]]] = [
        ("NVML facts (nvml.collect)", lambda: nvml_facts.collect(pynvml)),
        ("NVML readings (collect_nvml)", lambda: collect_nvml(pynvml)),
        ("sysfs read (INVENTORY_GLOBS)", lambda: host.read(INVENTORY_GLOBS)),
        ("dmesg through the agent", lambda: host.apply([Op.exec(("dmesg",), read_only=True)], lock=False)),
        ("inventory, NVML (whole)", lambda: inventory(host, use_nvml=True)),
        ("inventory, nvidia-smi -q -x (whole)", lambda: inventory(host, use_nvml=False)),
        ("inventory, sysfs only (baseline)", lambda: inventory(host, use_nvml=False, nvidia_smi=False)),
        ("metrics collection, NVML", lambda: Collector(use_nvml=True).collect(host)),
    ]
    print(f"best / median of {a.repeat} runs, in-process LocalHost")
    figures = {label: timed(fn, a.repeat) for label, fn in rows}
    base = figures["inventory, sysfs only (baseline)"][0]
    for label, (best, med) in figures.items():
        print(f"{label:40s} best {best * 1000:8.2f} ms  median {med * 1000:8.2f} ms  ({best / base:6.1f}x sysfs only)")
    totals: dict[str, float] = defaultdict(float)
    proxy = timing_proxy(pynvml, totals)
    for _ in range(a.repeat):
        nvml_facts.collect(proxy)
        collect_nvml(proxy)
    print("slowest NVML functions, ms per facts + readings pass:")
    for name, total in sorted(totals.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {name:45s} {total / a.repeat * 1000:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
