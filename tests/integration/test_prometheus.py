"""A real Prometheus server (Debian's ``prometheus``, on loopback, its own config, port and storage) scrapes
the exporter over simulated hosts whose vGPUs belong to VMs provisioned on libvirt's test driver, plus two
hosts that never answer (a closed port, and a port that accepts but never speaks SSH). PromQL through the
HTTP API then returns each VM's series, and the silent hosts are ``vgpuvirt_host_up 0`` without holding up
the others. Two Prometheus servers (an HA pair) scraping one exporter at the same instants, one host stuck,
record no false ``up 0`` and lose no scrape. The Grafana dashboard's expressions use only metric names the
exporter emits."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.observe.exporter import ParallelScraper, serve
from vgpuvirt.observe.prometheus import metric_names
from vgpuvirt.sim import SimHost

pytestmark = pytest.mark.integration
libvirt = pytest.importorskip("libvirt")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never sends an SSH banner: a host that hangs."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _prometheus(tmp: Path, target_port: int, interval: float) -> tuple[subprocess.Popen[bytes], int]:
    require_part("prometheus", shutil.which("prometheus") is not None,
                 "apt-get install prometheus (testbed.sh install)")
    tmp.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: {interval}s
  scrape_timeout: {interval}s
scrape_configs:
  - job_name: vgpuvirt
    static_configs:
      - targets: ['127.0.0.1:{target_port}']
""")
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"))  # noqa: SIM115
    return proc, port


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _wait_for(port: int, promql: str, want: int, deadline_s: float = 60.0) -> list[dict[str, Any]]:
    """Poll until the query returns ``want`` series (Prometheus needs a scrape or two); not a speed test."""
    end = time.monotonic() + deadline_s
    got: list[dict[str, Any]] = []
    while time.monotonic() < end:
        try:
            got = _query(port, promql)
        except OSError:
            got = []
        if len(got) >= want:
            return got
        time.sleep(0.5)
    return got


@pytest.fixture
def provisioned() -> Iterator[tuple[list[SimHost], Any, dict[str, tuple[str, str]]]]:
    """Two simulated hosts with VMs provisioned on libvirt's test driver: {vm: (host, mdev uuid)}."""
    from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
    from vgpuvirt.provision import VgpuRequest, VmRequest, provision
    conn = LibvirtConnection("test:///default", retry=no_retry)
    hosts = [SimHost.from_profile("t4x2", name="sim-a"), SimHost.from_profile("t4x2", name="sim-b")]
    prefixes: dict[str, str] = {}
    for h in hosts:
        prefix = f"prom-{h.name[-1]}-{uuid.uuid4().hex[:4]}"
        r = provision(h, conn, VmRequest.pool(prefix, 2, gpu=VgpuRequest(type="nvidia-231")))
        assert r.applied is not None
        prefixes[prefix] = h.name
    owners: dict[str, tuple[str, str]] = {}        # which mdev each VM holds, from the domains themselves
    for name, xml in conn.domain_xml_pairs():
        for prefix, host in prefixes.items():
            if name.startswith(prefix + "-"):
                m = re.search(r"<hostdev[^>]*mdev.*?<address uuid=.([0-9a-f-]{36})", xml, re.S)
                assert m, xml
                owners[name] = (host, m[1])
    assert len(owners) == 4
    yield hosts, conn, owners
    for name in owners:
        conn.destroy(name)
        conn.undefine(name)
    conn.close()


