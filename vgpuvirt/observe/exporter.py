"""The Prometheus exporter: scrapes share collections, each host within its own budget.

A scrape asks every host for one collection (one round trip each, :class:`~vgpuvirt.observe.collect.Collector`),
run in a thread pool, and waits for them until the scrape's **budget**: ``--timeout``, or less when Prometheus
says how long it will wait (its ``X-Prometheus-Scrape-Timeout-Seconds`` header; the budget is then
:data:`BUDGET_FRACTION` of it, so that rendering and sending fit too and a stuck host never costs the scrape).

Scrapes overlap (two Prometheus servers of an HA pair, a person with curl): a host has at most one collection
in flight, and every scrape that arrives while it runs waits for that same collection instead of starting
another or reporting the host down. A host whose collection has not ended within the budget is served from its
last complete collection while that is younger than ``max_age`` (its age is the
``vgpuvirt_host_collection_age_seconds`` series), else it is ``vgpuvirt_host_up 0`` with the reason. So a host
is reported down only when it failed, or gave nothing for ``max_age`` seconds. Each collection's new XIDs are
counted once, when that collection ends, however many scrapes serve it.

Only ``GET /metrics`` collects; ``/`` is a short page with a link; anything else is 404 without collecting.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PromCollector

from vgpuvirt.host.base import Host
from vgpuvirt.observe.collect import Collector
from vgpuvirt.observe.prometheus import families
from vgpuvirt.services.metrics_model import HostMetrics, MetricsSnapshot

#: (domain name, domain XML) pairs of a host's libvirt, asked at each scrape (VMs come and go)
DomainSource = Callable[[], Iterable[tuple[str, str]]]

#: the share of Prometheus's scrape timeout a scrape may spend waiting for hosts (the rest: render and send)
BUDGET_FRACTION = 0.75
#: the budget when neither --timeout nor Prometheus says: below Prometheus's default scrape timeout (10 s)
DEFAULT_BUDGET = 7.5
#: how long a host's last complete collection may stand in for one that has not ended
DEFAULT_MAX_AGE = 60.0
#: a scrape timeout header above this is not believed (a scrape that long is not a scrape)
_MAX_HEADER_TIMEOUT = 600.0


def scrape_budget(timeout: float | None, header: str | None) -> float:
    """Seconds a scrape waits for its hosts: ``timeout`` (``--timeout``; None: :data:`DEFAULT_BUDGET`), lowered
    to :data:`BUDGET_FRACTION` of Prometheus's scrape timeout when its header gives a usable one."""
    budget = DEFAULT_BUDGET if timeout is None else float(timeout)
    try:
        said = float(header) if header is not None else None
    except ValueError:
        said = None
    if said is not None and 0 < said <= _MAX_HEADER_TIMEOUT:     # NaN, inf, 0 and negatives fall through
        budget = min(budget, said * BUDGET_FRACTION)
    return budget


