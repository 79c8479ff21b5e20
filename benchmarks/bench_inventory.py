"""Inventory of the `large` profile over real sshd with 25 ms added RTT, against a naive per-file reader.

    .venv/bin/python benchmarks/bench_inventory.py [--rtt-ms 25] [--naive-files 200] [--repeat 3] [--tree-dir DIR]
                                                   [--start-rounds 20] [--start-only]

Needs the testbed (scripts/testbed.sh start; this script starts it if needed). The profile is materialized
on tmpfs (/dev/shm) by default: sysfs is an in-memory filesystem too (--tree-dir picks another place; it
must be visible to the testbed's sshd). Prints:
* the batched inventory (one exec) through the delay proxy: first, best and median of --repeat runs, and
  how long the agent itself took on the host (its ``agent_s``);
* a naive reader that runs one remote `cat`/`readlink` per path, on the first --naive-files paths of the same
  snapshot, through the same proxy, extrapolated linearly (running all of them at one RTT each would take
  many minutes) to the paths the inventory reads, and to every file a per-file tool opens (each VF's type
  names and descriptions too, which the inventory samples once per PF); the ratios against the batched
  figure;
* the agent's start on the host: an empty request, one exec each (no resident agent), with the agent sent as
  source (compiled on the host, the old way) and as this client's bytecode, interleaved with `true` over the
  same link for --start-rounds rounds, next to `python3 -I -S -c pass` (the interpreter's own start): best and
  median, and the ratios to `true` (target: <= 1.3x);
  --start-only prints only this;
* LocalHost inventory of the same materialized tree, and `mdevctl types` on that tree (real mdevctl in a
  mount namespace with the tree bound over /sys) for comparison.
Targets (issue 4): batched <= 2 RTT + 100 ms, and >= 50x faster than per-file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import vgpuvirt.host.ssh as ssh_module  # noqa: E402
from vgpuvirt.host.local import LocalHost  # noqa: E402
from vgpuvirt.host.ssh import SSHHost, no_retry  # noqa: E402
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS, build_inventory, inventory  # noqa: E402
from vgpuvirt.sim import materialize  # noqa: E402
from vgpuvirt.testing.delayproxy import DelayProxy  # noqa: E402

#: What a tool reading every type attribute on every parent opens (no sampling): the per-file baseline.
EVERY_FILE_GLOBS = [g for g in INVENTORY_GLOBS if "{" not in g] + [
    f"/sys/class/mdev_bus/*/mdev_supported_types/*/{a}" for a in ("name", "description", "device_api")]


def testbed_env() -> dict[str, object]:
    sbx = os.environ.get("VGPUVIRT_SBX", "/tmp/vgpuvirt-testbed")
    env_file = Path(sbx) / "testbed.json"
    if not env_file.exists():
        subprocess.run([str(REPO / "scripts" / "testbed.sh"), "start"], check=True)
    data: dict[str, object] = json.loads(env_file.read_text())
    return data


def start_proxy(target: tuple[str, int], one_way_s: float) -> tuple[int, DelayProxy]:
    """The project's TCP delay proxy (vgpuvirt.testing.delayproxy) adding 2 x one_way_s of RTT."""
    proxy = DelayProxy(target, rtt_ms=2000 * one_way_s).start()
    return int(proxy.address[1]), proxy


def proxy_known_hosts(env: dict[str, object], port: int) -> str:
    """The testbed's host keys, also listed for the proxy's port (keys stay verified, never auto-added)."""
    real = f"[127.0.0.1]:{env['ssh_port']}"
    lines = []
    for line in Path(str(env["known_hosts"])).read_text().splitlines():
        fields = line.split(" ", 1)
        if len(fields) == 2 and real in fields[0].split(","):
            lines.append(f"[127.0.0.1]:{port} {fields[1]}")
    fd, path = tempfile.mkstemp(prefix="bench-known-hosts-")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def ssh_host(env: dict[str, object], port: int, sysfs_root: str, resident: bool = True) -> SSHHost:
    return SSHHost("127.0.0.1", port=port, username=str(env.get("ssh_user", "root")),
                   key_filename=str(env["identity"]), known_hosts=proxy_known_hosts(env, port),
                   sysfs_root=sysfs_root, retry=no_retry, resident=resident)