@pytest.mark.slow
def test_prometheus_scrapes_the_exporter_and_promql_returns_each_vms_series(
        tmp_path, provisioned, silent_port):
    hosts, conn, owners = provisioned
    dead = SSHHost("127.0.0.1", port=_free_port(), connect_timeout=30)          # refused at once
    # never answers; a longer connect timeout only makes the end of the test wait for the hung collection
    hung = SSHHost("127.0.0.1", port=silent_port, connect_timeout=5)
    every = [*hosts, dead, hung]
    scraper = ParallelScraper(every, timeout=1.5,
                              domains={h.name: conn.domain_xml_pairs for h in hosts})
    port = _free_port()
    server, _ = serve(scraper, "127.0.0.1", port)
    prom, prom_port = _prometheus(tmp_path, port, interval=3)
    try:
        up = _wait_for(prom_port, "vgpuvirt_host_up", len(every))
        state = {s["metric"]["host"]: s["value"][1] for s in up}
        assert state == {"sim-a": "1", "sim-b": "1", dead.name: "0", hung.name: "0"}, up
        # the silent host did not hold the others up: the scrape ended within the exporter's deadline
        assert float(_query(prom_port, "scrape_duration_seconds")[0]["value"][1]) < 3

        series = _wait_for(prom_port, 'vgpuvirt_vgpu_info{vm!=""}', len(owners))
        got = {s["metric"]["vm"]: (s["metric"]["host"], s["metric"]["vgpu"], s["metric"]["type"]) for s in series}
        assert got == {vm: (h, md, "nvidia-231") for vm, (h, md) in owners.items()}
        for vm, (h, md) in owners.items():
            fb = _query(prom_port, f'vgpuvirt_vgpu_framebuffer_total_bytes{{vm="{vm}"}}')
            assert [(s["metric"]["host"], s["metric"]["vgpu"], s["value"][1]) for s in fb] == [
                (h, md, str(2048 << 20))]
        # per-GPU dcgm-exporter names, per host and GPU
        fb_total = _query(prom_port, "DCGM_FI_DEV_FB_TOTAL")
        assert {(s["metric"]["host"], s["metric"]["gpu"], s["metric"]["modelName"], s["value"][1])
                for s in fb_total} == {(h.name, g, "Tesla T4", "16384")
                                       for h in hosts for g in ("0000:3b:00.0", "0000:d8:00.0")}
        util = _query(prom_port, "DCGM_FI_DEV_GPU_UTIL")
        assert {(s["metric"]["host"], s["metric"]["gpu"]) for s in util} == {
            (h.name, g) for h in hosts for g in ("0000:3b:00.0", "0000:d8:00.0")}
        sm = _query(prom_port, 'vgpuvirt_vgpu_sm_utilization_ratio{vm!=""}')
        assert {s["metric"]["vm"] for s in sm} == set(owners)
        assert all(0 <= float(s["value"][1]) <= 1 for s in sm)
        # capacity left per type, summed over the fleet: 2 T4s per host, 8 x 2Q each, 2 taken per host
        left = _query(prom_port, 'sum by (type) (vgpuvirt_vgpu_type_fits_now{type="nvidia-231"})')
        assert left and float(left[0]["value"][1]) == 2 * (8 + 8) - 4
        # a VM's use through its vm label (the Grafana per-VM panel's expression)
        per_vm = _query(prom_port, 'sum by (vm) (vgpuvirt_vgpu_info{vm!=""})')
        assert {s["metric"]["vm"] for s in per_vm} == set(owners)
    finally:
        prom.terminate()
        prom.wait(timeout=20)
        server.shutdown()
        scraper.close()
        dead.close()
        hung.close()