class ParallelScraper:
    """Collects a set of hosts in parallel, one collection in flight per host shared by every scrape that
    arrives while it runs; thread-safe (scrapes may overlap)."""

    def __init__(self, hosts: Sequence[Host], *, timeout: float | None = None,
                 domains: Mapping[str, DomainSource] | None = None, collector: Collector | None = None,
                 max_age: float = DEFAULT_MAX_AGE) -> None:
        if not hosts:
            raise ValueError("no hosts to scrape")
        self.hosts = list(hosts)
        self.timeout = timeout
        self.max_age = float(max_age)
        self.domains = dict(domains or {})
        self.collector = collector or Collector()
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.hosts)), thread_name_prefix="vgpuvirt-scrape")
        self._inflight: dict[str, Future[HostMetrics]] = {}
        self._last: dict[str, HostMetrics] = {}         # each host's last complete collection that answered
        self._lock = threading.Lock()
        self.xid_counts: dict[tuple[str, str, int], int] = {}

    def _collect(self, host: Host) -> HostMetrics:
        src = self.domains.get(host.name)
        doms = list(src()) if src is not None else None
        result = self.collector.collect(host, domains=doms)
        with self._lock:                 # once per collection, not per scrape that serves it
            for g in result.gpus if result.up else ():
                for x in g.xids or ():
                    key = (result.host, g.address, x.code)
                    self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
            if result.up:
                self._last[result.host] = result
        return result

    def _collection(self, host: Host) -> Future[HostMetrics]:
        """The host's collection in flight, or a new one (called under the lock)."""
        f = self._inflight.get(host.name)
        if f is None or f.done():
            f = self._inflight[host.name] = self._pool.submit(self._collect, host)
        return f

    def scrape(self, budget: float | None = None) -> MetricsSnapshot:
        """One snapshot of every host, waiting at most ``budget`` seconds (default: ``timeout`` or
        :data:`DEFAULT_BUDGET`) for collections in flight."""
        wait = budget if budget is not None else scrape_budget(self.timeout, None)
        started = time.time()
        with self._lock:
            futures = {h.name: self._collection(h) for h in self.hosts}
        wait_futures(list(futures.values()), timeout=wait)
        results = [self._result(h, futures[h.name], started, wait) for h in self.hosts]
        return MetricsSnapshot(collected_at=started, hosts=tuple(results))

    def _result(self, h: Host, f: Future[HostMetrics], started: float, wait: float) -> HostMetrics:
        if f.done():
            try:
                return f.result()
            except Exception as exc:   # a bug or an unexpected library error: this host only
                return self._down(h, started, f"{type(exc).__name__}: {exc}")
        with self._lock:
            last = self._last.get(h.name)
        if last is not None and started - last.collected_at <= self.max_age:
            return last                # its age shows in vgpuvirt_host_collection_age_seconds
        return self._down(h, started, f"no answer within {wait:g} s")

    @staticmethod
    def _down(h: Host, started: float, why: str) -> HostMetrics:
        return HostMetrics(host=h.name, up=False, collected_at=started, error=why)

    def xid_snapshot(self) -> dict[tuple[str, str, int], int]:
        with self._lock:
            return dict(self.xid_counts)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class SnapshotCollector(PromCollector):
    """A prometheus_client custom collector: each ``collect()`` is one scrape of every host."""

    def __init__(self, scraper: ParallelScraper, budget: float | None = None) -> None:
        self.scraper = scraper
        self.budget = budget

    def collect(self) -> Iterator[Metric]:
        snap = self.scraper.scrape(self.budget)
        yield from families(snap, self.scraper.xid_snapshot())

    def describe(self) -> list[Metric]:
        return []          # no collection when the collector is registered


_INDEX = """<!doctype html><html><head><title>vgpuvirt exporter</title></head><body>
<h1>vgpuvirt exporter</h1><p><a href="/metrics">/metrics</a> ({hosts} hosts)</p></body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    """``GET /metrics`` (query string ignored) collects; ``GET /`` is a page; the rest is 404, collecting nothing."""

    scraper: ParallelScraper        # set on the subclass :func:`serve` makes
    server_version = "vgpuvirt-exporter"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            budget = scrape_budget(self.scraper.timeout, self.headers.get("X-Prometheus-Scrape-Timeout-Seconds"))
            body = generate_latest(_Once(SnapshotCollector(self.scraper, budget)))
            self._send(200, CONTENT_TYPE_LATEST, body)
        elif path == "/":
            page = _INDEX.format(hosts=len(self.scraper.hosts))
            self._send(200, "text/html; charset=utf-8", page.encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: this exporter serves /metrics\n")

    def do_HEAD(self) -> None:
        self._send(404 if self.path.split("?", 1)[0] not in ("/", "/metrics") else 200, "text/plain", b"",
                   head=True)

    def _send(self, code: int, ctype: str, body: bytes, head: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass               # a scrape every few seconds is not news; errors reach the metrics themselves


class _Once:
    """What generate_latest wants: an object whose ``collect()`` yields the families (one scrape)."""

    def __init__(self, collector: SnapshotCollector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        return self.collector.collect()


class _Server(ThreadingHTTPServer):
    daemon_threads = True     # a client that never reads its answer does not keep the exporter from exiting


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(scraper: ParallelScraper, addr: str, port: int) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` on addr:port in a thread; returns (server, thread). ``server.shutdown()`` stops it."""
    handler = type("Handler", (_Handler,), {"scraper": scraper})
    if ":" in addr:
        server: ThreadingHTTPServer = _Server6((addr, port), handler)
    else:
        server = _Server((addr, port), handler)
    # shutdown() returns once the loop polls again: every 0.5 s by default, so each stop (SIGTERM, a test's
    # teardown) waited up to half a second; ten idle polls a second cost nothing
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="vgpuvirt-exporter",
                              daemon=True)
    thread.start()
    return server, thread


def parse_listen(text: str) -> tuple[str, int]:
    """``ADDR:PORT``, ``:PORT`` (all addresses) or ``[v6]:PORT``; a clear error otherwise."""
    from vgpuvirt.errors import InvalidSpec
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec("--listen", text, "ADDR:PORT such as 127.0.0.1:9835 or :9835")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 -- ":PORT" asks for every address, as exporters do
    return host, int(port)
