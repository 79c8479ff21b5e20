"""A fleet that scales: provisioning and metrics across 1, 8, 16 and 32 simulated hosts, client side.

    .venv/bin/python benchmarks/bench_fleet.py [--hosts 1,8,16,32] [--vms-per-host 8] [--profile t4x2]
                                               [--repeat 5] [--profile-top 0] [--e2e-hosts 0]
                                               [--no-boot] [--no-freeze]

Each host is an in-process simulated host (``SimHost``, its own simulated sysfs) with its own libvirt test
driver (``test:///NODE.xml``: one private state per connection, as each real host has its own libvirtd), so
what is measured is this process's work: inventories, placement, plan, steps, XML, libvirt calls. Each host
is booted before the measurement (--boot, the default: its simulated sysfs listed once, so the nodes the simulator
keeps for a host's life exist, as a real host's sysfs exists before a client reads it) and the collector is told to
leave the objects that exist then (--freeze, the default): the simulated hosts' objects live in this process, and
a garbage-collector pass the client triggers would otherwise walk them, a cost no real client has. One
``provision()`` call places --vms-per-host VMs per host (``spread``), then one ``collect_many()`` reads every
host's metrics. Per host count, the median of --repeat runs (fresh hosts each run, torn down untimed; the runs
go in rounds of every host count):
* client CPU per host (``time.process_time`` of this process, less the CPU time spent inside the simulated
  hosts' agent and sysfs, which on a real fleet is the hosts' own) and wall time, for provisioning and for
  metrics; the libvirt test driver's work stays counted (it runs in this process);
* the straight line: N x the 1-host figure of the same run; the ratio (target: 32 hosts <= 32x one host, and
  <= 15 ms client CPU per host per provisioning of 8 VMs).
* the plan alone (placement, steps, XML: pure client work on the hosts' gathered inventories, no libvirt and
  no hosts), best of --plan-rounds runs per host count, against the same straight line: the least noisy
  figure on a busy machine, and where a cost growing with hosts x VMs shows first;
--profile-top N prints the N costliest functions (cProfile, cumulative) of one provisioning on the largest
host count. --e2e-hosts N adds the end-to-end figure over real sshd + FUSE (bench_provision.py's hosts
scaling section, N hosts): it needs the testbed (scripts/testbed.sh start).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vgpuvirt.libvirt_conn import LibvirtConnection  # noqa: E402
from vgpuvirt.observe.collect import collect_many  # noqa: E402
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown  # noqa: E402
from vgpuvirt.provision import run as provision_run  # noqa: E402
from vgpuvirt.provision.plan import plan  # noqa: E402
from vgpuvirt.provision.run import gather  # noqa: E402
from vgpuvirt.provision.state import host_states  # noqa: E402
from vgpuvirt.sim import SimHost  # noqa: E402

# The test driver's host: enough CPUs and memory for the VMs, and the `default` network the pre-flight checks.
NODE_XML = """<node>
  <cpu><mhz>3000</mhz><model>x86_64</model><active>64</active><max>64</max><total>64</total>
       <nodes>1</nodes><sockets>1</sockets><cores>32</cores><threads>2</threads></cpu>
  <memory>67108864</memory>
  <network><name>default</name><bridge name='virbr0'/><forward/>
    <ip address='192.168.122.1' netmask='255.255.255.0'/></network>
