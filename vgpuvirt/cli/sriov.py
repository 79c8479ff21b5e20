"""``vgpuvirt sriov enable|disable|show``: SR-IOV virtual functions on a PF."""

from __future__ import annotations

import argparse
import sys

from vgpuvirt.change.sriov import set_vf_count
from vgpuvirt.cli.changes import add_common, domains, emit, emit_failure, emit_report
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import ProvisioningError
from vgpuvirt.services.pci.sriov import SriovService


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("sriov", help="enable/disable SR-IOV VFs, show VF <-> PF")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    for name, helptext in (("enable", "set the VF count (default: all the PF supports)"),
                           ("disable", "remove all VFs")):
        v = verbs.add_parser(name, help=helptext)
        v.add_argument("pf", help="PF address, e.g. 0000:41:00.0")
        if name == "enable":
            v.add_argument("--num", "-n", default=None, help="number of VFs")
        v.add_argument("--force", action="store_true", help="even if VFs are in use")
        v.add_argument("--no-vendor-tool", action="store_true", help="never use /usr/lib/nvidia/sriov-manage")
        add_common(v, domains=True)
        v.set_defaults(func=_enable if name == "enable" else _disable)
    s = verbs.add_parser("show", help="PFs, their VFs and which are in use")
    s.add_argument("pf", nargs="?", default=None)
    add_common(s, dry_run=False, domains=True)
    s.set_defaults(func=_show)


def _svc(ctx: Context, args: argparse.Namespace) -> SriovService:
    return SriovService(ctx.host(), vendor_tool=False if getattr(args, "no_vendor_tool", False) else None)


def _enable(ctx: Context, args: argparse.Namespace) -> int:
    return _set(ctx, args, args.num)


def _disable(ctx: Context, args: argparse.Namespace) -> int:
    return _set(ctx, args, 0)


def _set(ctx: Context, args: argparse.Namespace, count: str | int | None) -> int:
    """Through the change engine: one SR-IOV step, the runner's report (or its failure and rollback)."""
    try:
        ch, report = set_vf_count(ctx.host(), args.pf, count, force=args.force, dry_run=args.dry_run,
                                  domains=domains(args, ctx.host()),
                                  vendor_tool=False if args.no_vendor_tool else None)
    except ProvisioningError as exc:
        return emit_failure(ctx, exc)
    if report is None:
        emit(ctx, ch)                   # nothing ran: a dry run, or the count it has already
    elif ctx.json:
        ctx.emit_json({**ch.to_dict(), "applied": report.to_dict()})
    else:
        emit_report(ctx, report)
    return 0


def _show(ctx: Context, args: argparse.Namespace) -> int:
    pfs = _svc(ctx, args).report(args.pf, domains=domains(args))
    if ctx.json:
        ctx.emit_json([p.to_dict() for p in pfs])
        return 0
    if not pfs:   # stdout stays empty for scripts; a person learns that nothing was found, not nothing said
        print("no SR-IOV physical function" + (f" at {args.pf}" if args.pf else " on this host (no device has "
              "sriov_totalvfs)"), file=sys.stderr)
    for p in pfs:
        print(printable(f"{p.address} driver={p.driver or '-'} VFs {p.num_vfs}/{p.total_vfs}"))
        for v in p.vfs:
            print(printable(f"  virtfn{v.index} {v.address} driver={v.driver or '-'}"
                            f"{' in use: ' + v.in_use if v.in_use else ''}"))
    return 0
