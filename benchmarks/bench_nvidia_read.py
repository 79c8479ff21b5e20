"""The NVIDIA read of the hot path, host-side: ``nvidia-smi -q -x`` against ``--query-gpu``, in one run.

    .venv/bin/python benchmarks/bench_nvidia_read.py [--profile t4x2] [--repeat 7] [--qx-ms 108] [--query-ms 25]

A simulated host (``--profile``) is materialized in a temporary directory with stand-in tools on the PATH:
``nvidia-smi`` prints what the simulator's answers, after sleeping what a real H100 on driver 580 takes
(``-q -x`` 108 ms, ``--query-gpu`` 25 ms: ../shared/hostdata/real-h100-580/README.md), ``dmesg`` prints its
kernel log. The host is a LocalHost on that tree: its agent runs in this process, so every figure is the
host-side time (what the agent spends on the host; over SSH the link's time comes on top, the same before and
after). Best of ``--repeat`` runs. Prints:
* each source alone (``-q -x``, ``--query-gpu``, ``mig -lgi``, ``mig -lgip``, ``dmesg``);
* the NVIDIA read of an inventory's round trip (its programs, run at once by the agent): before (``-q -x``)
  and after (``--query-gpu`` while the kept ``-q -x`` still describes the GPUs), with the ratio;
* a whole inventory and a whole metrics collection, both ways.
Target (issue 22): the inventory's NVIDIA read at most 30 ms with these costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vgpuvirt.host.base import Op  # noqa: E402
from vgpuvirt.host.local import LocalHost  # noqa: E402
from vgpuvirt.observe.collect import Collector  # noqa: E402
from vgpuvirt.services.inventory.read import INVENTORY_ARGVS, inventory  # noqa: E402
from vgpuvirt.services.nvidia.query_gpu import QUERY_GPU_ARGV  # noqa: E402
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV  # noqa: E402
from vgpuvirt.services.nvidia.static import StaticFacts  # noqa: E402
from vgpuvirt.sim import SimHost  # noqa: E402
from vgpuvirt.sim.materialize import materialize_fs  # noqa: E402
from vgpuvirt.testing.tool_stubs import write_tool_stubs  # noqa: E402


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def programs(host: LocalHost, argvs: list[tuple[str, ...]]) -> Callable[[], object]:
    """One read-only batch of these programs (the agent starts them at once, as in an inventory's round trip)."""
    ops = [Op.exec(a, timeout=60.0, read_only=True) for a in argvs]
    return lambda: host.apply(ops, lock=False, on_error="continue")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="t4x2")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--qx-ms", type=float, default=108.0, help="what the stand-in -q -x sleeps")
    ap.add_argument("--query-ms", type=float, default=25.0, help="what the stand-in --query-gpu sleeps")
    args = ap.parse_args()

    sim = SimHost.from_profile(args.profile)
    with tempfile.TemporaryDirectory(prefix="bench-nvread-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) \
            as tree:
        materialize_fs(sim.fs, tree)
        stubs = write_tool_stubs(sim, tree, costs={"-q -x": args.qx_ms / 1000, "--query-gpu": args.query_ms / 1000})
        bindir = Path(tree, "bin")
        bindir.mkdir()
        for name, path in stubs.items():
            (bindir / name).symlink_to(path)
        os.environ["PATH"] = f"{bindir}:{os.environ['PATH']}"
        host = LocalHost(tree)
        rest = [a for a in INVENTORY_ARGVS if a != NVIDIA_SMI_ARGV]

        print(f"profile {args.profile}, stand-in costs: -q -x {args.qx_ms:.0f} ms, --query-gpu {args.query_ms:.0f} ms;"
              f" best of {args.repeat}, host-side (the agent in this process)")
        print("each source alone:")
        for label, argv in (("nvidia-smi -q -x", NVIDIA_SMI_ARGV), ("nvidia-smi --query-gpu", QUERY_GPU_ARGV),
                            *((" ".join(a), a) for a in rest)):
            print(f"  {label:<28} {best(programs(host, [argv]), args.repeat) * 1000:7.1f} ms")

        static = StaticFacts(max_age_s=3600)
        inventory(host, nvidia_smi=True, static=static)         # the first read keeps -q -x
        mig = [a for a in rest if a[:2] == ("nvidia-smi", "mig")]
        hot = [QUERY_GPU_ARGV, *([] if static.mig_off(host.name) else mig)]
        before = best(programs(host, [NVIDIA_SMI_ARGV, *mig]), args.repeat)
        after = best(programs(host, hot), args.repeat)
        print("the NVIDIA read of an inventory's round trip (its nvidia-smi programs, run at once):")
        print(f"  before: {' | '.join(' '.join(a[1:]) for a in [NVIDIA_SMI_ARGV, *mig]):<44} {before * 1000:7.1f} ms")
        print(f"  after:  {' | '.join(' '.join(a[1:])[:30] for a in hot):<44} {after * 1000:7.1f} ms   "
              f"({before / after:.1f}x less{'; MIG off everywhere: its listings left out' if len(hot) == 1 else ''})")
        print(f"  target <= 30 ms: {'met' if after <= 0.030 else 'NOT met'} ({after * 1000:.1f} ms, of which "
              f"{args.query_ms:.0f} ms the stand-in's sleep)")

        inv_before = best(lambda: inventory(host, nvidia_smi=True), args.repeat)
        inv_after = best(lambda: inventory(host, nvidia_smi=True, static=static), args.repeat)
        same = inventory(host, nvidia_smi=True).to_dict() == inventory(host, nvidia_smi=True, static=static).to_dict()
        print("a whole inventory (programs and sysfs reads in one round trip, parsing included):")
        print(f"  -q -x every time {inv_before * 1000:7.1f} ms, --query-gpu with kept facts {inv_after * 1000:7.1f} ms "
              f"({inv_before / inv_after:.1f}x); same answer: {same}")

        kept = Collector()
        kept.collect(host)
        m_before = best(lambda: Collector().collect(host), args.repeat)
        m_after = best(lambda: kept.collect(host), args.repeat)
        print("a metrics collection:")
        print(f"  fresh collector (-q -x) {m_before * 1000:7.1f} ms, steady state (--query-gpu) "
              f"{m_after * 1000:7.1f} ms ({m_before / m_after:.1f}x)")


if __name__ == "__main__":
    main()
