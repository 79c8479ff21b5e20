"""``vgpuvirt host``: host maintenance. Cordon a host (placement everywhere skips it, saying why), drain it
(move its VMs to the other hosts), uncordon it.

    vgpuvirt --host ssh://root@gpu1 host cordon --reason "vGPU manager upgrade"
    vgpuvirt --host ssh://root@gpu1 host status
    vgpuvirt --host ssh://root@gpu1 --host ssh://root@gpu2 --host ssh://root@gpu3 host drain ssh://root@gpu1
    vgpuvirt --host ssh://root@gpu1 host uncordon

The cordon mark lives on the host (``/var/lib/vgpuvirt/cordon.json``), written in its locked, audited batch,
and every controller's inventory reads it. ``drain HOST`` cordons HOST, plans where each of its VMs goes among
the other ``--host`` values (their capacity and cordons respected), prints the plan, and moves the VMs
``--parallel`` at a time; ``--shutdown-unmovable`` shuts down (ACPI) what no host can take. HOST stays
cordoned. See docs/mobility.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.context import plain
from vgpuvirt.cli.targets import add_connect, host_specs, open_targets
from vgpuvirt.errors import InvalidSpec


def register(sub: Any) -> None:
    p = sub.add_parser("host", help="host maintenance: cordon, uncordon, drain, status",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="host_command", metavar="ACTION")
    s.required = True
    c = s.add_parser("cordon", help="mark the host: placement skips it (with the reason)")
    c.add_argument("--reason", required=True, help="why (one line; shown wherever placement skips the host)")
    c.set_defaults(func=_cordon)
    u = s.add_parser("uncordon", help="clear the mark: the host takes VMs again")
    u.set_defaults(func=_uncordon)
    st = s.add_parser("status", help="the host's cordon mark and its VMs")
    add_connect(st)
    st.set_defaults(func=_status)
    d = s.add_parser("drain", help="cordon HOST and move its VMs to the other --host values")
    d.add_argument("target", metavar="HOST", help="the host to drain: one of the --host values")
    d.add_argument("--parallel", type=int, default=2, metavar="N", help="migrations at once (default 2)")
    d.add_argument("--shutdown-unmovable", action="store_true",
                   help="shut down (ACPI) the VMs no other host can take, instead of leaving them running")
    d.add_argument("--reason", default="drained", help="the cordon's reason (default: drained)")
    d.add_argument("--dry-run", action="store_true", help="show where each VM would go; change nothing")
    add_connect(d)
    d.set_defaults(func=_drain)


def _cordon(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.services.cordon import set_cordon

    before, after = set_cordon(ctx.host(), args.reason, by=_who())
    return _show_cordon(ctx, ctx.host().name, before, after)


def _uncordon(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.services.cordon import set_cordon

    before, after = set_cordon(ctx.host(), None, by=_who())
    return _show_cordon(ctx, ctx.host().name, before, after)


def _who() -> str:
    import getpass
    import socket
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return "vgpuvirt"


def _show_cordon(ctx: Any, name: str, before: Any, after: Any) -> int:
    if ctx.json:
        ctx.emit_json({"host": name, "changed": before != after,
                       "before": before.to_dict() if before else None, "cordon": after.to_dict() if after else None})
        return 0
    con = ctx.console()
    if after is None:
        con.print(f"{plain(name)}: not cordoned" + (" (was: " + plain(before.reason) + ")" if before else ""))
    else:
        con.print(f"{plain(name)}: cordoned: {plain(after.reason)} (by {plain(after.by)}, since {plain(after.since)})")
    return 0


def _status(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.mobility.checks import Side, read_facts

    with open_targets(args) as (hosts, conns):
        if len(hosts) != 1:
            raise InvalidSpec("--host", host_specs(args), "one host")
        name = next(iter(hosts))
        f = read_facts(Side(hosts[name], conns[name]))
    cordon = f.inventory.cordon
    vms = [{"vm": n, "running": n in f.active} for n in sorted(f.domains)]
    if ctx.json:
        ctx.emit_json({"host": name, "cordon": cordon.to_dict() if cordon else None, "vms": vms})
        return 0
    con = ctx.console()
    con.print(f"{plain(name)}: " + (f"cordoned: {plain(cordon.reason)} (by {plain(cordon.by)}, since "
                                    f"{plain(cordon.since)})" if cordon else "schedulable"))
    for v in vms:
        con.print(f"  {plain(v['vm'])}: {'running' if v['running'] else 'shut off'}")
    return 0


def _drain(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.mobility.checks import Side
    from vgpuvirt.provision.mobility.drain import Fate, drain

    specs = host_specs(args)
    con = ctx.console()
    with open_targets(args) as (hosts, conns):
        by_spec = dict(zip(specs, hosts, strict=True))
        target = by_spec.get(args.target, args.target if args.target in hosts else None)
        if target is None:
            raise InvalidSpec("drain HOST", args.target, f"one of the --host values ({', '.join(specs)})")
        others = [Side(hosts[n], conns[n]) for n in hosts if n != target]

        def told(f: Fate) -> None:
            if not ctx.json:
                con.print(f"{plain(f.vm)}: {f.fate}" + (f" -> {plain(f.dest)}" if f.dest else "")
                          + (f" ({plain(f.detail)})" if f.detail else ""))

        result = drain(Side(hosts[target], conns[target]), others, parallel=args.parallel,
                       shutdown_unmovable=args.shutdown_unmovable, dry_run=args.dry_run, reason=args.reason,
                       on_fate=told)
    if ctx.json:
        ctx.emit_json(result.to_dict())
    elif args.dry_run:
        con.print(plain(result.plan.format()))
    else:
        con.print(f"{plain(target)} drained in {result.seconds:.1f} s and left cordoned"
                  if result.ok else f"{plain(target)}: some VMs did not move (the host stays cordoned)")
    return 0 if result.ok or args.dry_run else 1