</node>
"""


class HostSide:
    """CPU seconds spent inside the simulated hosts (their agent and sysfs): the hosts' work, not the client's."""

    lock = threading.Lock()
    seconds = 0.0


class TimedSimHost(SimHost):
    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        t0 = time.thread_time()        # this thread's CPU only: other hosts run in parallel threads
        try:
            return super()._exchange(request, idempotent=idempotent)
        finally:
            spent = time.thread_time() - t0
            with HostSide.lock:
                HostSide.seconds += spent


PHASES: dict[int, list[dict[str, float]]] = {}   # per host count, each run's Phases.seconds


class Phases:
    """Client CPU of provisioning's phases (gather, plan, apply; the simulated hosts' own time left out) and of
    the garbage collector's passes during them, summed over a run: where a larger fleet's extra time goes."""

    seconds: dict[str, float] = {}
    gc_started = 0.0

    @classmethod
    def timed(cls, name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            c0, h0 = time.process_time(), HostSide.seconds
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - c0 - (HostSide.seconds - h0)
                cls.seconds[name] = cls.seconds.get(name, 0.0) + spent
        return run

    @classmethod
    def gc_pass(cls, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            cls.gc_started = time.thread_time()
        else:
            cls.seconds["gc"] = cls.seconds.get("gc", 0.0) + time.thread_time() - cls.gc_started


for _phase in ("gather", "plan", "apply"):   # provision() calls them by these module-level names
    setattr(provision_run, _phase, Phases.timed(_phase, getattr(provision_run, _phase)))


def booted(host: SimHost) -> SimHost:
    """The host with its sysfs in place: every directory listed once, so the nodes the simulator keeps for the
    host's life (what its devices' fixed fields decide, see ``SimFs._kept_nodes``) exist before the measurement,
    as a real host's sysfs exists before any client reads it. The client's gathering still reads it all."""
    stack = ["/sys", "/proc"]
    while stack:
        d = stack.pop()
        for name in host.fs.listdir(d):
            if host.fs.kind(f"{d}/{name}") == "d":
                stack.append(f"{d}/{name}")
    return host


def fleet(n: int, a: argparse.Namespace, node: str, tag: str
          ) -> tuple[dict[str, SimHost], dict[str, LibvirtConnection]]:
    hosts: dict[str, SimHost] = {}
    for i in range(n):
        host = TimedSimHost.from_profile(a.profile, name=f"{tag}-h{i:02d}")
        hosts[host.name] = booted(host) if a.boot else host
    conns = {name: LibvirtConnection(f"test://{node}") for name in hosts}
    return hosts, conns


def one_run(n: int, a: argparse.Namespace, node: str, tag: str, prof: cProfile.Profile | None = None
            ) -> tuple[float, float, float, float, float]:
    """(provision client CPU, provision wall, metrics client CPU, metrics wall, provision's voluntary context
    switches) of one fleet of n hosts. Client CPU: this process's, less the time spent inside the simulated hosts
    (on a real fleet, the hosts' own). A context switch is a thread giving up the interpreter (a system call, a
    libvirt call, a lock) and waiting to get it back: with a thread per host these grow with the fleet."""
    hosts, conns = fleet(n, a, node, tag)
    vms = VmRequest.pool(f"{tag}-vm", n * a.vms_per_host, gpu=VgpuRequest.parse(a.gpu), memory_mib=256, vcpus=1)
    if a.freeze:
        # The simulated hosts' objects live in this process, not in a real client: out of the collector's
        # sight (gc.freeze), their number does not make the client's collections cost more with the fleet.
        gc.collect()
        gc.freeze()
    try:
        HostSide.seconds = 0.0
        Phases.seconds = {}
        gc.callbacks.append(Phases.gc_pass)
        s0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        c0, w0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        res = provision(hosts, conns, vms, policy="spread")
        if prof is not None:
            prof.disable()
        c1, w1 = time.process_time() - HostSide.seconds, time.perf_counter()
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - s0
        gc.callbacks.remove(Phases.gc_pass)
        PHASES.setdefault(n, []).append(dict(Phases.seconds))
        HostSide.seconds = 0.0
        assert res.applied is not None and len(res.plan.assignments) == len(vms), "not every VM was placed"
        per_host = {h: sum(1 for x in res.plan.assignments if x.host == h) for h in hosts}
        assert set(per_host.values()) == {a.vms_per_host}, per_host
        c1b = time.process_time()
        collect_many(list(hosts.values()))
        c2, w2 = time.process_time() - HostSide.seconds, time.perf_counter()
        td = teardown(hosts, conns, [v.name for v in vms])
        assert td.ok, td.failed
    finally:
        gc.unfreeze()
        for c in conns.values():
            c.close()
    return c1 - c0, w1 - w0, c2 - c1b, w2 - w1, switches


def plan_alone(n: int, a: argparse.Namespace, node: str, rounds: int) -> float:
    """Best CPU time of plan() for n hosts' gathered inventories (nothing is applied: the hosts stay empty)."""
    hosts, conns = fleet(n, a, node, f"p{n}")
    try:
        invs, doms = gather(hosts, conns)
        states = host_states(invs, doms)
        vms = VmRequest.pool(f"p{n}-vm", n * a.vms_per_host, gpu=VgpuRequest.parse(a.gpu), memory_mib=256, vcpus=1)
        best = float("inf")
        if a.freeze:   # as in one_run: the simulated hosts' objects are no client's
            gc.collect()
            gc.freeze()
        for _ in range(rounds):
            c0 = time.process_time()
            p = plan(invs, vms, domains=doms, policy="spread", states=states)
            best = min(best, time.process_time() - c0)
            assert len(p.assignments) == len(vms)
        return best
    finally:
        gc.unfreeze()
        for c in conns.values():
            c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,8,16,32")
    ap.add_argument("--vms-per-host", type=int, default=8)
    ap.add_argument("--profile", default="t4x2")
    ap.add_argument("--gpu", default="fb>=2G,series=Q")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile-top", type=int, default=0)
    ap.add_argument("--e2e-hosts", type=int, default=0)
    ap.add_argument("--plan-rounds", type=int, default=7)
    ap.add_argument("--freeze", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the simulated hosts' objects out of the garbage collector's passes (default: on)")
    ap.add_argument("--boot", action=argparse.BooleanOptionalAction, default=True,
                    help="list each simulated host's sysfs once before the measurement (default: on)")
    a = ap.parse_args()
    counts = [int(x) for x in a.hosts.split(",")]
    if counts[0] != 1:
        counts.insert(0, 1)                      # the straight line starts from one host, measured here
    with tempfile.NamedTemporaryFile("w", suffix=".xml", prefix="bench-fleet-node-", delete=False) as f:
        f.write(NODE_XML)
        node = f.name
    one_run(1, a, node, "warm")                  # imports, caches, the first libvirt connection
    rows: dict[int, list[tuple[float, float, float, float, float]]] = {n: [] for n in counts}
    for r in range(a.repeat):
        # rounds of every host count, not every run of one count then the next: a busy spell of the machine
        # then lands in one round of each count (which the median drops), not in all runs of one count
        for n in counts:
            rows[n].append(one_run(n, a, node, f"f{n}r{r}"))
    med = {n: tuple(statistics.median(r[i] for r in runs) for i in range(5)) for n, runs in rows.items()}
    p1c, p1w, m1c, _m1w, _s1 = med[1]
    print(f"profile {a.profile}, {a.vms_per_host} VMs per host ({a.gpu}, spread), libvirt test driver per host; "
          f"median of {a.repeat} runs; hosts {'booted' if a.boot else 'not booted'}, "
          f"{'frozen' if a.freeze else 'not frozen'}")
    print(f"{'hosts':>5s} | {'provision CPU':>13s} {'CPU/host':>9s} {'x line':>7s} {'wall':>8s} {'x line':>7s} "
          f"{'switches/host':>13s} | {'metrics CPU':>11s} {'CPU/host':>9s} {'x line':>7s} {'wall':>8s}")
    for n in counts:
        pc, pw, mc, mw, sw = med[n]
        print(f"{n:5d} | {pc * 1e3:10.1f} ms {pc / n * 1e3:6.1f} ms {pc / (n * p1c):7.2f} {pw * 1e3:5.0f} ms "
              f"{pw / (n * p1w):7.2f} {sw / n:13.0f} | {mc * 1e3:8.1f} ms {mc / n * 1e3:6.1f} ms "
              f"{mc / (n * m1c):7.2f} {mw * 1e3:5.0f} ms")
    def phase(n: int, k: str) -> float:
        return statistics.median(r.get(k, 0.0) for r in PHASES[n][-a.repeat:]) / n * 1e3

    print("where provisioning's client CPU goes, ms per host (median of runs; the garbage collector's passes "
          "are within the phases): " + "; ".join(
              f"{n} host(s) gather {phase(n, 'gather'):.2f}, plan {phase(n, 'plan'):.2f}, "
              f"apply {phase(n, 'apply'):.2f}, gc {phase(n, 'gc'):.2f}" for n in counts))
    big = counts[-1]
    print(f"straight line: {big} hosts take {med[big][0] / p1c:.1f}x one host's provisioning CPU "
          f"(line: {big}x; target <= {big}x) and {med[big][2] / m1c:.1f}x its metrics CPU; "
          f"{med[big][0] / big * 1e3:.1f} ms CPU per host per provisioning of {a.vms_per_host} VMs (target <= 15 ms)")
    if a.plan_rounds:
        alone = {n: plan_alone(n, a, node, a.plan_rounds) for n in counts}
        print(f"plan alone (best of {a.plan_rounds}): " + ", ".join(
            f"{n} host(s) {alone[n] * 1e3:.1f} ms ({alone[n] / (n * alone[1]):.2f}x line)" for n in counts)
            + f"; {big} hosts take {alone[big] / alone[1]:.1f}x one host's (line: {big}x)")
    if a.profile_top:
        prof = cProfile.Profile()
        one_run(big, a, node, "prof", prof)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(a.profile_top)
        print(out.getvalue())
    Path(node).unlink()
    if a.e2e_hosts:
        sys.path.insert(0, str(REPO / "benchmarks"))
        import bench_provision
        sys.argv = [sys.argv[0], "--only-hosts-scaling", "--scaling-hosts", str(a.e2e_hosts),
                    "--scaling-vms", str(a.vms_per_host)]
        return int(bench_provision.main())
    return 0


if __name__ == "__main__":
    sys.exit(main())
