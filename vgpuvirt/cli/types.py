"""``vgpuvirt types [--parent ADDR] [--available] [--json]``: vGPU types with their capacity."""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.context import Context, plain
from vgpuvirt.cli.inventory import add_common_options, collect
from vgpuvirt.model import PciAddress
from vgpuvirt.services.inventory.read import type_capacity


def register(sub: Any) -> None:
    p = sub.add_parser("types", help="vGPU / mdev types with free and maximum instances")
    p.add_argument("--parent", metavar="ADDR", default=None,
                   help="only this device: an mdev parent, a PF (VF figures folded in) or one VF")
    p.add_argument("--available", action="store_true", help="only types that can still be created")
    p.add_argument("--explain", action="store_true",
                   help="say for each GPU-level row how its free count was found (the rules, or the host's own count)")
    add_common_options(p)
    p.set_defaults(func=run)


def run(ctx: Context, args: argparse.Namespace) -> int:
    parent = args.parent
    if parent is not None and ":" in parent:
        parent = str(PciAddress.parse(parent))     # InvalidSpec (exit 2) on a malformed address
    inv = collect(ctx, args)
    rows = type_capacity(inv, parent=parent, available_only=args.available)
    if ctx.json:
        ctx.emit_json([r.to_dict() for r in rows])
        return 0
    from rich.table import Table

    console = ctx.console()
    if not rows:
        what = f" on {parent}" if parent else ""
        console.print(f"no {'available ' if args.available else ''}vGPU types{plain(what)}")
        # why, where the driver says it: a VM guest, a driver that is not the vGPU host driver
        for g in inv.gpus:
            if parent is None or str(g.address) == parent:
                for note in g.notes:
                    if "vGPU host driver" in note:
                        console.print(plain(f"  {g.address}: {note}"))
        return 0
    t = Table(title=f"{plain(inv.host)}: vGPU types", title_justify="left")
    for col in ("parent", "backend", "type", "name", "free", "max", "in use", "FB MiB", "series"):
        t.add_column(col, no_wrap=col in ("parent", "type"))
    for r in rows:
        series = (r.series or "-") + (f" MIG {r.gi_profile}" if r.mig_backed else "")
        t.add_row(*map(plain, (r.parent, r.backend, r.id, r.name or "-",
                               str(r.available) + ("" if r.exact else " (host)"),
                               "-" if r.max_instances is None else r.max_instances, r.in_use,
                               "-" if r.framebuffer_mib is None else r.framebuffer_mib, series)),
                  style="dim" if r.available == 0 else None)
    console.print(t)
    if getattr(args, "explain", False):
        for r in rows:
            if r.reason:
                console.print(plain(f"{r.parent} {r.id}: {r.reason}"))
    return 0
