"""``vgpuvirt gc``: vGPUs no libvirt domain references (dry run unless --apply)."""

from __future__ import annotations

import argparse

from vgpuvirt.cli.changes import add_common, domains, emit
from vgpuvirt.cli.context import Context
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.services.vgpu import gc


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("gc", help="list (or --apply: remove) orphan mdevs / VF vGPU types")
    p.add_argument("--apply", action="store_true", help="remove them (default: only list)")
    add_common(p, dry_run=False, domains=True)
    p.set_defaults(func=_gc)


def _gc(ctx: Context, args: argparse.Namespace) -> int:
    doms = domains(args, ctx.host())
    if doms is None:
        raise InvalidSpec("--connect", None, "a libvirt URI (or --domain-xml FILE): without the domains every "
                                             "vGPU would look orphaned")
    emit(ctx, gc.collect(ctx.host(), doms, dry_run=not args.apply))
    return 0
