"""``vgpuvirt scheduler show|set``: the time-sliced vGPU scheduler of NVIDIA GPUs (NVML, or RmPVMRL)."""

from __future__ import annotations

import argparse

from vgpuvirt.change.scheduler import apply_schedulers
from vgpuvirt.cli.changes import emit_failure, emit_report
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import ProvisioningError
from vgpuvirt.services.scheduler.model import POLICIES, SchedulerSetting
from vgpuvirt.services.scheduler.service import plan_schedulers, read_schedulers


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("scheduler", help="show or set the vGPU scheduler policy of NVIDIA GPUs")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    s = verbs.add_parser("show", help="current and pending (next driver load) scheduler per GPU")
    s.add_argument("gpu", nargs="*", help="GPU PCI addresses (default: every NVIDIA GPU)")
    s.set_defaults(func=_show)
    st = verbs.add_parser("set", help="set a policy: now through NVML, else pending until the driver reloads")
    st.add_argument("gpu", nargs="+", help="GPU PCI addresses, e.g. 0000:3b:00.0")
    st.add_argument("--policy", required=True, choices=POLICIES)
    st.add_argument("--timeslice-us", type=_positive, default=None, help="time slice in microseconds")
    st.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                    help="adaptive round robin on/off (default: the driver's)")
    st.add_argument("--persist", action="store_true",
                    help="with NVML, also write the registry key so that the setting survives a driver reload")
    st.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    st.set_defaults(func=_set)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"invalid --timeslice-us {text!r}: expected a positive integer")
    return int(text)


def _fmt(s: SchedulerSetting | None) -> str:
    return s.describe() if s is not None else "unknown"


def _show(ctx: Context, args: argparse.Namespace) -> int:
    gpus = read_schedulers(ctx.host(), args.gpu or None)
    if ctx.json:
        ctx.emit_json([g.to_dict() for g in gpus])
        return 0
    for g in gpus:
        print(printable(f"{g.address}  current: {_fmt(g.current)} (from {g.current_source})"))
        note = "  <- takes effect at the next load of the nvidia module" if g.differs else ""
        print(printable(f"{'':14}pending: {_fmt(g.pending)}{note}"))
        if g.log_entries:
            print(printable(f"{'':14}scheduler log: {g.log_entries} entries (nvmlDeviceGetVgpuSchedulerLog)"))
        if not g.vgpu_capable:
            print(printable(f"{'':14}no vGPU on this GPU (NVML: {g.nvml_error}): nothing to schedule"))
        elif not g.nvml:
            print(printable(f"{'':14}NVML scheduler calls unavailable ({g.nvml_error}): "
                            "set writes the registry key"))
    return 0


def _set(ctx: Context, args: argparse.Namespace) -> int:
    want = SchedulerSetting(policy=args.policy, timeslice_us=args.timeslice_us, adaptive=args.adaptive)
    host = ctx.host()
    plan = plan_schedulers(host, dict.fromkeys(args.gpu, want), persist=args.persist)
    if args.dry_run:
        if ctx.json:
            ctx.emit_json(dict(plan.to_dict(), dry_run=True))
            return 0
        for c in plan.changes:
            print(printable(("would set " if c.via != "none" else "") + c.describe()))
        return 0
    try:
        report = apply_schedulers(host, plan)
    except ProvisioningError as exc:
        return emit_failure(ctx, exc)
    # the one report, with the plan's per-GPU lines (before -> after, now or at the next driver load) beside it
    emit_report(ctx, report, {**plan.to_dict(), "dry_run": False} if ctx.json else None)
    if not ctx.json:
        for c in plan.changes:
            if c.via != "none":
                print(printable(c.describe()))
    return 0