def best_median(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return min(runs), statistics.median(runs)


def naive_read(host: SSHHost, tree: str, paths: list[str]) -> float:
    """One remote exec per path: readlink for links, cat for files (what a per-file tool does)."""
    t0 = time.perf_counter()
    for p in paths:
        real = tree + p
        if os.path.islink(real):
            host.run(["readlink", real])
        elif os.path.isfile(real):
            host.run(["cat", real])
    return time.perf_counter() - t0


def mdevctl_types(tree: str) -> float | None:
    if shutil.which("mdevctl") is None or shutil.which("unshare") is None:
        return None
    etc = tempfile.mkdtemp(prefix="mdevctl-etc-")
    for d in ("scripts.d/callouts", "scripts.d/notifiers"):   # mdevctl refuses to run without them
        os.makedirs(os.path.join(etc, d), exist_ok=True)
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount --bind "$1/sys" /sys && mount --bind "$2" /etc/mdevctl.d && exec mdevctl types --dumpjson',
            "sh", tree, etc]
    os.makedirs("/etc/mdevctl.d", exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, check=False)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  mdevctl types failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
        return None
    return dt


def agent_start(env: dict[str, object], port: int, rtt_ms: float, rounds: int) -> None:
    """An empty request, one exec each, as source and as bytecode, interleaved with `true` on one link."""
    source = ssh_host(env, port, "/", resident=False)
    source.bytecode = False
    bytecode = ssh_host(env, port, "/", resident=False)

    def whole_agent() -> object:
        # the baseline of shipping the agent in parts: the same call with every part sent, as before
        with mock.patch.object(ssh_module, "parts_needed", lambda request: None):
            return bytecode.read([])
    calls: dict[str, Callable[[], object]] = {
        "true": lambda: source.run(["true"]), "python": lambda: source.run(["python3", "-I", "-S", "-c", "pass"]),
        "source": lambda: source.read([]),
        "bytecode": lambda: bytecode.read([]),
        "whole": whole_agent}
    for call in calls.values():   # connect, open the spare channels, compile the bootstrap
        call()
    runs: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            runs[name].append(time.perf_counter() - t0)
    assert bytecode.bytecode, "the testbed's python refused this client's bytecode"
    source.close()
    bytecode.close()
    t_best, t_med = min(runs["true"]), statistics.median(runs["true"])
    print(f"agent start, added RTT {rtt_ms:.0f} ms, {rounds} interleaved rounds, one exec each: `true` best "
          f"{t_best * 1000:.1f} ms, median {t_med * 1000:.1f} ms")
    p_best, p_med = min(runs["python"]), statistics.median(runs["python"])
    print(f"  `python3 -I -S -c pass` (the interpreter's own start, the floor): best {p_best * 1000:6.1f} ms "
          f"({p_best / t_best:.2f}x true), median {p_med * 1000:6.1f} ms ({p_med / t_med:.2f}x true)")
    for name, what in (("source", "source"), ("bytecode", "bytecode"), ("whole", "bytecode, every part")):
        best, med = min(runs[name]), statistics.median(runs[name])
        target = "  (target <= 1.3x)" if name != "whole" else "  (baseline: the whole agent)"
        print(f"  empty agent request, agent as {what:20s}: best {best * 1000:6.1f} ms ({best / t_best:.2f}x true), "
              f"median {med * 1000:6.1f} ms ({med / t_med:.2f}x true){target}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="large")
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--naive-files", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tree-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--start-rounds", type=int, default=20)
    ap.add_argument("--start-only", action="store_true")
    a = ap.parse_args()

    env = testbed_env()
    if a.start_only:
        port, proxy = start_proxy(("127.0.0.1", int(str(env["ssh_port"]))), a.rtt_ms / 2000.0)
        try:
            agent_start(env, port, a.rtt_ms, a.start_rounds)
        finally:
            proxy.stop()
        return 0
    base = a.tree_dir or str(env.get("mnt_dir") or tempfile.gettempdir())
    tree = tempfile.mkdtemp(prefix=f"bench-{a.profile}-", dir=base)
    n_written = materialize(a.profile, tree)
    fstype = next((line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()
                   if line.split()[1] == base), "?")
    print(f"profile {a.profile}: materialized {n_written} entries in {tree} ({fstype})")

    local = LocalHost(tree)
    t0 = time.perf_counter()
    snap = local.read(INVENTORY_GLOBS)
    local_read = time.perf_counter() - t0
    times_local = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        inv = inventory(LocalHost(tree))
        times_local.append(time.perf_counter() - t0)
    print(f"snapshot: {len(snap)} paths; {len(inv.gpus)} GPUs, {len(inv.mdev_parents)} mdev parents, "
          f"{sum(len(p.types) for p in inv.mdev_parents)} type dirs")
    print(f"LocalHost inventory:      best {min(times_local) * 1000:8.1f} ms  (read alone {local_read * 1000:.1f} ms)")
    build, _ = best_median(lambda: build_inventory(snap), a.repeat)
    print(f"build_inventory alone:    best {build * 1000:8.1f} ms  (the pure parse of the snapshot)")

    mt = mdevctl_types(tree)
    print(f"mdevctl types (same tree): {'n/a' if mt is None else f'{mt * 1000:8.1f} ms'}")

    port, proxy = start_proxy(("127.0.0.1", int(str(env["ssh_port"]))), a.rtt_ms / 2000.0)
    try:
        host = ssh_host(env, port, tree)
        t0 = time.perf_counter()
        host.run(["true"])
        connect = time.perf_counter() - t0
        t0 = time.perf_counter()
        host.run(["true"])
        rtt_exec = time.perf_counter() - t0
        batched, agent_s = [], []
        for _ in range(a.repeat):
            before = host.round_trips
            t0 = time.perf_counter()
            inv_ssh = inventory(host)
            batched.append(time.perf_counter() - t0)
            assert host.round_trips - before == 1, "inventory must be one exec"
            agent_s.append(host.last_agent_s or 0.0)
        assert len(inv_ssh.gpus) == len(inv.gpus)
        # the same calls with one exec each (no resident agent), and what an exec of the agent costs
        per_exec = ssh_host(env, port, tree, resident=False)
        per_exec.run(["true"])
        empty_agent, _ = best_median(lambda: per_exec.read([]), a.repeat)
        exec_best, exec_med = best_median(lambda: inventory(per_exec), a.repeat)
        per_exec.close()
        agent_start(env, port, a.rtt_ms, a.start_rounds)
        paths = sorted(snap)[: a.naive_files]
        naive = naive_read(host, tree, paths)
        host.close()
    finally:
        proxy.stop()
    per_file = naive / max(1, len(paths))
    naive_same = per_file * len(snap)
    every_file = len(LocalHost(tree).read(EVERY_FILE_GLOBS))
    naive_every = per_file * every_file
    best, med = min(batched), statistics.median(batched)
    target = 2 * a.rtt_ms / 1000 + 0.100
    print(f"added RTT {a.rtt_ms:.0f} ms: connect {connect * 1000:.0f} ms, one empty exec {rtt_exec * 1000:.1f} ms")
    print(f"batched inventory over SSH: first {batched[0] * 1000:.1f} ms, best {best * 1000:.1f} ms, median "
          f"{med * 1000:.1f} ms (target <= {target * 1000:.0f} ms: {'MET' if best <= target else 'NOT MET'}); "
          f"the agent's own time on the host: best {min(agent_s) * 1000:.1f} ms")
    print(f"one exec per call (resident=False): inventory best {exec_best * 1000:.1f} ms, median "
          f"{exec_med * 1000:.1f} ms; an empty agent request {empty_agent * 1000:.1f} ms (vs "
          f"{rtt_exec * 1000:.1f} ms for `true`: the agent's start on the host)")
    print(f"naive per-file reader:      {len(paths)} paths in {naive:.2f} s = {per_file * 1000:.1f} ms/path; "
          f"extrapolated to the {len(snap)} paths read: {naive_same:.1f} s; to all {every_file} files a per-file "
          f"tool opens: {naive_every:.1f} s")
    print(f"ratio per-file / batched:   {naive_same / best:,.0f}x on the same paths, {naive_every / best:,.0f}x "
          f"against every file (target >= 50x: {'MET' if naive_same / best >= 50 else 'NOT MET'})")
    shutil.rmtree(tree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
