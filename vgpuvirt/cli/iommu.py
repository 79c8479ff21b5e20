"""``vgpuvirt iommu check|prepare|release``: can PCI devices be assigned; bind them to vfio-pci and back."""

from __future__ import annotations

import argparse
import json

from vgpuvirt import files
from vgpuvirt.change.driver import prepare_vfio
from vgpuvirt.cli.changes import add_common, domains, emit, emit_failure, emit_report
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.durable import write_new_file
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.services.iommu import api as iommu
from vgpuvirt.services.iommu.api import AssignabilityReport, BindingRecord


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("iommu", help="IOMMU pre-flight and vfio-pci binding")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    c = verbs.add_parser("check", help="can these devices be given to one VM? (exit 1 when not)")
    c.add_argument("addresses", nargs="+", metavar="ADDR")
    c.add_argument("--for-domain", default=None, help="the VM the devices are for (its own use is fine)")
    add_common(c, dry_run=False, domains=True)
    c.set_defaults(func=_check)
    pr = verbs.add_parser("prepare", help="bind every endpoint of the devices' IOMMU groups to vfio-pci")
    pr.add_argument("addresses", nargs="+", metavar="ADDR")
    pr.add_argument("--for-domain", default=None)
    pr.add_argument("--record", default=None, metavar="FILE",
                    help="write the original-driver record to this new file, durably, before binding")
    add_common(pr, domains=True)
    pr.set_defaults(func=_prepare)
    r = verbs.add_parser("release", help="give devices back to their original drivers")
    r.add_argument("addresses", nargs="*", metavar="ADDR", help="without --record: clear override, kernel probes")
    r.add_argument("--record", default=None, metavar="FILE", help="the record `iommu prepare` wrote")
    add_common(r, domains=True)
    r.set_defaults(func=_release)


def _print_report(rep: AssignabilityReport) -> None:
    lines = [f"{rep.host}: IOMMU {'on' if rep.iommu_enabled else 'OFF'}: "
             f"{'assignable' if rep.assignable else 'NOT assignable'}"]
    for d in rep.devices:
        lines.append(f"  {d.address} group {d.group} driver={d.driver or '-'} "
                     f"reset={','.join(d.reset_methods or []) or '-'}")
        lines += [f"    {m.address} {m.role:9} driver={m.driver or '-'} {m.note}"
                  for m in d.members if m.address != d.address]
    lines += [f"  BLOCKED: {r}" for r in rep.reasons]
    lines += [f"  warning: {w}" for w in rep.warnings]
    for line in lines:  # driver names and notes are host text
        print(printable(line))


def _check(ctx: Context, args: argparse.Namespace) -> int:
    rep = iommu.check_assignable(ctx.host(), args.addresses, domains=domains(args), for_domain=args.for_domain)
    if ctx.json:
        ctx.emit_json(rep.to_dict())
    else:
        _print_report(rep)
    return 0 if rep.assignable else 1


def _prepare(ctx: Context, args: argparse.Namespace) -> int:
    def keep(record: BindingRecord) -> None:
        write_new_file(args.record, json.dumps(record.to_dict(), indent=2) + "\n")

    try:
        ch, record, report = prepare_vfio(ctx.host(), args.addresses, domains=domains(args),
                                          for_domain=args.for_domain, dry_run=args.dry_run,
                                          before_change=keep if args.record else None)
    except ProvisioningError as exc:
        return emit_failure(ctx, exc)
    if ctx.json:
        ctx.emit_json({**ch.to_dict(), "record": record.to_dict(),
                       **({"applied": report.to_dict()} if report is not None else {})})
    elif report is not None:
        emit_report(ctx, report)
    else:
        emit(ctx, ch)
    return 0


def _release(ctx: Context, args: argparse.Namespace) -> int:
    target: BindingRecord | list[str]
    if args.record:
        try:
            target = BindingRecord.from_dict(json.loads(files.read_text(args.record, "--record")))
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: a deeply nested document
            if isinstance(exc, InvalidSpec):
                raise
            raise InvalidSpec("--record", args.record, f"a JSON record written by `iommu prepare` ({exc})") from exc
    elif args.addresses:
        target = list(args.addresses)
    else:
        raise InvalidSpec("release", "", "addresses or --record FILE")
    emit(ctx, iommu.release(ctx.host(), target, domains=domains(args), dry_run=args.dry_run))
    return 0
