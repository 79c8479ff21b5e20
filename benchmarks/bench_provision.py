"""Provision 64 vGPU VMs on the `large` profile over real sshd (FUSE simulator) with 25 ms added RTT.

    .venv/bin/python benchmarks/bench_provision.py [--vms 64] [--rtt-ms 25] [--baseline-vms 4]
                                                   [--connect test:///default]
                                                   [--hosts-scaling | --no-hosts-scaling]
                                                   [--scaling-hosts 4] [--scaling-vms 8] [--scaling-repeat 3]

Needs the testbed (scripts/testbed.sh start; started here if needed). Prints, in one run:
* batched: ``provision()`` of --vms VMs (inventory, placement, every vGPU in one locked batch, XML,
  define + start on libvirt): wall time and SSH round trips (target: constant per host, < 3 s);
* per-VM baseline: the same VMs provisioned one call per VM (inventory + one batch each), on
  --baseline-vms of them, extrapolated linearly to --vms; and the ratio.
* hosts scaling (issue 7: "4 hosts take about the time of one"; on by default, --no-hosts-scaling skips it):
  --scaling-vms VMs per host (profile t4x2, one FUSE mount, one delay proxy, one SSHHost and one
  LibvirtConnection per host) provisioned on 1 host, on --scaling-hosts hosts in one ``provision()`` call
  (hosts in parallel), and on the same hosts one ``provision()`` after another (the sequential baseline);
  median of --scaling-repeat runs each; the parallel/1-host ratio (target ~1x), the sequential/parallel
  ratio (what the parallelism saves), SSH round trips per host, and the machine's busy CPU (this one
  machine plays every host, so its cores bound how far N hosts can overlap).
Everything is torn down after each run (not timed).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_inventory import ssh_host, testbed_env  # noqa: E402

from vgpuvirt.host.ssh import SSHHost  # noqa: E402
from vgpuvirt.libvirt_conn import LibvirtConnection  # noqa: E402
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown  # noqa: E402
from vgpuvirt.sim import fuse  # noqa: E402
from vgpuvirt.testing.delayproxy import DelayProxy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vms", type=int, default=64)
    ap.add_argument("--baseline-vms", type=int, default=4)
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--connect", default="test:///default")
    ap.add_argument("--gpu", default="fb>=2G,series=Q")
    ap.add_argument("--hosts-scaling", action=argparse.BooleanOptionalAction, default=True,
                    help="also time 1 host vs N hosts in parallel vs N hosts one after another (default: on)")
    ap.add_argument("--scaling-hosts", type=int, default=4)
    ap.add_argument("--scaling-vms", type=int, default=8, help="VMs per host in the hosts-scaling section")
    ap.add_argument("--scaling-profile", default="t4x2")
    ap.add_argument("--scaling-repeat", type=int, default=3)
    ap.add_argument("--scaling-proxy", choices=["process", "thread"], default="process",
                    help="delay proxies in their own processes (default) or as threads of this process")
    a = ap.parse_args()

    env = testbed_env()
    gpu = VgpuRequest.parse(a.gpu)
    proxy = DelayProxy(("127.0.0.1", int(str(env["ssh_port"]))), rtt_ms=a.rtt_ms).start()
    port = proxy.address[1]
    mnt = tempfile.mkdtemp(prefix="bench-prov-", dir=str(env["mnt_dir"]))
    conn = LibvirtConnection(a.connect)
    try:
        fuse.start("large", mnt, pid_file=mnt + ".pid")
        host = ssh_host(env, port, mnt)
        t = time.monotonic()
        host.read(["/sys/module/nvidia/version"])   # connect + one exec: the RTT as measured
        rtt_probe = time.monotonic() - t
        t = time.monotonic()
        host.read(["/sys/module/nvidia/version"])
        one_exec = time.monotonic() - t

        vms = VmRequest.pool("bench", a.vms, gpu=gpu, memory_mib=256, vcpus=1)
        rt0 = host.round_trips
        t0 = time.monotonic()
        res = provision(host, conn, vms)
        batched = time.monotonic() - t0
        batched_rt = host.round_trips - rt0
        assert res.applied is not None and len(res.plan.assignments) == a.vms
        gpus_used = len({a_.gpu for a_ in res.plan.assignments})
        td = teardown(host, conn, [v.name for v in vms])
        assert td.ok, td.failed

        base = VmRequest.pool("base", a.baseline_vms, gpu=gpu, memory_mib=256, vcpus=1)
        rt0 = host.round_trips
        t0 = time.monotonic()
        for vm in base:
            provision(host, conn, [vm])
        per_vm_total = time.monotonic() - t0
        per_vm_rt = host.round_trips - rt0
        td = teardown(host, conn, [v.name for v in base])
        assert td.ok, td.failed
        host.close()
    finally:
        conn.close()
        proxy.stop()
        fuse.stop(mnt, pid_file=mnt + ".pid")
        os.rmdir(mnt)

    per_vm = per_vm_total / a.baseline_vms
    extrapolated = per_vm * a.vms
    print(f"profile large over real sshd + FUSE sim, added RTT {a.rtt_ms:.0f} ms (one exec measured "
          f"{one_exec * 1000:.0f} ms; first connect+exec {rtt_probe * 1000:.0f} ms); libvirt {a.connect}")
    print(f"batched : {a.vms} VMs ({gpu.describe()}) on {gpus_used} GPUs in {batched:.2f} s wall, "
          f"{batched_rt} SSH round trips "
          f"(inventory {res.inventory_seconds:.2f} s, plan {res.plan_seconds:.2f} s, "
          f"apply {res.applied.seconds:.2f} s)")
    print(f"per-VM  : {a.baseline_vms} VMs one call each: {per_vm_total:.2f} s, {per_vm_rt} round trips "
          f"({per_vm_rt / a.baseline_vms:.1f} per VM, {per_vm:.3f} s per VM) -> {a.vms} VMs ~ {extrapolated:.1f} s")
    print(f"ratio   : {extrapolated / batched:.1f}x faster batched; round trips {batched_rt} vs "
          f"~{per_vm_rt / a.baseline_vms * a.vms:.0f}")
    print(f"layer   : plan + apply (placement, one device batch, {a.vms} defines + starts) = "
          f"{res.plan_seconds + res.applied.seconds:.2f} s; the rest is the inventory read of the FUSE-served tree")
    print(f"target  : constant round trips per host ({'met' if batched_rt <= 2 else 'NOT met'}: {batched_rt}), "
          f"under 3 s ({'met' if batched < 3 else 'NOT met'}: {batched:.2f} s)")
    if a.hosts_scaling:
        hosts_scaling(env, a)
    return 0


@dataclass
class _Run:
    wall: float
    round_trips: dict[str, int]
    calls: list[float]            # seconds of each provision() call
    client_cpu: float             # CPU seconds of this process (all threads)
    machine_cpu: float            # CPU seconds of the whole machine (client, proxies, sshd, agents, FUSE)


def _machine_cpu() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat, all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _timed(hosts: list[SSHHost], conns: dict[str, LibvirtConnection], per_host: dict[str, list[VmRequest]],
           one_call: bool) -> _Run:
    """Provision ``per_host`` (one call for all hosts, or one call per host in turn), then tear down
    (not timed)."""
    rt0 = {h.name: h.round_trips for h in hosts}
    calls: list[float] = []
    m0, c0, t0 = _machine_cpu(), time.process_time(), time.monotonic()
    groups = [hosts] if one_call else [[h] for h in hosts]
    for group in groups:
        t = time.monotonic()
        res = provision(group, conns, [vm for h in group for vm in per_host[h.name]])
        calls.append(time.monotonic() - t)
        assert res.applied is not None
        for h in group:
            got = sum(1 for x in res.plan.assignments if x.host == h.name)
            assert got == len(per_host[h.name]), (h.name, got)
    run = _Run(time.monotonic() - t0, {h.name: h.round_trips - rt0[h.name] for h in hosts}, calls,
               time.process_time() - c0, _machine_cpu() - m0)
    td = teardown(hosts, conns, [vm.name for h in hosts for vm in per_host[h.name]])
    assert td.ok, td.failed
    return run


class _ProxyProcess:
    """The delay proxy (``python -m vgpuvirt.testing.delayproxy``) in its own process: a real link costs
    the client no CPU, while an in-process proxy's event loop would take the GIL from the hosts' threads."""

    def __init__(self, target: tuple[str, int], rtt_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vgpuvirt.testing.delayproxy", "--target", f"{target[0]}:{target[1]}",
             "--rtt-ms", str(rtt_ms), "--lifetime", "900"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()          # "listening HOST:PORT -> ..."
        m = re.match(r"listening (\S+):(\d+) ", line)
        if m is None:
            self.stop()
            raise RuntimeError(f"delay proxy did not start: {line!r}")
        self.address = (m[1], int(m[2]))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def hosts_scaling(env: dict[str, object], a: argparse.Namespace) -> None:
    """1 host vs N hosts in parallel vs N hosts one after another, the same VMs per host (issue 7)."""
    n = a.scaling_hosts
    gpu = VgpuRequest.parse(a.gpu)
    target = ("127.0.0.1", int(str(env["ssh_port"])))
    # One proxy per host: each host has its own link (and its own port, hence its own host name).
    proxies: list[DelayProxy | _ProxyProcess] = []
    mnts: list[str] = []
    hosts: list[SSHHost] = []
    conns: dict[str, LibvirtConnection] = {}
    one: list[_Run] = []
    par: list[_Run] = []
    seq: list[_Run] = []
    try:
        for _ in range(n):
            proxies.append(DelayProxy(target, rtt_ms=a.rtt_ms).start() if a.scaling_proxy == "thread"
                           else _ProxyProcess(target, a.rtt_ms))
        for i in range(n):
            mnts.append(tempfile.mkdtemp(prefix=f"bench-scale{i + 1}-", dir=str(env["mnt_dir"])))
            fuse.start(a.scaling_profile, mnts[-1], pid_file=mnts[-1] + ".pid")
        for p, m in zip(proxies, mnts, strict=True):
            h = ssh_host(env, p.address[1], m)
            hosts.append(h)
            conns[h.name] = LibvirtConnection(a.connect)
        per_host = {h.name: VmRequest.pool(f"scale{i + 1}", a.scaling_vms, gpu=gpu, memory_mib=256, vcpus=1,
                                           host=h.name) for i, h in enumerate(hosts)}
        # Warm-up (not timed): SSH connect, libvirt open, the FUSE servers' first walk.
        provision(hosts, conns, [vm for h in hosts for vm in per_host[h.name]], dry_run=True)
        for _ in range(a.scaling_repeat):
            one.append(_timed(hosts[:1], conns, per_host, one_call=True))
            par.append(_timed(hosts, conns, per_host, one_call=True))
            seq.append(_timed(hosts, conns, per_host, one_call=False))
    finally:
        for h in hosts:
            h.close()
        for c in conns.values():
            c.close()
        for p in proxies:
            p.stop()
        for m in mnts:
            fuse.stop(m, pid_file=m + ".pid")
            os.rmdir(m)

    def med(runs: list[_Run]) -> _Run:
        return sorted(runs, key=lambda r: r.wall)[len(runs) // 2]

    def walls(runs: list[_Run]) -> str:
        return ", ".join(f"{r.wall:.2f}" for r in runs)

    r1, rn, rs = med(one), med(par), med(seq)
    cores = os.cpu_count() or 1
    print(f"hosts scaling: {a.scaling_vms} VMs per host ({gpu.describe()}), profile {a.scaling_profile}; per host "
          f"one FUSE mount, one {a.rtt_ms:.0f} ms delay proxy ({a.scaling_proxy}), one SSHHost, one "
          f"LibvirtConnection({a.connect}); median of {a.scaling_repeat}")
    print(f"1 host      : {r1.wall:.2f} s wall (runs {walls(one)}); SSH round trips: {r1.round_trips[hosts[0].name]}")
    print(f"{n} hosts par : {rn.wall:.2f} s wall (runs {walls(par)}); SSH round trips per host: "
          f"{', '.join(str(rn.round_trips[h.name]) for h in hosts)}")
    print(f"{n} hosts seq : {rs.wall:.2f} s wall, one provision() per host in turn (runs {walls(seq)}; "
          f"per host: {', '.join(f'{x:.2f}' for x in rs.calls)})")
    print(f"ratio       : {n} hosts parallel / 1 host = {rn.wall / r1.wall:.2f}x (target ~1x); "
          f"sequential / parallel = {rs.wall / rn.wall:.2f}x saved by the parallelism (ideal {n}x)")
    floor = rn.machine_cpu / cores
    print(f"cpu         : this machine has {cores} cores and plays all {n} hosts (sshd, remote agent, FUSE server) "
          f"as well as the client; busy CPU-s (machine / client): 1 host {r1.machine_cpu:.2f} / "
          f"{r1.client_cpu:.2f}, {n} hosts par {rn.machine_cpu:.2f} / {rn.client_cpu:.2f} -> {n} hosts cannot take "
          f"less than {floor:.2f} s wall here ({floor / r1.wall:.2f}x the 1-host time)")


if __name__ == "__main__":
    sys.exit(main())
