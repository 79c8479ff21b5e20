"""``vgpuvirt top [HOST ...]``: a live view of hosts, GPUs, their vGPUs and owning VMs, refreshed every
``--interval`` seconds; ``q`` (or Ctrl-C) quits and gives the terminal back as it was. ``--once`` prints one
frame and exits (for scripts and pipes: piped, each row is one whole line, never cut); ``--json`` prints one
snapshot as JSON (the document of ``vgpuvirt metrics --json``) and exits.

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
    from vgpuvirt.cli.exporter import watched_hosts
    from vgpuvirt.cli.top_live import view

    if not 0.1 <= args.interval <= 3600:
        raise InvalidSpec("--interval", args.interval, "seconds between 0.1 and 3600")
    with watched_hosts(ctx, args.hosts, args.connect, args.timeout or max(5.0, args.interval)) as scraper:
        if ctx.json:               # a live screen is no JSON: one snapshot, as `metrics --json` prints it
            ctx.emit_json(scraper.scrape().to_dict())
        elif args.once:            # the CLI's console: whole cells on a terminal, whole lines in a pipe
            view(scraper, interval=args.interval, once=True, console=ctx.console())
        else:
            view(scraper, interval=args.interval)
    return 0
