"""``vgpuvirt teardown``: destroy VMs that vgpuvirt made, remove their vGPUs, then undefine them (disks
kept unless --remove-storage). Domains vgpuvirt did not create are left alone; a vGPU that is not provably
the VM's, or that another domain uses, is left and named; a VM whose vGPU could not be removed stays
defined so that a rerun finishes.

    vgpuvirt --host sim:t4x2 teardown --connect test:///default vm-001 vm-002
    vgpuvirt --host ssh://root@gpu1 --host ssh://root@gpu2 teardown --pattern 'vdi-*'
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vgpuvirt.cli.api_words import cli_words
from vgpuvirt.cli.context import plain, printable
from vgpuvirt.cli.provision import add_target_args, open_targets, progress_bar


def run(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.teardown import teardown

    if not args.names and not args.pattern:
        from vgpuvirt.errors import InvalidSpec
        raise InvalidSpec("teardown target", None, "VM names and/or --pattern GLOB")
    tty = sys.stdout.isatty() and not ctx.json
    with open_targets(args) as (hosts, conns), progress_bar(tty and not args.dry_run, "teardown") as bar:
        task = bar.add_task("teardown", total=None, last="") if bar is not None else None

        def tick(host: str, name: str) -> None:
            if bar is not None:
                bar.update(task, advance=1, last=plain(name))

        result = teardown(hosts, conns, args.names or None, patterns=args.pattern or (),
                          remove_storage=args.remove_storage, dry_run=args.dry_run, progress=tick)
    if ctx.json:
        ctx.emit_json(result.to_dict())
    else:
        con = ctx.console()
        for line in result.removed:
            con.print(f"- {printable(line)}", markup=False)
        for line in result.skipped:        # "remove_storage=True deletes them" -> the flag
            con.print(f"  {printable(cli_words(line))}", markup=False, style="dim")
        for line in result.failed:
            con.print(f"! {printable(line)}", markup=False, style="red")
    if result.failed:
        print(printable(f"vgpuvirt: error: teardown left {len(result.failed)} item(s) in place: {result.failed[0]}"),
              file=sys.stderr)
        return 1
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("teardown", help="remove VMs vgpuvirt made, and their vGPUs", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    p.add_argument("names", nargs="*", help="VM names")
    p.add_argument("--pattern", action="append", default=None, metavar="GLOB", help="VM names matching a glob")
    p.add_argument("--remove-storage", action="store_true", help="also delete the VMs' disk volumes")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, change nothing")
    p.set_defaults(func=run)
