"""Provision 64 vGPU VMs on the `large` profile over real sshd (FUSE simulator) with 25 ms added RTT.

    .venv/bin/python benchmarks/bench_provision.py [--vms 64] [--rtt-ms 25] [--baseline-vms 4]
                                                   [--connect test:///default]
                                                   [--hosts-scaling | --no-hosts-scaling]
                                                   [--scaling-hosts 4] [--scaling-vms 8] [--scaling-repeat 3]
                                                   [--scaling-proxy process|thread] [--only-hosts-scaling]

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
  ratio (what the parallelism saves), SSH round trips per host, and the CPU-seconds each part of the
  run took (/proc/PID/stat): this process (client), the remote agents (python3 children of the sshd
  sessions), the sshd sessions, the FUSE simulator servers and the delay proxies. This one machine plays
  every host, so their sum over its cores is the least wall time N hosts can take here; and as every host
  reads, then applies, at the same moment, about 1-host wall + (N-host - 1-host CPU) / cores is what to expect.
  --only-hosts-scaling runs this section alone.
Everything is torn down after each run (not timed).
"""

from __future__ import annotations

import argparse
import contextlib
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
    ap.add_argument("--only-hosts-scaling", action="store_true", help="run the hosts-scaling section alone")
    a = ap.parse_args()

    env = testbed_env()
    if a.only_hosts_scaling:
        hosts_scaling(env, a)
        return 0
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


#: The parts of a run whose CPU is counted, in the order printed.
PARTS = ("client", "agents", "sshd", "fuse", "proxies")
PART_NAMES = {"client": "client (this process)", "agents": "remote agents (python3 via sshd)",
              "sshd": "sshd sessions", "fuse": "FUSE sim servers", "proxies": "delay proxies"}


@dataclass
class _Run:
    wall: float
    round_trips: dict[str, int]
    calls: list[float]            # seconds of each provision() call
    cpu: dict[str, float]         # CPU seconds per part (PARTS)
    machine_cpu: float            # busy CPU seconds of the whole machine (anything else running included)

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu.values())


