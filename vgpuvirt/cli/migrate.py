"""``vgpuvirt migrate``: move a VM and its vGPUs to another host (live, or --offline when it is shut off).

    vgpuvirt --host ssh://root@gpu1 --host ssh://root@gpu2 migrate desk-001 --to ssh://root@gpu2
    vgpuvirt --host sim:t4x2@a --host sim:t4x2@b migrate desk-001 --to sim:t4x2@b --dry-run

The two ``--host`` are the VM's host and the destination (``--to`` names one of them); ``--connect`` gives
their libvirt URIs in the same order. Both hosts are read in parallel and every pre-check runs before anything
changes; all refusals are listed at once. The destination's vGPUs are reserved, the VM migrates
peer-to-peer (the source's libvirtd connects to ``--peer-uri``, by default the destination's URI), then the
source's vGPUs are released. A failure leaves the VM on the source and nothing reserved on the destination.
See docs/mobility.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vgpuvirt.cli.context import plain
from vgpuvirt.cli.targets import add_connect, host_specs, open_targets
from vgpuvirt.errors import InvalidSpec


def register(sub: Any) -> None:
    p = sub.add_parser("migrate", help="move a VM and its vGPUs to another host (live or --offline)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vm", metavar="VM")
    p.add_argument("--to", required=True, metavar="HOST", help="the destination: one of the two --host values")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--live", dest="live", action="store_const", const=True, default=None,
                     help="live migration (default for a running VM)")
    how.add_argument("--offline", dest="live", action="store_const", const=False,
                     help="move a shut-off VM: define it on the destination with its vGPUs there")
    p.add_argument("--dry-run", action="store_true", help="run the pre-checks and show the plan; change nothing")
    p.add_argument("--max-downtime", type=int, default=None, metavar="MS",
                   help="maximum downtime in ms (default for a VM with vGPUs: 5000; libvirt's own otherwise)")
    p.add_argument("--bandwidth", type=int, default=None, metavar="MIB", help="at most MIB MiB/s")
    p.add_argument("--peer-uri", default=None, metavar="URI",
                   help="the destination's libvirt as the SOURCE host's libvirtd reaches it (default: its --connect)")
    add_connect(p)
    p.set_defaults(func=run)


def run(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.mobility import MigrationRefused, Side, migrate

    specs = host_specs(args)
    if len(specs) != 2:
        raise InvalidSpec("--host", specs, "two hosts: the VM's and the destination (--to names it)")
    with open_targets(args) as (hosts, conns):
        names = list(hosts)
        by_spec = dict(zip(specs, names, strict=True))
        dest = by_spec.get(args.to, args.to if args.to in hosts else None)
        if dest is None:
            raise InvalidSpec("--to", args.to, f"one of the --host values ({', '.join(specs)})")
        src = next(n for n in names if n != dest)
        tty = sys.stderr.isatty() and not ctx.json

        def show(stats: dict[str, Any]) -> None:
            if not tty:
                return
            total, left = stats.get("memory_total", 0), stats.get("memory_remaining", 0)
            pct = 100 * (total - left) // total if total else 0
            sys.stderr.write(f"\rmigrating {plain(args.vm)}: {pct:3d}% of guest RAM, "
                             f"{left >> 20} MiB left (vGPU framebuffer not counted by libvirt)")
            sys.stderr.flush()

        try:
            result = migrate(args.vm, Side(hosts[src], conns[src]), Side(hosts[dest], conns[dest]),
                             live=args.live, dry_run=args.dry_run, max_downtime_ms=args.max_downtime,
                             bandwidth_mib=args.bandwidth, peer_uri=args.peer_uri, on_job=show)
        except MigrationRefused as exc:
            if ctx.json:
                ctx.emit_json(exc.plan.to_dict())
            raise
        finally:
            if tty:
                sys.stderr.write("\n")
    if ctx.json:
        ctx.emit_json(result.to_dict())
        return 0
    con = ctx.console()
    if args.dry_run:
        con.print(plain(result.plan.format()))
        return 0
    for line in result.done + result.released:
        con.print(f"+ {plain(line)}")
    down = result.last_job.get("downtime")
    con.print(f"migrated {plain(args.vm)} from {plain(src)} to {plain(dest)} in {result.seconds:.1f} s"
              + (f" (downtime {down} ms)" if down is not None else ""))
    return 0
