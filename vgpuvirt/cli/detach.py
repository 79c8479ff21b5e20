"""``vgpuvirt detach``: take a GPU away from a VM and remove what vgpuvirt made for it.

    vgpuvirt --host sim:t4x2 detach desk-001 --connect qemu:///system --config
    vgpuvirt detach desk-001 7b3522e8-b8d3-5947-a38e-b10457069898

DEVICE is an mdev UUID or a PCI address (a whole GPU's other functions go with it); without it the VM's
only GPU. A vGPU is removed only when vgpuvirt made it for this VM and no other domain uses it.
"""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.attach import add_mode, live_config
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.targets import add_connect
from vgpuvirt.cli.vm import connection


def register(sub: Any) -> None:
    p = sub.add_parser("detach", help="remove a vGPU or GPU from a VM (and the vGPU itself)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vm", metavar="VM")
    p.add_argument("device", nargs="?", default=None, metavar="DEVICE", help="mdev UUID or PCI address")
    add_mode(p)
    add_connect(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    p.set_defaults(func=_detach)


def _detach(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.hotplug import detach_gpu

    live, config = live_config(args)
    with connection(ctx, args) as conn:
        res = detach_gpu(ctx.host(), conn, args.vm, args.device, live=live, config=config,
                         wait_timeout=args.wait_timeout, dry_run=args.dry_run)
    if ctx.json:
        ctx.emit_json(res.to_dict())
        return 0
    verb = "would detach" if args.dry_run else "detached"
    print(printable(f"{verb} {', '.join(res.devices)} from {res.vm} on {res.host}"))
    for line in res.removed:
        print(printable(f"  removed: {line}"))
    for line in res.left:
        print(printable(f"  left: {line}"))
    return 0
