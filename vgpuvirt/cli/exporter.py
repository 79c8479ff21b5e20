"""``vgpuvirt exporter --listen ADDR [HOST ...]``: a Prometheus exporter over one or several hosts.

    vgpuvirt exporter --listen 127.0.0.1:9835 sim:t4x2 sim:a10-sriov
    vgpuvirt exporter --listen :9835 ssh://root@gpu1 ssh://root@gpu2 --connect qemu+ssh://root@gpu1/system ...

Every scrape of ``/metrics`` collects all hosts in parallel (one round trip each), sharing the collections
other scrapes have in flight; a host that does not answer within the scrape's budget is served from its last
collection (while recent) or is ``vgpuvirt_host_up{host=...} 0``, and never holds up the others (see
:mod:`vgpuvirt.observe.exporter`).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import InvalidSpec

if TYPE_CHECKING:
    from vgpuvirt.observe.exporter import ParallelScraper


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("exporter", help="serve Prometheus metrics of one or several hosts")
    p.add_argument("hosts", nargs="*", metavar="HOST",
                   help="hosts (local, ssh://..., sim:PROFILE); default: the global --host")
    p.add_argument("--listen", required=True, metavar="ADDR:PORT", help="where to serve /metrics, e.g. 127.0.0.1:9835")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a scrape waits for the hosts (default 7.5; never more than 3/4 of the scrape "
                        "timeout Prometheus sends)")
    p.add_argument("--connect", action="append", default=[], metavar="URI",
                   help="libvirt URI per host, in order (names the VMs owning vGPUs); one for all, or one per host")
    p.set_defaults(func=run)


class DomainsOf:
    """A host's (domain name, XML) pairs from its libvirt, asked at each scrape through one kept read-only
    connection (reopened once after a failure: libvirtd restarted, the SSH link dropped)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> Iterable[tuple[str, str]]:
        from vgpuvirt.errors import VgpuvirtError
        from vgpuvirt.libvirt_conn import LibvirtConnection
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None:
                    self._conn = LibvirtConnection(self.uri, readonly=True)
                try:
                    return list(self._conn.domain_xml_pairs())
                except VgpuvirtError:
                    self.close_locked()
                    if attempt == 2:
                        raise
            return []

    def close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


def domain_sources(names: Sequence[str], uris: Sequence[str]) -> dict[str, DomainsOf]:
    """Host name -> its domain source: ``uris`` holds one URI for every host, or one per host, in order."""
    if len(uris) == 1:
        uris = list(uris) * len(names)
    return {n: DomainsOf(u) for n, u in zip(names, uris, strict=True)}


@contextlib.contextmanager
def watched_hosts(ctx: Context, specs: Sequence[str], connect: Sequence[str],
                  timeout: float | None) -> Iterator[ParallelScraper]:
    """The hosts named on the command line (default: the global --host), each with its libvirt for the VM
    join, behind one :class:`ParallelScraper`; all closed on the way out (exporter and top share it)."""
    from vgpuvirt.cli.targets import host_specs, open_one
    from vgpuvirt.observe.exporter import ParallelScraper

    specs = list(specs) or host_specs(ctx.args)
    if connect and len(connect) not in (1, len(specs)):
        raise InvalidSpec("--connect", list(connect), f"one URI, or one per host ({len(specs)})")
    a = ctx.args
    hosts = [open_one(s, a) for s in specs]
    domains = domain_sources([h.name for h in hosts], connect) if connect else {}
    scraper = ParallelScraper(hosts, timeout=timeout, domains=domains)
    try:
        yield scraper
    finally:
        scraper.close()
        for h in hosts:
            h.close()
        for d in domains.values():
            d.close()


def run(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.observe.exporter import parse_listen, serve

    addr, port = parse_listen(args.listen)
    if args.timeout is not None and not 0 < args.timeout <= 600:
        raise InvalidSpec("--timeout", args.timeout, "seconds between 0 and 600")
    with watched_hosts(ctx, args.hosts, args.connect, args.timeout) as scraper:
        stop = threading.Event()
        try:
            server, _ = serve(scraper, addr, port)
        except OSError as exc:
            raise InvalidSpec("--listen", args.listen,
                              f"an address this machine can listen on ({exc.strerror})") from None
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        names = ", ".join(h.name for h in scraper.hosts)
        print(printable(f"vgpuvirt exporter: serving http://{args.listen}/metrics for {names}"),
              file=sys.stderr, flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
    return 0
