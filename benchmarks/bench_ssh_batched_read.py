"""Batched read vs one exec per file, over a real sshd behind a link with added latency.

Reads the same tree (>= 2,000 files) through the testbed's loopback sshd and a TCP delay proxy:

* batched: ONE ``host.read(globs)`` (one remote exec of the agent);
* per file: ``host.run(["cat", path])`` for each file (one exec each), the way naive tools do it.

It prints both times, their ratio, the added RTT, and the batched time in RTTs (over the same read
on loopback without the proxy, i.e. processing + transfer). Needs the testbed
(``scripts/testbed.sh start``). Usage::

    .venv/bin/python benchmarks/bench_ssh_batched_read.py [--rtt-ms 25] [--files 2000] [--per-file-sample 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.testing.delayproxy import DelayProxy

ENV_FILE = Path(os.environ.get("VGPUVIRT_SBX", "/tmp/vgpuvirt-testbed")) / "testbed.json"


def make_tree(root: Path, files: int, per_dir: int = 40) -> list[str]:
    """sysfs-like: /sys/devices/devNNNN/attrNN, small text values. Returns the host paths."""
    paths = []
    for i in range(files):
        d = root / "sys" / "devices" / f"dev{i // per_dir:04d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"attr{i % per_dir:02d}").write_text(f"0x{i:04x}\n")
        paths.append(f"/sys/devices/dev{i // per_dir:04d}/attr{i % per_dir:02d}")
    return paths


def known_hosts_for(port: int, env: dict[str, object], dest: Path) -> str:
    """known_hosts naming the proxy's port with the testbed sshd's real key (still verified strictly)."""
    line = Path(str(env["known_hosts"])).read_text().splitlines()[0]
    dest.write_text(f"[127.0.0.1]:{port} {line.split(None, 1)[1]}\n")
    return str(dest)


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--per-file-sample", type=int, default=200,
                    help="files read one exec each (0 = all); the total is extrapolated from the sample")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    if not ENV_FILE.exists():
        print(f"no testbed ({ENV_FILE}): run scripts/testbed.sh start", file=sys.stderr)
        return 2
    env = json.loads(ENV_FILE.read_text())

    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp:
        tree = Path(tmp) / "tree"
        paths = make_tree(tree, a.files)
        patterns = ["/sys/devices/*/*"]

        def host(port: int, known_hosts: str) -> SSHHost:
            return SSHHost("127.0.0.1", port=port, username=str(env["ssh_user"]), key_filename=str(env["identity"]),
                           known_hosts=known_hosts, sysfs_root=str(tree))

        # loopback, no proxy: per-exec latency and the batched read's processing + transfer time
        direct = host(int(env["ssh_port"]), str(env["known_hosts"]))
        direct.run(["true"])
        exec_lo = statistics.median(timed(lambda: direct.run(["true"]), 50))
        snap = direct.read(patterns)
        assert len(snap) >= a.files, f"read {len(snap)} entries, expected >= {a.files}"
        base = statistics.median(timed(lambda: direct.read(patterns), a.repeat))
        direct.close()

        with DelayProxy(("127.0.0.1", int(env["ssh_port"])), rtt_ms=a.rtt_ms) as proxy:
            kh = known_hosts_for(proxy.address[1], env, Path(tmp) / "known_hosts")
            h = host(proxy.address[1], kh)
            h.run(["true"])  # connection set-up is not what is measured
            exec_wan = statistics.median(timed(lambda: h.run(["true"]), 10))
            rt0 = h.round_trips
            batched_runs = timed(lambda: h.read(patterns), a.repeat)
            assert h.round_trips - rt0 == a.repeat, "a batched read must be one exec"
            batched = statistics.median(batched_runs)

            sample = paths if a.per_file_sample <= 0 else paths[: a.per_file_sample]
            t = time.perf_counter()
            for p in sample:
                r = h.run(["cat", str(tree) + p])
                assert r.ok and r.stdout == snap.raw(p), p
            per_file_sample = time.perf_counter() - t
            per_file = per_file_sample * len(paths) / len(sample)
            h.close()

    rtt = a.rtt_ms / 1000.0
    print(f"tree: {a.files} files, {len(snap)} entries read (files + dirs)")
    print(f"loopback per exec (no proxy, TCP_NODELAY):   {exec_lo * 1000:8.1f} ms")
    print(f"added RTT (delay proxy):                     {a.rtt_ms:8.1f} ms")
    print(f"per exec through the proxy:                  {exec_wan * 1000:8.1f} ms  ({exec_wan / rtt:.2f} RTT)")
    print(f"batched read, loopback (processing+transfer):{base * 1000:8.1f} ms")
    print(f"batched read through the proxy (median of {a.repeat}): {batched * 1000:8.1f} ms"
          f"  = {batched / rtt:.2f} RTT; {(batched - base) / rtt:.2f} RTT over the loopback read")
    how = ("measured" if len(sample) == len(paths)
           else f"extrapolated from {len(sample)} files ({per_file_sample:.2f} s)")
    print(f"one exec per file ({how}): {per_file:8.2f} s")
    print(f"ratio per-file / batched: {per_file / batched:8.0f}x")
    print(f"target batched < 2 RTT + transfer ({(2 * rtt + base) * 1000:.1f} ms): "
          f"{'MET' if batched < 2 * rtt + base else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
