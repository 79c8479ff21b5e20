"""``vgpuvirt top [HOST ...]``: a live view of hosts, GPUs, their vGPUs and owning VMs, refreshed every
``--interval`` seconds; ``q`` (or Ctrl-C) quits and gives the terminal back as it was. ``--once`` prints one
frame and exits (for scripts and pipes).

    vgpuvirt top sim:t4x2 sim:a10-sriov --interval 1
    vgpuvirt --host sim:t4x2 top --once
"""

from __future__ import annotations

import argparse

from vgpuvirt.cli.context import Context
from vgpuvirt.errors import InvalidSpec


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("top", help="live view of GPUs, vGPUs and their VMs (q quits)")
    p.add_argument("hosts", nargs="*", metavar="HOST", help="hosts; default: the global --host")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for each host per refresh (default: the interval, at least 5)")
    p.add_argument("--connect", action="append", default=[], metavar="URI",
                   help="libvirt URI per host, in order (names the VMs); one for all, or one per host")
    p.set_defaults(func=run)


def run(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.cli.exporter import domain_sources
    from vgpuvirt.hosts import open_host
    from vgpuvirt.observe.exporter import ParallelScraper
    from vgpuvirt.observe.top_live import view

    if not 0.1 <= args.interval <= 3600:
        raise InvalidSpec("--interval", args.interval, "seconds between 0.1 and 3600")
    specs = args.hosts or [ctx.args.host]
    if args.connect and len(args.connect) not in (1, len(specs)):
        raise InvalidSpec("--connect", args.connect, f"one URI, or one per host ({len(specs)})")
    a = ctx.args
    hosts = [open_host(s, sysfs_root=a.sysfs_root, identity=a.identity, known_hosts=a.known_hosts, sudo=a.sudo,
                       allow_unknown_hosts=a.allow_unknown_hosts) for s in specs]
    domains = domain_sources([h.name for h in hosts], args.connect) if args.connect else {}
    scraper = ParallelScraper(hosts, timeout=args.timeout or max(5.0, args.interval), domains=domains)
    try:
        view(scraper, interval=args.interval, once=args.once)
    finally:
        scraper.close()
        for h in hosts:
            h.close()
        for d in domains.values():
            d.close()
    return 0
