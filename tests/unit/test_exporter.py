"""The exporter: metric families from a snapshot (names, labels, units; absent stays absent), the parallel
scrape with a per-host deadline (a hanging host is ``up 0`` and does not hold up the others, and is not asked
again while its collection hangs), scrapes that overlap sharing one collection per host (never a false
``up 0``), the last complete collection standing in with its age, the budget from Prometheus's scrape-timeout
header, and ``vgpuvirt exporter --listen`` serving /metrics (and only /metrics) over HTTP."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vgpuvirt.host.base import BaseHost
from vgpuvirt.observe.exporter import ParallelScraper, SnapshotCollector, parse_listen
from vgpuvirt.observe.prometheus import families, metric_names
from vgpuvirt.services.metrics_model import (
    GpuMetrics,
    Health,
    HostMetrics,
    MetricsSnapshot,
    TypeUse,
    VgpuMetrics,
    Xid,
)
from vgpuvirt.sim import SimHost

REPO = Path(__file__).resolve().parents[2]


def _snap() -> MetricsSnapshot:
    v = VgpuMetrics(id="4ae483b5-cc51-5bee-aa6b-4e41df574daa", kind="mdev", parent="0000:3b:00.0",
                    type_id="nvidia-231", type_name="GRID T4-2Q", vm_name="desk-001",
                    vm_uuid="11111111-2222-3333-4444-555555555555", fb_total_mib=2048, fb_used_mib=512,
                    sm_util_pct=37.0, encoder_fps=59.5, encoder_latency_us=1500.0, frl_enabled=False)
    g = GpuMetrics(address="0000:3b:00.0", name="Tesla T4", uuid="GPU-abc", mode="mdev-vgpu", sizing="equal",
                   fb_total_mib=16384, fb_used_mib=2048, sm_util_pct=41.0, temperature_c=55.0, power_w=None,
                   types=(TypeUse("nvidia-231", "GRID T4-2Q", 2048, 7, 1),), xids=(Xid(79, 12.5, "fell off"),),
                   xids_since_boot=(13, 79), health=Health(False, ("XID 79: GPU has fallen off the bus",)),
                   vgpus=(v,))
    return MetricsSnapshot(collected_at=0.0, hosts=(
        HostMetrics(host="h1", up=True, collected_at=0.0, duration_s=0.02, round_trips=1, driver_version="550",
                    gpus=(g,)),
        HostMetrics(host="h2", up=False, collected_at=0.0, error="no answer within 2 s")))


def _samples(snap: MetricsSnapshot, xids: dict[tuple[str, str, int], int] | None = None) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in families(snap, xids):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_gpu_series_use_dcgm_names_units_and_labels():
    s = _samples(_snap())
    labels = {"host": "h1", "gpu": "0000:3b:00.0", "UUID": "GPU-abc", "modelName": "Tesla T4"}
    assert s["DCGM_FI_DEV_GPU_UTIL"] == [(labels, 41.0)]
    assert s["DCGM_FI_DEV_FB_USED"] == [(labels, 2048.0)]                 # MiB, as dcgm-exporter
    assert s["DCGM_FI_DEV_FB_FREE"] == [(labels, 14336.0)]
    assert s["DCGM_FI_DEV_XID_ERRORS"] == [(labels, 79.0)]                # the last XID's code
    assert "DCGM_FI_DEV_POWER_USAGE" not in s                             # unknown: absent, never 0
    assert s["vgpuvirt_gpu_healthy"] == [(labels, 0.0)]
    assert s["vgpuvirt_gpu_health_reason"][0][0]["reason"].startswith("XID 79")


def test_vgpu_series_carry_the_vm_and_base_units():
    s = _samples(_snap())
    (labels, value), = s["vgpuvirt_vgpu_framebuffer_used_bytes"]
    assert value == 512 * 2**20
    assert labels == {"host": "h1", "gpu": "0000:3b:00.0", "vgpu": "4ae483b5-cc51-5bee-aa6b-4e41df574daa",
                      "type": "nvidia-231", "type_name": "GRID T4-2Q", "vm": "desk-001",
                      "vm_uuid": "11111111-2222-3333-4444-555555555555"}
    assert s["vgpuvirt_vgpu_sm_utilization_ratio"][0][1] == pytest.approx(0.37)
    assert s["vgpuvirt_vgpu_encoder_latency_seconds"][0][1] == pytest.approx(0.0015)
    assert s["vgpuvirt_vgpu_frame_rate_limiter_enabled"][0][1] == 0.0
    assert "vgpuvirt_vgpu_encoder_sessions" not in s
    assert s["vgpuvirt_vgpu_type_fits_now"] == [({"host": "h1", "gpu": "0000:3b:00.0", "type": "nvidia-231",
                                                  "type_name": "GRID T4-2Q"}, 7.0)]


def test_down_host_is_up_0_with_its_reason_and_no_gpu_series():
    s = _samples(_snap())
    assert sorted((lab["host"], v) for lab, v in s["vgpuvirt_host_up"]) == [("h1", 1.0), ("h2", 0.0)]
    info = {lab["host"]: lab["error"] for lab, _ in s["vgpuvirt_host_info"]}
    assert info["h2"] == "no answer within 2 s"
    assert all(lab["host"] == "h1" for lab, _ in s["DCGM_FI_DEV_FB_TOTAL"])


def test_xid_counter_and_every_emitted_name_is_listed():
    s = _samples(_snap(), {("h1", "0000:3b:00.0", 79): 2})
    assert s["vgpuvirt_gpu_xid_errors_total"] == [({"host": "h1", "gpu": "0000:3b:00.0", "xid": "79"}, 2.0)]
    assert set(s) - {n for n in s if n.endswith("_created")} <= set(metric_names())


def test_names_follow_prometheus_conventions():
    for name in metric_names():
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name)
        if name.startswith("vgpuvirt_"):
            assert name == name.lower() and not name.endswith(("_mib", "_percent", "_ms"))


class HangingHost(BaseHost):
    """A host whose transport hangs until released (a link that stopped answering)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = threading.Event()
        self.calls = 0

    def _exchange(self, request, *, idempotent):
        self.calls += 1
        self.release.wait(30)
        raise OSError("link gone")


