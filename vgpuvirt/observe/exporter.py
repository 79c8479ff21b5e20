"""The Prometheus exporter: every scrape collects all hosts in parallel, each within its own timeout.

A scrape submits one collection per host (one round trip each, :class:`~vgpuvirt.services.metrics.Collector`)
to a thread pool and waits at most ``timeout`` seconds: a host that has not answered by then is reported
``vgpuvirt_host_up 0`` and its GPUs are absent from this scrape; the others are not held up. A host whose
previous collection is still running is not asked again (its thread would pile up behind a dead link): it
stays ``up 0`` until that collection ends. Each collection's new XIDs accumulate into a counter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from vgpuvirt.host.base import Host
from vgpuvirt.observe.prometheus import families
from vgpuvirt.services.metrics import Collector
from vgpuvirt.services.metrics_model import HostMetrics, MetricsSnapshot

#: (domain name, domain XML) pairs of a host's libvirt, asked at each scrape (VMs come and go)
DomainSource = Callable[[], Iterable[tuple[str, str]]]


class ParallelScraper:
    """Collects a set of hosts in parallel with a per-host deadline; thread-safe (scrapes may overlap)."""

    def __init__(self, hosts: Sequence[Host], *, timeout: float = 10.0,
                 domains: Mapping[str, DomainSource] | None = None, collector: Collector | None = None) -> None:
        if not hosts:
            raise ValueError("no hosts to scrape")
        self.hosts = list(hosts)
        self.timeout = float(timeout)
        self.domains = dict(domains or {})
        self.collector = collector or Collector()
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.hosts)), thread_name_prefix="vgpuvirt-scrape")
        self._inflight: dict[str, Future[HostMetrics]] = {}
        self._lock = threading.Lock()
        self.xid_counts: dict[tuple[str, str, int], int] = {}

    def _collect(self, host: Host) -> HostMetrics:
        src = self.domains.get(host.name)
        doms = list(src()) if src is not None else None
        return self.collector.collect(host, domains=doms)

    def scrape(self) -> MetricsSnapshot:
        started = time.time()
        with self._lock:
            futures: dict[str, Future[HostMetrics]] = {}
            busy: set[str] = set()
            for h in self.hosts:
                prev = self._inflight.get(h.name)
                if prev is not None and not prev.done():
                    busy.add(h.name)
                    futures[h.name] = prev
                else:
                    futures[h.name] = self._inflight[h.name] = self._pool.submit(self._collect, h)
        wait_futures([f for n, f in futures.items() if n not in busy], timeout=self.timeout)
        results = []
        for h in self.hosts:
            f = futures[h.name]
            if h.name in busy:
                results.append(self._down(h, started, "its previous collection is still running"))
            elif not f.done():
                results.append(self._down(h, started, f"no answer within {self.timeout:g} s"))
            else:
                try:
                    results.append(f.result())
                except Exception as exc:   # a bug or an unexpected library error: this host only
                    results.append(self._down(h, started, f"{type(exc).__name__}: {exc}"))
        snap = MetricsSnapshot(collected_at=started, hosts=tuple(results))
        self._count_xids(snap)
        return snap

    @staticmethod
    def _down(h: Host, started: float, why: str) -> HostMetrics:
        return HostMetrics(host=h.name, up=False, collected_at=started, error=why)

    def _count_xids(self, snap: MetricsSnapshot) -> None:
        with self._lock:
            for h in snap.hosts:
                for g in h.gpus:
                    for x in g.xids or ():
                        key = (h.host, g.address, x.code)
                        self.xid_counts[key] = self.xid_counts.get(key, 0) + 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class SnapshotCollector(PromCollector):
    """A prometheus_client custom collector: each scrape of ``/metrics`` is one parallel collection."""

    def __init__(self, scraper: ParallelScraper) -> None:
        self.scraper = scraper

    def collect(self) -> Iterator[Metric]:
        snap = self.scraper.scrape()
        yield from families(snap, dict(self.scraper.xid_counts))

    def describe(self) -> list[Metric]:
        return []          # no collection when the collector is registered


def serve(scraper: ParallelScraper, addr: str, port: int) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` on addr:port in a thread; returns (server, thread). ``server.shutdown()`` stops it."""
    from prometheus_client import start_http_server
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(scraper))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return server, thread


def parse_listen(text: str) -> tuple[str, int]:
    """``ADDR:PORT``, ``:PORT`` (all addresses) or ``[v6]:PORT``; a clear error otherwise."""
    from vgpuvirt.errors import InvalidSpec
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec("--listen", text, "ADDR:PORT such as 127.0.0.1:9835 or :9835")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 -- ":PORT" asks for every address, as exporters do
    return host, int(port)
