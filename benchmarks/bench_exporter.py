"""The exporter's scrape of 4 hosts over real sshd with added RTT: parallel (what a scrape does) against a
serial baseline (one host after the other), measured in the same run.

    .venv/bin/python benchmarks/bench_exporter.py [--rtt-ms 25] [--profile large] [--repeat 5]

Needs the testbed's four extra sshds (h1..h4 on 127.0.2.1-4: scripts/testbed.sh start && scripts/testbed.sh
hosts-up 4). Each host is reached
through its own TCP delay proxy (vgpuvirt.testing.delayproxy) adding --rtt-ms, and reads the same profile
materialized on tmpfs as its sysfs. Prints, for a scrape of the 4 hosts: best and median wall time of the
parallel collection (vgpuvirt.observe.exporter.ParallelScraper, what each /metrics request runs) and of the
serial one, their ratio, and the round trips per host per collection (1 is the goal).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vgpuvirt.host.ssh import SSHHost, no_retry  # noqa: E402
from vgpuvirt.observe.collect import Collector  # noqa: E402
from vgpuvirt.observe.exporter import ParallelScraper  # noqa: E402
from vgpuvirt.observe.prometheus import families  # noqa: E402
from vgpuvirt.sim import materialize  # noqa: E402
from vgpuvirt.testing.delayproxy import DelayProxy  # noqa: E402


def known_hosts_for(env: dict[str, object], real: str, port: int) -> str:
    """The testbed's key of sshd ``real`` (``[127.0.2.1]:2222``), also listed for the proxy's port."""
    lines = [f"[127.0.0.1]:{port} {line.split(' ', 1)[1]}"
             for line in Path(str(env["known_hosts"])).read_text().splitlines()
             if line.split(" ", 1)[0] == real]
    fd, path = tempfile.mkstemp(prefix="bench-exporter-kh-")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def scrape_figures(env: dict[str, object], tree: str, rtt_ms: float, repeat: int,
                   programs: dict[str, str] | None = None, nhosts: int = 4) -> dict[str, object]:
    """A scrape of ``nhosts`` testbed hosts (h1..), each through its own delay proxy and reading ``tree``:
    the parallel scrape (ParallelScraper + the families, what /metrics runs) and the serial baseline."""
    extra = list(env.get("hosts") or [])[:nhosts]  # type: ignore[call-overload]
    if len(extra) < nhosts:
        raise SystemExit(f"needs {nhosts} extra sshds in the testbed: scripts/testbed.sh hosts-up {nhosts}")
    proxies, hosts = [], []
    try:
        for h in extra:
            proxy = DelayProxy((h["ssh_host"], int(h["ssh_port"])), rtt_ms=rtt_ms).start()
            proxies.append(proxy)
            port = int(proxy.address[1])
            hosts.append(SSHHost("127.0.0.1", port=port, username=str(env.get("ssh_user", "root")),
                                 key_filename=str(env["identity"]), retry=no_retry, sysfs_root=tree,
                                 known_hosts=known_hosts_for(env, f"[{h['ssh_host']}]:{h['ssh_port']}", port)))
        collector = Collector(programs=programs) if programs else Collector()
        scraper = ParallelScraper(hosts, timeout=60, collector=collector)
        warm = scraper.scrape()               # connections and resident agents up, as in a running exporter
        assert all(h.up for h in warm.hosts), [h.error for h in warm.hosts]
        out: dict[str, object] = {
            "gpus": sum(len(h.gpus) for h in warm.hosts), "round_trips": [h.round_trips for h in warm.hosts],
            "parallel": timed(lambda: list(families(scraper.scrape(), scraper.xid_snapshot())), repeat),
            "serial": timed(lambda: [collector.collect(h) for h in hosts], repeat),
            "one": timed(lambda: collector.collect(hosts[0]), repeat)}
        scraper.close()
        return out
    finally:
        for h in hosts:
            h.close()
        for p in proxies:
            p.stop()


def print_scrape(f: dict[str, object], nhosts: int = 4) -> None:
    par, ser, one = (list(f[k]) for k in ("parallel", "serial", "one"))  # type: ignore[call-overload]
    pm, sm = statistics.median(par), statistics.median(ser)
    print(f"exporter scrape of {nhosts} hosts ({f['gpus']} GPUs), round trips per host per collection: "
          f"{f['round_trips']}")
    om = statistics.median(one)
    print(f"  one host's collection:         best {min(one) * 1000:7.1f} ms, median {om * 1000:7.1f} ms")
    print(f"  parallel (what /metrics runs): best {min(par) * 1000:7.1f} ms, median {pm * 1000:7.1f} ms")
    print(f"  serial baseline, same run:     best {min(ser) * 1000:7.1f} ms, median {sm * 1000:7.1f} ms")
    print(f"  serial / parallel (median):    {sm / pm:.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--profile", default="large")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    env = json.loads(Path(os.environ.get("VGPUVIRT_SBX", "/tmp/vgpuvirt-testbed"), "testbed.json").read_text())
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tree = tempfile.mkdtemp(prefix=f"bench-exporter-{a.profile}-", dir=shm)
    try:
        n = materialize(a.profile, tree)
        print(f"profile {a.profile}: {n} entries in {tree}; each host through a proxy adding {a.rtt_ms:.0f} ms RTT "
              "(no nvidia-smi on these hosts: benchmarks/bench_metrics.py runs the same with the simulator's answers)")
        print_scrape(scrape_figures(env, tree, a.rtt_ms, a.repeat))
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