def test_a_hanging_host_is_up_0_within_the_deadline_and_not_asked_again():
    fast = [SimHost.from_profile("t4x2", name="a"), SimHost.from_profile("t4x2", name="b")]
    hung = HangingHost("hung")
    scraper = ParallelScraper([*fast, hung], timeout=0.5)
    try:
        t0 = time.monotonic()
        snap = scraper.scrape()
        took = time.monotonic() - t0
        up = {h.host: h.up for h in snap.hosts}
        assert up == {"a": True, "b": True, "hung": False}
        assert took < 5, "the hanging host held the scrape beyond its deadline"
        assert "no answer within 0.5 s" in snap.host("hung").error
        assert len(snap.host("a").gpus) == 2
        again = scraper.scrape()
        assert again.host("hung").error == "no answer within 0.5 s"
        assert hung.calls == 1                      # not piled up behind the hanging one
        hung.release.set()                          # the link fails at last: the host is asked again
        end = time.monotonic() + 10
        while not scraper._inflight["hung"].done() and time.monotonic() < end:
            time.sleep(0.05)
        third = scraper.scrape()
        assert hung.calls == 2 and not third.host("hung").up and "link gone" in third.host("hung").error
    finally:
        hung.release.set()
        scraper.close()


def test_collector_is_a_prometheus_custom_collector():
    scraper = ParallelScraper([SimHost.from_profile("t4x2", name="a")], timeout=5)
    try:
        names = {m.name for m in SnapshotCollector(scraper).collect()}
    finally:
        scraper.close()
    assert {"vgpuvirt_host_up", "DCGM_FI_DEV_FB_TOTAL", "vgpuvirt_vgpu_type_fits_now"} <= names


@pytest.mark.parametrize(("text", "want"), [("127.0.0.1:9835", ("127.0.0.1", 9835)), (":9835", ("0.0.0.0", 9835)),
                                            ("[::1]:9835", ("::1", 9835))])