class CountingScraper(ParallelScraper):
    """Counts the scrapes in progress at once, to prove the two servers really did overlap."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.now = self.most = self.total = 0
        self.count_lock = threading.Lock()

    def scrape(self, budget: float | None = None) -> Any:
        with self.count_lock:
            self.now += 1
            self.total += 1
            self.most = max(self.most, self.now)
        try:
            return super().scrape(budget)
        finally:
            with self.count_lock:
                self.now -= 1


@pytest.mark.waits
@pytest.mark.slow
def test_two_prometheus_servers_one_stuck_host_no_false_down_and_no_lost_scrape(tmp_path, silent_port):
    """An HA pair (same config, so the same scrape phase: both scrape at the same instants) scrapes one exporter
    whose third host never answers. Every scrape of both servers succeeds (``up`` 1, shorter than the scrape
    timeout: the stuck host costs its own series, from Prometheus's timeout header, not the scrape), the two
    simulated hosts are never ``vgpuvirt_host_up 0``, the stuck one always is."""
    hosts = [SimHost.from_profile("t4x2", name="sim-a"), SimHost.from_profile("t4x2", name="sim-b")]
    # stuck for good: each collection hangs 5 s in the SSH handshake, fails, and the next one hangs again
    # (a longer connect timeout only makes the test wait for it at the end)
    hung = SSHHost("127.0.0.1", port=silent_port, connect_timeout=5)
    scraper = CountingScraper([*hosts, hung])          # no --timeout: the budget comes from each scrape's header
    port = _free_port()
    server, _ = serve(scraper, "127.0.0.1", port)
    interval, window = 2, 60          # the minute: 30 scrapes per server
    proms = [_prometheus(tmp_path / f"prom{i}", port, interval=interval) for i in (1, 2)]
    try:
        for _, pport in proms:
            assert _wait_for(pport, 'up{job="vgpuvirt"}', 1)
        time.sleep(window)
        w = f"[{window}s]"
        for _, pport in proms:
            scrapes = _query(pport, f'count_over_time(up{{job="vgpuvirt"}}{w})')
            assert scrapes and float(scrapes[0]["value"][1]) >= window / interval - 1, scrapes
            assert _query(pport, f'min_over_time(up{{job="vgpuvirt"}}{w})')[0]["value"][1] == "1", \
                "a scrape was lost (Prometheus recorded up 0: a timeout or an error)"
            longest = float(_query(pport, f'max_over_time(scrape_duration_seconds{{job="vgpuvirt"}}{w})')[0]
                            ["value"][1])
            assert longest < interval, f"a scrape took {longest} s, the whole scrape timeout"
            low = {s["metric"]["host"]: s["value"][1]
                   for s in _query(pport, f"min_over_time(vgpuvirt_host_up{w})")}
            high = {s["metric"]["host"]: s["value"][1]
                    for s in _query(pport, f"max_over_time(vgpuvirt_host_up{w})")}
            assert low == {"sim-a": "1", "sim-b": "1", hung.name: "0"}, "a reachable host was reported down"
            assert high[hung.name] == "0"
        assert scraper.most >= 2, f"the two servers never scraped at once ({scraper.total} scrapes)"
    finally:
        for proc, _ in proms:
            proc.terminate()
        for proc, _ in proms:
            proc.wait(timeout=20)
        server.shutdown()
        server.server_close()
        scraper.close()
        hung.close()


def _dashboard_exprs() -> list[str]:
    dash = json.loads((REPO / "examples/grafana/vgpuvirt-dashboard.json").read_text())
    out = []
    stack = list(dash.get("panels", []))
    while stack:
        p = stack.pop()
        stack.extend(p.get("panels", []))
        out += [t["expr"] for t in p.get("targets", []) if "expr" in t]
    out += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
            for v in dash.get("templating", {}).get("list", []) if v.get("type") == "query"]
    return out


_PROMQL_WORDS = {"sum", "by", "avg", "max", "min", "count", "without", "on", "ignoring", "group_left",
                 "group_right", "rate", "increase", "irate", "label_values", "topk", "bottomk", "and", "or",
                 "unless", "offset", "bool", "clamp_min", "clamp_max", "last_over_time", "max_over_time",
                 "avg_over_time", "time", "vector", "scalar", "abs", "label_replace", "sort_desc"}


def test_grafana_dashboard_uses_only_metrics_the_exporter_emits():
    exprs = _dashboard_exprs()
    assert len(exprs) >= 6
    known = set(metric_names())
    used: set[str] = set()
    for e in exprs:
        bare = re.sub(r'"[^"]*"', '""', e)                       # label values are not names
        bare = re.sub(r"\{[^}]*\}", "", bare)                       # nor are label matchers
        bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
        bare = re.sub(r"\[[^\]]*\]", "", bare)                      # ranges
        bare = re.sub(r"label_values\(([^,()]+),\s*\w+\)", r"\1", bare)   # Grafana's: the label is no metric
        used |= {w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)
                 if w not in _PROMQL_WORDS and not w.startswith("$")}
    assert used, exprs
    assert used <= known, f"the dashboard uses metrics the exporter never emits: {sorted(used - known)}"
    assert {"vgpuvirt_vgpu_type_fits_now", "DCGM_FI_DEV_GPU_UTIL"} <= used


def test_grafana_provisioning_files():
    import yaml
    prov = REPO / "examples/grafana/provisioning"
    ds = yaml.safe_load((prov / "datasources/vgpuvirt.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    provider = yaml.safe_load((prov / "dashboards/vgpuvirt.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and Path(provider["options"]["path"]).is_absolute()
    dash = json.loads((REPO / "examples/grafana/vgpuvirt-dashboard.json").read_text())
    assert dash["uid"] and {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "host"}
