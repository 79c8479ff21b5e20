"""``vgpuvirt mdev create|remove|list|ensure|restore``: mediated-device vGPUs on a host."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from pathlib import Path

from vgpuvirt.change.mdev_service import PERSIST_CHOICES, MdevService, MdevSpec
from vgpuvirt.cli.changes import add_common, domains, emit
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import InvalidSpec, TransportError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("mdev", help="create, remove, list mediated devices (mdev vGPUs)")
    p.add_argument("--mdevctl", default="mdevctl",
                   help="the mdevctl command on the host, as words (default: mdevctl)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    c = verbs.add_parser("create", help="create an mdev (given or generated UUID)")
    c.add_argument("--parent", required=True, help="parent PCI address, e.g. 0000:3b:00.0")
    c.add_argument("--type", required=True, dest="type_id", help="mdev type id, e.g. nvidia-231")
    c.add_argument("--uuid", default=None,
                   help="UUID (default: a new random one, printed before the request is sent)")
    c.add_argument("--persist", choices=PERSIST_CHOICES, default="transient",
                   help="persistent: also `mdevctl define --auto` (comes back at boot)")
    add_common(c)
    c.set_defaults(func=_create)

    r = verbs.add_parser("remove", help="remove an mdev (and its mdevctl definition)")
    r.add_argument("uuid")
    r.add_argument("--keep-definition", action="store_true", help="do not undefine it in mdevctl")
    add_common(r, domains=True)
    r.set_defaults(func=_remove)

    ls = verbs.add_parser("list", help="list active mdevs (--defined: also mdevctl definitions)")
    ls.add_argument("--defined", action="store_true")
    add_common(ls, dry_run=False)
    ls.set_defaults(func=_list)

    e = verbs.add_parser("ensure", help="make an mdev present or absent (idempotent)")
    e.add_argument("--uuid", required=True)
    e.add_argument("--parent", default=None)
    e.add_argument("--type", default=None, dest="type_id")
    e.add_argument("--state", choices=("present", "absent"), default="present")
    e.add_argument("--persist", choices=PERSIST_CHOICES, default="transient")
    add_common(e)
    e.set_defaults(func=_ensure)

    rs = verbs.add_parser("restore", help="start mdevctl-defined mdevs that are not active")
    rs.add_argument("--only-auto", action="store_true", help="only those defined with start=auto")
    add_common(rs)
    rs.set_defaults(func=_restore)


def _svc(ctx: Context, args: argparse.Namespace) -> MdevService:
    try:
        words = shlex.split(args.mdevctl)
    except ValueError as exc:    # an unbalanced quote
        raise InvalidSpec("--mdevctl", args.mdevctl, f"words in shell quoting ({exc})") from exc
    return MdevService(ctx.host(), mdevctl=words)


def _create(ctx: Context, args: argparse.Namespace) -> int:
    # The UUID is chosen here and shown BEFORE the request leaves: if the link drops after the host
    # ran the create, the rerun (with --uuid, or the same command: the pending record below) finds that
    # device instead of making a second one.
    spec = MdevSpec.of(args.parent, args.type_id, args.uuid)
    key = None if args.dry_run else f"{ctx.host().name} {spec.parent} {spec.type}"
    if key is not None and args.uuid is None:
        resumed = pending_creates().get(key)
        if resumed is not None:
            spec = MdevSpec.of(args.parent, args.type_id, resumed)
        _announce(ctx, spec, resumed=resumed is not None)
        remember_pending(key, str(spec.uuid))
    try:
        ch = _svc(ctx, args).create(spec.parent, spec.type, spec.uuid, persist=args.persist, dry_run=args.dry_run)
    except TransportError as exc:   # the outcome is unknown: the pending record stays for the rerun
        raise TransportError(exc.host, f"{str(exc).removeprefix(f'{exc.host}: ')} (rerun: --uuid {spec.uuid})") from exc
    except Exception:
        _settled(key, str(spec.uuid))      # the host answered: nothing is pending
        raise
    _settled(key, str(spec.uuid))
    emit(ctx, ch)
    return 0


def _settled(key: str | None, uuid: str) -> None:
    """Forget the pending create of ``key`` if it is this UUID (a rerun with --uuid settles it too)."""
    if key is not None and pending_creates().get(key) == uuid:
        remember_pending(key, None)


def _pending_path() -> Path:
    """The client's record of creates whose answer was lost, next to its audit log (a 0700 directory)."""
    from vgpuvirt.audit import log_path
    return log_path().parent / "mdev-pending.json"


def pending_creates() -> dict[str, str]:
    """``"HOST PARENT TYPE"`` -> the UUID of a create sent there whose answer never came back."""
    from vgpuvirt import files
    path = _pending_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(files.read_text(str(path), "pending creates record", max_bytes=1 << 20))
    except (InvalidSpec, ValueError):
        return {}                    # unreadable: no resume (each create then chooses a new UUID, as before)
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data, dict) else {}


def remember_pending(key: str, uuid: str | None) -> None:
    """Record (or, with None, forget) a create in flight; written to a new file renamed over the record, so a
    cut mid-write keeps the old one. A record that cannot be written costs the resume only, never the create."""
    data = pending_creates()
    if uuid is None:
        if data.pop(key, None) is None:
            return
    else:
        data[key] = uuid
    path = _pending_path()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(data, sort_keys=True).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _announce(ctx: Context, spec: MdevSpec, *, resumed: bool = False) -> None:
    """The intent line: on stdout for people, as one JSON line on stderr with --json (stdout stays one
    JSON object). ``resumed``: the UUID is the one of an earlier create here whose answer was lost."""
    if ctx.json:
        print(json.dumps({"intent": "mdev.create", "uuid": str(spec.uuid), "parent": str(spec.parent),
                          "type": str(spec.type), "rerun": f"--uuid {spec.uuid}", "resumed": resumed}),
              file=sys.stderr, flush=True)
    elif resumed:
        print(f"resuming the create of mdev {spec.uuid} ({spec.type} on {spec.parent}) whose answer was lost",
              flush=True)
    else:
        print(f"creating mdev {spec.uuid} ({spec.type} on {spec.parent}); if this run is cut off, "
              f"rerun with --uuid {spec.uuid}", flush=True)


def _remove(ctx: Context, args: argparse.Namespace) -> int:
    emit(ctx, _svc(ctx, args).remove(args.uuid, undefine=not args.keep_definition, dry_run=args.dry_run,
                                     domains=domains(args, ctx.host())))
    return 0


def _ensure(ctx: Context, args: argparse.Namespace) -> int:
    emit(ctx, _svc(ctx, args).ensure(args.uuid, args.parent, args.type_id, state=args.state, persist=args.persist,
                                     dry_run=args.dry_run))
    return 0


def _restore(ctx: Context, args: argparse.Namespace) -> int:
    ch = _svc(ctx, args).restore(dry_run=args.dry_run, only_auto=args.only_auto)
    emit(ctx, ch)
    return 1 if ch.data.get("failed") else 0


def _list(ctx: Context, args: argparse.Namespace) -> int:
    records = _svc(ctx, args).list(defined=args.defined)
    if ctx.json:
        ctx.emit_json([r.to_dict() for r in records])
        return 0
    if not records:   # as mdevctl, stdout stays empty; the note goes to stderr
        print("no mediated device" + (", active or defined" if args.defined else " active"), file=sys.stderr)
    for r in records:
        state = "active" if r.active else "inactive"
        extra = f" defined({r.start})" if r.defined else ""
        print(printable(f"{r.uuid} {r.parent} {r.type} {state}{extra}"))
    return 0
