"""``vgpuvirt attach``: give an existing VM one more GPU (placed, created, attached; undone on failure).

    vgpuvirt --host sim:t4x2 attach desk-001 --gpu nvidia-231 --connect qemu:///system --config
    vgpuvirt attach rig-01 --gpu passthrough --live

Without --live or --config the device goes into the persistent definition, and into the running VM
when it runs. A vGPU made here is removed again if attaching fails.
"""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.targets import add_connect
from vgpuvirt.cli.vm import connection


def add_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--live", action="store_true", help="the running VM only (with --config: both)")
    p.add_argument("--config", action="store_true", help="the persistent definition only (with --live: both)")
    p.add_argument("--wait-timeout", type=float, default=10.0, help="seconds to wait for a device to appear/go")


def live_config(args: argparse.Namespace) -> tuple[bool | None, bool]:
    """(live, config) for LibvirtConnection: neither flag -> persistent, and live when running."""
    if not args.live and not args.config:
        return None, True
    return bool(args.live), bool(args.config)


def register(sub: Any) -> None:
    p = sub.add_parser("attach", help="add a vGPU or GPU to an existing VM", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vm", metavar="VM")
    p.add_argument("--gpu", required=True, metavar="SPEC",
                   help="a type (nvidia-231, 'GRID T4-2Q'), 'passthrough', 'vf', or a need ('fb>=2G,series=Q')")
    add_mode(p)
    add_connect(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    p.set_defaults(func=_attach)


def _attach(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.hotplug import attach_gpu
    from vgpuvirt.provision.request import VgpuRequest

    req = VgpuRequest.parse(args.gpu)
    live, config = live_config(args)
    with connection(ctx, args) as conn:
        res = attach_gpu(ctx.host(), conn, args.vm, req, live=live, config=config, wait_timeout=args.wait_timeout,
                         dry_run=args.dry_run)
    if ctx.json:
        ctx.emit_json(res.to_dict())
        return 0
    verb = "would attach" if args.dry_run else "attached"
    print(printable(f"{verb} {', '.join(res.devices)} ({res.type}, {res.type_name}) to {res.vm} on {res.host}"))
    for line in res.created:
        print(printable(f"  created: {line}"))
    for line in res.notes:
        print(printable(f"  note: {line}"))
    return 0