def _machine_cpu() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat, all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process; (0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return 0.0, 0.0
    fields = text[text.rindex(")") + 2:].split()     # after "(comm)": state ppid ... utime stime cutime cstime
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tck, (int(fields[13]) + int(fields[14])) / tck


def _children(ppid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            if int(text[text.rindex(")") + 2:].split()[1]) == ppid:
                out.append(int(name))
    return out


@dataclass
class _Parts:
    """The processes of the scenario, counted per part. An exec's remote ``python3`` is a child of its
    connection's sshd session process, which reaps it before it sends the exit status: by the time an exec
    returns, the agent's CPU is in that session's children's time. The resident agent stays a live child."""

    sessions: list[int]           # sshd processes of this run's connections (children of the listener)
    fuse: list[int]
    proxies: list[int]            # empty when the proxies are threads of this process (counted as client)

    def sample(self) -> dict[str, float]:
        sess = [_proc_cpu(p) for p in self.sessions]
        # A resident agent (SSHHost keeps one per connection) is a live child of its session: count its own
        # time and its reaped readers' too. Exec'd agents are already in the sessions' children's time.
        live = [_proc_cpu(c) for p in self.sessions for c in _children(p)]
        return {"client": time.process_time(),
                "agents": sum(c for _, c in sess) + sum(o + c for o, c in live), "sshd": sum(o for o, _ in sess),
                "fuse": sum(_proc_cpu(p)[0] for p in self.fuse), "proxies": sum(_proc_cpu(p)[0] for p in self.proxies)}


def _timed(hosts: list[SSHHost], conns: dict[str, LibvirtConnection], per_host: dict[str, list[VmRequest]],
           one_call: bool, parts: _Parts) -> _Run:
    """Provision ``per_host`` (one call for all hosts, or one call per host in turn), then tear down
    (not timed)."""
    rt0 = {h.name: h.round_trips for h in hosts}
    calls: list[float] = []
    p0, m0, t0 = parts.sample(), _machine_cpu(), time.monotonic()
    groups = [hosts] if one_call else [[h] for h in hosts]
    for group in groups:
        t = time.monotonic()
        res = provision(group, conns, [vm for h in group for vm in per_host[h.name]])
        calls.append(time.monotonic() - t)
        assert res.applied is not None
        for h in group:
            got = sum(1 for x in res.plan.assignments if x.host == h.name)
            assert got == len(per_host[h.name]), (h.name, got)
    wall = time.monotonic() - t0
    p1, m1 = parts.sample(), _machine_cpu()
    run = _Run(wall, {h.name: h.round_trips - rt0[h.name] for h in hosts}, calls,
               {k: p1[k] - p0[k] for k in PARTS}, m1 - m0)
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
        proxy_pids = [p.proc.pid for p in proxies if isinstance(p, _ProxyProcess)]
        parts = _Parts(sessions=_sessions_of(_sshd_pid(env), proxy_pids or [os.getpid()]),
                       fuse=[_pid_of(m + ".pid") for m in mnts], proxies=proxy_pids)
        for _ in range(a.scaling_repeat):
            one.append(_timed(hosts[:1], conns, per_host, one_call=True, parts=parts))
            par.append(_timed(hosts, conns, per_host, one_call=True, parts=parts))
            seq.append(_timed(hosts, conns, per_host, one_call=False, parts=parts))
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

    def cpu_mean(runs: list[_Run]) -> dict[str, float]:
        return {k: sum(r.cpu[k] for r in runs) / len(runs) for k in PARTS}

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
    c1, cn = cpu_mean(one), cpu_mean(par)
    t1, tn = sum(c1.values()), sum(cn.values())
    floor1, floorn = t1 / cores, tn / cores
    print(f"cpu by part : CPU-s per run (mean of {a.scaling_repeat}), /proc/PID/stat; 1 host | {n} hosts par "
          f"(per host)")
    for k in PARTS:
        print(f"  {PART_NAMES[k]:33s} {c1[k]:6.3f} | {cn[k]:6.3f} ({cn[k] / n:.3f})"
              + ("   (proxy threads: in the client)" if k == "proxies" and a.scaling_proxy == "thread" else ""))
    print(f"  {'total':33s} {t1:6.3f} | {tn:6.3f} ({tn / n:.3f});  machine busy {r1.machine_cpu:.2f} | "
          f"{rn.machine_cpu:.2f} (includes whatever else runs here)")
    print(f"floor       : this machine has {cores} cores and plays all {n} hosts (sshd, remote agent, FUSE server, "
          f"proxy) as well as the client: {n} hosts cannot take less than {tn:.2f} CPU-s / {cores} = {floorn:.2f} s "
          f"wall here ({floorn / r1.wall:.2f}x the 1-host time; measured {rn.wall / r1.wall:.2f}x); 1 host: "
          f"{floor1:.2f} s, wall {r1.wall:.2f} s (mostly waiting on the {a.rtt_ms:.0f} ms link)")
    # Every host reads, then every host applies, at the same moment: their CPU bursts coincide instead of
    # filling each other's network waits, so the other hosts' CPU adds to the 1-host critical path.
    lined_up = r1.wall + (tn - t1) / cores
    print(f"lined up    : the hosts' bursts coincide (all read, then all apply, together): expect about 1-host wall + "
          f"extra CPU / cores = {r1.wall:.2f} + {tn - t1:.2f} / {cores} = {lined_up:.2f} s (measured {rn.wall:.2f} s). "
          f"On real hosts each host's agent, sshd and sysfs run on that host: only the client's part "
          f"({cn['client']:.2f} CPU-s here) stays on the machine that runs vgpuvirt")


def _tcp_ports() -> dict[int, tuple[int, int]]:
    """Socket inode -> (local port, remote port) of every TCP socket (/proc/net/tcp, tcp6)."""
    out: dict[int, tuple[int, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            col = row.split()
            out[int(col[9])] = (int(col[1].rsplit(":", 1)[1], 16), int(col[2].rsplit(":", 1)[1], 16))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def _sessions_of(sshd: int | None, proxy_pids: list[int]) -> list[int]:
    """The sshd session processes (children of the listener) whose peer is one of our proxies' upstream
    sockets: other users of the same sshd (a test run beside this one) are not counted."""
    if sshd is None:
        return []
    ports = _tcp_ports()
    ours = {ports[i][0] for pid in proxy_pids for i in _socket_inodes(pid) if i in ports}
    return [p for p in _children(sshd) if any(ports[i][1] in ours for i in _socket_inodes(p) if i in ports)]


def _sshd_pid(env: dict[str, object]) -> int | None:
    """The testbed's sshd listener (its connections' session processes are its children)."""
    try:
        return _pid_of(os.path.join(str(env["sbx"]), "run", "sshd-main.pid"))
    except (OSError, ValueError, KeyError):
        return None


def _pid_of(pid_file: str) -> int:
    with open(pid_file, encoding="ascii") as f:
        return int(f.read().strip())


if __name__ == "__main__":
    sys.exit(main())