def test_parse_listen(text, want):
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["9835", "host:", "host:0", "host:70000", "host:http"])
def test_parse_listen_refuses(text):
    from vgpuvirt.errors import InvalidSpec
    with pytest.raises(InvalidSpec, match="--listen"):
        parse_listen(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_exporter_serves_metrics_and_a_dead_host_is_up_0():
    port, dead = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vgpuvirt", "exporter", "--listen", f"127.0.0.1:{port}",
                             "sim:t4x2", "sim:a10-sriov", f"ssh://root@127.0.0.1:{dead}", "--timeout", "3"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    try:
        body = ""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        up = {s.labels["host"]: s.value for s in fams["vgpuvirt_host_up"].samples}
        assert up == {"sim:t4x2": 1.0, "sim:a10-sriov": 1.0, f"ssh://root@127.0.0.1:{dead}": 0.0}
        gpus = {(s.labels["host"], s.labels["gpu"]) for s in fams["DCGM_FI_DEV_FB_TOTAL"].samples}
        assert ("sim:t4x2", "0000:3b:00.0") in gpus and ("sim:a10-sriov", "0000:41:00.0") in gpus
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_cli_exporter_bad_listen_is_one_line():
    r = subprocess.run([sys.executable, "-m", "vgpuvirt", "--host", "sim:t4x2", "exporter", "--listen", "nowhere"],
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--listen" in r.stderr


def test_connect_per_host_or_one_for_all(capsys):
    from vgpuvirt.cli import main
    from vgpuvirt.cli.exporter import domain_sources
    one = domain_sources(["a", "b"], ["test:///default"])
    assert [d.uri for d in one.values()] == ["test:///default"] * 2
    try:
        assert "test" in [n for n, _ in one["a"]()]            # the test driver's own domain
    finally:
        for d in one.values():
            d.close()
    assert main(["exporter", "--listen", "127.0.0.1:1", "sim:t4x2", "sim:gvtg", "sim:desktop",
                 "--connect", "test:///default", "--connect", "test:///default"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one per host (3)" in err


def test_an_injected_xid_reaches_the_exporter_once():
    """The simulator's fault -> the kernel log -> health, DCGM_FI_DEV_XID_ERRORS and the XID counter, which
    counts each XID once however many scrapes see the kernel log."""
    host = SimHost.from_profile("t4x2", name="x")
    scraper = ParallelScraper([host], timeout=10)
    try:
        def scrape() -> dict[str, list]:
            fams = list(SnapshotCollector(scraper).collect())
            return {f.name: [(s.labels, s.value) for s in f.samples if s.labels.get("gpu") == "0000:3b:00.0"]
                    for f in fams}
        before = scrape()
        assert [v for _, v in before["vgpuvirt_gpu_healthy"]] == [1.0]
        assert [v for _, v in before["DCGM_FI_DEV_XID_ERRORS"]] == [0.0]
        host.model.telemetry.inject_xid("0000:3b:00.0", 79)
        after = scrape()
        assert [v for _, v in after["DCGM_FI_DEV_XID_ERRORS"]] == [79.0]
        assert [v for _, v in after["vgpuvirt_gpu_healthy"]] == [0.0]
        assert [(lab["xid"], v) for lab, v in after["vgpuvirt_gpu_xid_errors"]] == [("79", 1.0)]
        again = scrape()
        assert [(lab["xid"], v) for lab, v in again["vgpuvirt_gpu_xid_errors"]] == [("79", 1.0)]
        host.model.telemetry.inject_xid("0000:3b:00.0", 79)
        third = scrape()
        assert [(lab["xid"], v) for lab, v in third["vgpuvirt_gpu_xid_errors"]] == [("79", 2.0)]
    finally:
        scraper.close()


def test_scheduler_set_through_the_registry_shows_in_the_exporter_after_a_driver_reload():
    from vgpuvirt.change.scheduler import apply_schedulers
    from vgpuvirt.services.scheduler.model import SchedulerSetting
    from vgpuvirt.services.scheduler.service import plan_schedulers
    host = SimHost.from_profile("t4x2", name="s")
    host.model.sched.nvml_supported = False
    scraper = ParallelScraper([host], timeout=10)

    def policy() -> str:
        fam = next(f for f in SnapshotCollector(scraper).collect() if f.name == "vgpuvirt_gpu_scheduler_info")
        return next(s.labels["policy"] for s in fam.samples if s.labels["gpu"] == "0000:3b:00.0")
    try:
        assert policy() == "best-effort"
        apply_schedulers(host, plan_schedulers(host, {"0000:3b:00.0": SchedulerSetting(policy="fixed-share")}))
        assert policy() == "best-effort"                # pending: the driver has not reloaded
        host.model.sched.reload_driver()
        assert policy() == "fixed-share"
    finally:
        scraper.close()


class GatedCollector:
    """A Collector whose collections wait for ``gate`` (a host that answers slowly) and are counted."""

    def __init__(self) -> None:
        from vgpuvirt.observe.collect import Collector
        self.real = Collector()
        self.gate = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()

    def collect(self, host, domains=None):
        with self.lock:
            self.calls += 1
        self.gate.wait(30)
        return self.real.collect(host, domains=domains)


def test_overlapping_scrapes_share_one_collection_and_both_see_the_host_up():
    """Two Prometheus servers scrape at once: the second finds the first's collection in flight and waits for
    it (the old code reported that host ``up 0``: "its previous collection is still running")."""
    gated = GatedCollector()
    scraper = ParallelScraper([SimHost.from_profile("t4x2", name="a")], collector=gated)
    got: list[MetricsSnapshot] = []
    try:
        threads = [threading.Thread(target=lambda: got.append(scraper.scrape(20))) for _ in range(2)]
        for t in threads:
            t.start()
        end = time.monotonic() + 10
        while gated.calls < 1 and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.2)                       # the second scrape has arrived and found the collection in flight
        gated.gate.set()
        for t in threads:
            t.join(30)
    finally:
        gated.gate.set()
        scraper.close()
    assert [s.host("a").up for s in got] == [True, True]
    assert gated.calls == 1
    assert got[0].host("a") is got[1].host("a")


def test_a_late_host_is_served_from_its_last_collection_with_its_age_then_down_after_max_age():
    gated = GatedCollector()
    gated.gate.set()
    scraper = ParallelScraper([SimHost.from_profile("t4x2", name="a")], collector=gated, max_age=3600)
    try:
        first = scraper.scrape(20)
        assert first.host("a").up
        gated.gate.clear()                    # the host stops answering
        late = scraper.scrape(0.2)
        assert late.host("a") is first.host("a")         # the last complete one, not "up 0"
        fams = {f.name: f for f in families(late)}
        (age,) = fams["vgpuvirt_host_collection_age_seconds"].samples
        assert age.labels == {"host": "a"} and age.value == late.collected_at - first.host("a").collected_at > 0
        scraper.max_age = 0.0                 # too old now: the host is down, with the reason
        old = scraper.scrape(0.2)
        assert not old.host("a").up and old.host("a").error == "no answer within 0.2 s"
        assert gated.calls == 2               # the stuck collection was not asked again
    finally:
        gated.gate.set()
        scraper.close()


def test_xids_are_counted_once_per_collection_however_many_scrapes_serve_it():
    host = SimHost.from_profile("t4x2", name="x")
    host.model.telemetry.inject_xid("0000:3b:00.0", 79)
    gated = GatedCollector()
    scraper = ParallelScraper([host], collector=gated)
    try:
        threads = [threading.Thread(target=scraper.scrape, args=(20,)) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        gated.gate.set()
        for t in threads:
            t.join(30)
        assert gated.calls == 1
        assert scraper.xid_snapshot() == {("x", "0000:3b:00.0", 79): 1}
    finally:
        gated.gate.set()
        scraper.close()


@pytest.mark.parametrize(("timeout", "header", "want"), [
    (None, None, 7.5),             # below Prometheus's default scrape timeout (10 s), never equal to it
    (None, "10", 7.5), (None, "2", 1.5), (30.0, "4", 3.0), (1.0, "10", 1.0), (5.0, None, 5.0),
    (None, "nan", 7.5), (None, "inf", 7.5), (None, "-1", 7.5), (None, "0", 7.5), (None, "soon", 7.5),
    (None, "1e9", 7.5),
])
def test_the_budget_is_a_fraction_of_prometheus_scrape_timeout(timeout, header, want):
    from vgpuvirt.observe.exporter import scrape_budget
    assert scrape_budget(timeout, header) == want


@pytest.fixture
def served():
    from vgpuvirt.observe.exporter import serve
    gated = GatedCollector()
    gated.gate.set()
    scraper = ParallelScraper([SimHost.from_profile("t4x2", name="a")], collector=gated)
    port = _free_port()
    server, _ = serve(scraper, "127.0.0.1", port)
    yield port, gated
    server.shutdown()
    server.server_close()
    gated.gate.set()
    scraper.close()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    import urllib.error
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("path", ["/nope", "/metricsx", "/metrics/", "/" + "a" * 8192, "/favicon.ico"])
def test_only_metrics_collects_other_paths_are_404_without_collecting(served, path):
    port, gated = served
    code, body = _get(port, path)
    assert code in (404, 414) and "vgpuvirt_host_up" not in body
    assert gated.calls == 0


def test_metrics_and_the_index_page(served):
    port, gated = served
    code, page = _get(port, "/")
    assert code == 200 and 'href="/metrics"' in page and gated.calls == 0
    code, body = _get(port, "/metrics?name[]=x")
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    assert code == 200 and [s.value for s in fams["vgpuvirt_host_up"].samples] == [1.0]
    assert gated.calls == 1


def test_the_scrape_timeout_header_sets_the_budget(served):
    """A stuck host costs its own series within 3/4 of the timeout Prometheus sends, not the scrape."""
    port, gated = served
    gated.gate.clear()
    code, body = _get(port, "/metrics", {"X-Prometheus-Scrape-Timeout-Seconds": "0.4"})
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    assert code == 200 and [s.value for s in fams["vgpuvirt_host_up"].samples] == [0.0]
    (info,) = fams["vgpuvirt_host_info"].samples
    assert info.labels["error"] == "no answer within 0.3 s"
