"""One metrics collection of the `large` profile over real sshd with 25 ms added RTT, against a per-query collector.

    .venv/bin/python benchmarks/bench_metrics.py [--rtt-ms 25] [--repeat 5] [--vgpus-per-gpu 8] [--tree-dir DIR]

Needs the testbed (scripts/testbed.sh start; this script starts it if needed). The profile (8 x A10, 32 VFs
each) gets ``--vgpus-per-gpu`` vGPUs per GPU in the simulator, then is materialized on tmpfs with what the
simulator's nvidia-smi and dmesg answer for it (``nvidia-smi -q -x``, ``vgpu -q``, ``mig -lgi``, the kernel
log); two small shell stubs on the host print those answers, standing in for the driver's tools (the testbed
has no GPU). Prints:
* the batched collection (:class:`vgpuvirt.observe.collect.Collector`, ONE exec): first, best and median of
  --repeat runs with one Collector (as the exporter scrapes: from the second collection on, the inventory's
  sysfs part is reused while the files read the same), round trips, and where the time goes: the agent's own
  time on the host (``agent_s``), ssh + RTT + transfer, parsing and building here;
* the same with a fresh Collector per collection (nothing reused: what a first scrape or ``vgpuvirt metrics``
  costs);
* for scale, the sysfs inventory alone in the same run (the collection reads the same files: the capacity
  model needs them);
* a per-query collector through the same proxy: the inventory read, then per GPU ``nvidia-smi -q -x -i BUS``
  and ``nvidia-smi vgpu -q -i BUS``, then ``mig -lgi`` and ``dmesg``, one exec each (what a script calling
  the tools one by one does), and the ratio.
Target (issue 14): one round trip, under 200 ms. What the stubs do not measure: the real nvidia-smi's own
time on a GPU host (tens to hundreds of ms on a large host; NVML through ctypes in the agent would avoid it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_exporter import print_scrape, scrape_figures  # noqa: E402
from bench_inventory import ssh_host, start_proxy, testbed_env  # noqa: E402

from vgpuvirt.host.base import Op  # noqa: E402
from vgpuvirt.observe.collect import Collector  # noqa: E402
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS, inventory  # noqa: E402
from vgpuvirt.sim import SimHost  # noqa: E402
from vgpuvirt.sim.materialize import materialize_fs  # noqa: E402
from vgpuvirt.sim.tools import nvidia_gpus  # noqa: E402
from vgpuvirt.testing.tool_stubs import write_tool_stubs  # noqa: E402


def populate(sim: SimHost, per_gpu: int) -> int:
    """``per_gpu`` vGPUs (one per VF, type A10-2Q: 12 fit on a GPU) on every GPU of the simulated host."""
    made = 0
    for d in nvidia_gpus(sim.model):
        for vf in sorted(sim.model.vfs(d), key=lambda v: v.addr)[:per_gpu]:
            types = sim.read([f"/sys/bus/pci/devices/{vf.addr}/mdev_supported_types/*/name"])
            path = next(p for p in sorted(types) if (types.text(p) or "").endswith("-2Q"))
            u = str(uuid.uuid4())
            assert sim.apply([Op.write(path.rsplit("/", 1)[0] + "/create", u)]).ok
            made += 1
    return made


def per_query(host: object, stubs: dict[str, str], buses: list[str]) -> int:
    """What a collector calling the tools one by one does: one exec per query."""
    h = host  # an SSHHost
    h.read(INVENTORY_GLOBS)  # type: ignore[attr-defined]
    for bus in buses:
        h.run([stubs["nvidia-smi"], "-q", "-x", "-i", bus])  # type: ignore[attr-defined]
        h.run([stubs["nvidia-smi"], "vgpu", "-q", "-i", bus])  # type: ignore[attr-defined]
    h.run([stubs["nvidia-smi"], "mig", "-lgi"])  # type: ignore[attr-defined]
    h.run([stubs["dmesg"]])  # type: ignore[attr-defined]
    return 2 + 2 * len(buses)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="large")
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vgpus-per-gpu", type=int, default=8)
    ap.add_argument("--tree-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--scrape-hosts", type=int, default=4, help="the exporter's scrape: hosts (0: skip)")
    a = ap.parse_args()

    env = testbed_env()
    sim = SimHost.from_profile(a.profile)
    made = populate(sim, a.vgpus_per_gpu)
    base = a.tree_dir or str(env.get("mnt_dir") or tempfile.gettempdir())
    tree = tempfile.mkdtemp(prefix=f"bench-metrics-{a.profile}-", dir=base)
    try:
        n = materialize_fs(sim.fs, tree)
        stubs = write_tool_stubs(sim, tree)
        buses = [d.addr for d in nvidia_gpus(sim.model)]
        print(f"profile {a.profile}: {len(buses)} GPUs, {made} vGPUs; materialized {n} entries in {tree}")
        port, proxy = start_proxy(("127.0.0.1", int(str(env["ssh_port"]))), a.rtt_ms / 2000.0)
        try:
            host = ssh_host(env, port, tree)
            host.run(["true"])
            t0 = time.perf_counter()
            host.run(["true"])
            rtt_exec = time.perf_counter() - t0
            exchanges: list[float] = []
            real_exchange = host._exchange

            def timed_exchange(request: dict[str, object], *, idempotent: bool) -> dict[str, object]:
                t0 = time.perf_counter()
                try:
                    return real_exchange(request, idempotent=idempotent)
                finally:
                    exchanges.append(time.perf_counter() - t0)
            host._exchange = timed_exchange  # type: ignore[method-assign]
            collector = Collector(programs=stubs)
            runs, agent, trips, client = [], [], [], []
            for _ in range(a.repeat):
                before = host.round_trips
                exchanges.clear()
                t0 = time.perf_counter()
                m = collector.collect(host)
                runs.append(time.perf_counter() - t0)
                client.append(runs[-1] - sum(exchanges))
                trips.append(host.round_trips - before)
                agent.append(host.last_agent_s or 0.0)
            # each collection with a fresh Collector: nothing reused from the previous one (a first scrape)
            cold, cold_client = [], []
            for _ in range(a.repeat):
                exchanges.clear()
                t0 = time.perf_counter()
                Collector(programs=stubs).collect(host)
                cold.append(time.perf_counter() - t0)
                cold_client.append(cold[-1] - sum(exchanges))
            host._exchange = real_exchange  # type: ignore[method-assign]
            assert m.up and len(m.gpus) == len(buses), m.error
            assert sum(len(g.vgpus) for g in m.gpus) == made and all(g.sm_util_pct is not None for g in m.gpus)
            inv_runs = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                inventory(host)
                inv_runs.append(time.perf_counter() - t0)
            naive = []
            for _ in range(max(1, a.repeat // 2)):
                before = host.round_trips
                t0 = time.perf_counter()
                per_query(host, stubs, buses)
                naive.append(time.perf_counter() - t0)
                naive_trips = host.round_trips - before
            host.close()
        finally:
            proxy.stop()
        # the exporter's scrape: the same tree and tool answers on N hosts (h1..), each through its own proxy
        scrape = scrape_figures(env, tree, a.rtt_ms, a.repeat, stubs, a.scrape_hosts) if a.scrape_hosts else None
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    best, med = min(runs), statistics.median(runs)
    print(f"added RTT {a.rtt_ms:.0f} ms: one empty exec {rtt_exec * 1000:.1f} ms")
    print(f"batched collection over SSH: first {runs[0] * 1000:.1f} ms, best {best * 1000:.1f} ms, median "
          f"{med * 1000:.1f} ms, round trips {max(trips)} (target: 1 round trip, < 200 ms: "
          f"{'MET' if max(trips) == 1 and med < 0.200 else 'NOT MET'}); the agent's own time on the host: best "
          f"{min(agent) * 1000:.1f} ms")
    wire = [r - c - g for r, c, g in zip(runs, client, agent, strict=True)]
    print(f"  of which (best / median): the agent on the host {min(agent) * 1000:.1f} / "
          f"{statistics.median(agent) * 1000:.1f} ms; ssh, RTT and transfer {min(wire) * 1000:.1f} / "
          f"{statistics.median(wire) * 1000:.1f} ms; parse and build here {min(client) * 1000:.1f} / "
          f"{statistics.median(client) * 1000:.1f} ms")
    print(f"a fresh Collector each time (the sysfs part not reused: a first scrape): best {min(cold) * 1000:.1f} ms, "
          f"median {statistics.median(cold) * 1000:.1f} ms; parse and build here best "
          f"{min(cold_client) * 1000:.1f} ms, median {statistics.median(cold_client) * 1000:.1f} ms")
    print(f"for scale, the inventory alone (its sysfs part, same run): best {min(inv_runs) * 1000:.1f} ms, median "
          f"{statistics.median(inv_runs) * 1000:.1f} ms")
    print(f"per-query collector (same proxy): {naive_trips} round trips, best {min(naive) * 1000:.1f} ms")
    print(f"ratio per-query / batched: {min(naive) / best:.1f}x")
    if scrape is not None:
        print_scrape(scrape, a.scrape_hosts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
