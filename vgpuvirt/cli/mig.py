"""``vgpuvirt mig show|enable|disable|create|destroy``: MIG mode and GPU/compute instances (thin: the state is
read by :mod:`vgpuvirt.services.mig.state`, the changes are the change engine's MIG kinds, :mod:`vgpuvirt.change.mig`).
A change reads the state (one round trip), validates, then the runner does every step in one locked batch and,
when one fails, undoes exactly what ran (a second round trip); it reports in the runner's one format."""

from __future__ import annotations

import argparse

from vgpuvirt.change.mig import MigStep, SetMigMode, mig_steps
from vgpuvirt.change.runner import run_host
from vgpuvirt.cli.changes import add_common, dry_run_steps, emit_failure, emit_report
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.services.mig.ops import MigAction, check_against
from vgpuvirt.services.mig.state import MigGpu, MigState, read_mig_state


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("mig", help="MIG mode, GPU instances and compute instances (nvidia-smi mig)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    s = verbs.add_parser("show", help="mode (current/pending), profiles with free counts, GPU and compute instances")
    s.add_argument("gpu", nargs="?", default=None, help="nvidia-smi index or PCI address (default: all)")
    add_common(s, dry_run=False)
    s.set_defaults(func=_show)
    for name in ("enable", "disable"):
        v = verbs.add_parser(name, help=f"{name} MIG mode (pending until a GPU reset or reboot when the GPU is busy)")
        v.add_argument("gpus", nargs="+", help="nvidia-smi index or PCI address")
        add_common(v)
        v.set_defaults(func=_mode, enabled=name == "enable")
    c = verbs.add_parser("create", help="create GPU instances: PROFILE[:START] (name such as 1g.10gb, or id)")
    c.add_argument("gpu")
    c.add_argument("profiles", nargs="+", metavar="PROFILE[:START]")
    c.add_argument("-C", "--compute-instance", action="store_true", help="also the default compute instance of each")
    add_common(c)
    c.set_defaults(func=_create)
    d = verbs.add_parser("destroy", help="destroy GPU instances (their compute instances first), or compute instances")
    d.add_argument("gpu")
    d.add_argument("--gi", default=None, help="GPU instance ids, comma-separated (default: all)")
    d.add_argument("--ci", default=None, help="only these compute instances (of --gi), comma-separated")
    add_common(d)
    d.set_defaults(func=_destroy)


def _ids(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise InvalidSpec(flag, text, "comma-separated instance ids") from None


def _gpu(state: MigState, key: str) -> MigGpu:
    g = state.gpu(int(key)) if key.isdigit() else state.gpu(key)
    if g is None:
        known = ", ".join(f"{x.index} ({x.address})" for x in state.gpus) or "none"
        raise InvalidSpec("GPU", key, f"an NVIDIA GPU of {state.host}: {known}")
    return g


def _state(ctx: Context) -> MigState:
    state = read_mig_state(ctx.host())
    if not state.available:
        raise InvalidSpec("host", state.host, f"a host with the NVIDIA driver ({'; '.join(state.errors)})")
    return state


def _show(ctx: Context, args: argparse.Namespace) -> int:
    state = _state(ctx)
    gpus = [_gpu(state, args.gpu)] if args.gpu is not None else list(state.gpus)
    if ctx.json:
        ctx.emit_json({**state.to_dict(), "gpus": [g.to_dict() for g in gpus]})
        return 0
    for g in gpus:
        mode = "no MIG" if not g.capable else f"MIG {g.mode_current}" + (
            f" (pending: {g.mode_pending} after a GPU reset or reboot)" if g.pending else "")
        print(printable(f"GPU {g.index} {g.address} {g.product or ''}: {mode}"))
        for p in g.profiles:
            print(printable(f"  profile {p.name:<12} id {p.id:>2}  free {p.free}/{p.total}  placements "
                            f"{{{','.join(map(str, p.placements))}}}:{p.placement_size}"))
        for gi in g.gpu_instances:
            cis = [c for c in g.compute_instances if c.gi == gi.id]
            print(printable(f"  GI {gi.id:>2} {gi.profile:<12} at {gi.start}:{gi.size}  compute instances: "
                            + (", ".join(f"{c.id} ({c.profile} at {c.start}:{c.size})" for c in cis) or "none")))
    for e in state.errors:
        print(printable(f"warning: {e}"))
    return 0


def _run(ctx: Context, args: argparse.Namespace, steps: list[MigStep]) -> int:
    if args.dry_run:
        dry_run_steps(ctx, steps)
        return 0
    host = ctx.host()
    try:
        report = run_host(host, steps, what="mig " + args.verb)
    except ProvisioningError as exc:
        return emit_failure(ctx, exc)
    pending: list[str] = []
    if any(isinstance(s, SetMigMode) for s in steps):
        # a mode change nvidia-smi accepted may wait for a GPU reset: say so (one more read)
        after = read_mig_state(host)
        pending = [f"{host.name}: MIG mode of GPU {g.index} {g.address} is {g.mode_pending} after a GPU reset or "
                   f"reboot (now {g.mode_current})" for s in steps if isinstance(s, SetMigMode)
                   for g in after.gpus if g.address == s.gpu and g.pending]
    emit_report(ctx, report, {"pending_reset": pending} if ctx.json else None)
    if not ctx.json:
        for line in pending:
            print(printable(f"pending: {line}"))
    return 0


def _mode(ctx: Context, args: argparse.Namespace) -> int:
    state = _state(ctx)
    targets = [_gpu(state, k) for k in args.gpus]
    for g in targets:
        if not g.capable:
            raise InvalidSpec("GPU", str(g.address), "a MIG-capable GPU (A100, A30, H100 ...)")
    return _run(ctx, args, [SetMigMode(ctx.host().name, "", s.gpu, s.index, on=s.on, was=s.was, pending_ok=True)
                            for g in targets for s in mig_steps(state.host, g, [MigAction.mode(g.index, args.enabled)])
                            if isinstance(s, SetMigMode)])


def _create(ctx: Context, args: argparse.Namespace) -> int:
    state = _state(ctx)
    g = _gpu(state, args.gpu)
    if not g.enabled:
        raise InvalidSpec("GPU", args.gpu, "a GPU in MIG mode (`vgpuvirt mig enable` it first"
                          + ("; its MIG mode is pending a GPU reset or reboot)" if g.pending else ")"))
    names, starts = [], []
    for item in args.profiles:
        name, sep, start = item.partition(":")
        if sep and not start.isdigit():
            raise InvalidSpec("PROFILE[:START]", item, "a profile and an optional start slice, e.g. 1g.10gb:6")
        names.append(name)
        starts.append(int(start) if sep else None)
    action = MigAction.create_gi(g.index, names, placements=starts, default_ci=args.compute_instance)
    check_against(action, g)
    return _run(ctx, args, mig_steps(ctx.host().name, g, [action]))


def _destroy(ctx: Context, args: argparse.Namespace) -> int:
    state = _state(ctx)
    g = _gpu(state, args.gpu)
    gis, cis = _ids("--gi", args.gi), _ids("--ci", args.ci)
    if cis is not None and (gis is None or len(gis) != 1):
        raise InvalidSpec("--ci", args.ci, "together with exactly one --gi")
    have = {gi.id for gi in g.gpu_instances}
    for gi in gis or []:
        if gi not in have:
            known = ", ".join(map(str, sorted(have))) or "none"
            raise InvalidSpec("--gi", gi, f"a GPU instance of GPU {g.index} ({known})")
    actions: list[MigAction] = []
    for gi in sorted(have) if gis is None else gis:
        mine = [c.id for c in g.compute_instances if c.gi == gi and (cis is None or c.id in cis)]
        if mine:
            actions.append(MigAction.destroy_ci(g.index, gi, mine))
        if cis is None:
            actions.append(MigAction.destroy_gi(g.index, [gi]))
    if not actions:
        print(printable(f"GPU {g.index}: nothing to destroy"))
        return 0
    return _run(ctx, args, mig_steps(ctx.host().name, g, actions))
