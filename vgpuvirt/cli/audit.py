"""``vgpuvirt audit show [--host H] [--since WHEN] [--client] [--json]``: the audit trail.

Without ``--client``: the host's log (every mutating batch, written by the agent on the host; read in one
round trip). With ``--client``: this machine's own log (libvirt calls, ``run()``, batches sent). Host text
is printed as plain text: control and formatting characters are shown escaped, never sent to the terminal.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from vgpuvirt import audit as client_audit
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.audit_log import parse_audit

_RELATIVE = re.compile(r"^(\d{1,6})([smhd])$")
_ABSOLUTE = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2})?))?Z?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="the audit trail: what was changed on a host, by whom, with what outcome")
    verbs = p.add_subparsers(dest="audit_verb", metavar="VERB")
    verbs.required = True
    show = verbs.add_parser("show", help="print a host's audit log (or, with --client, this machine's)")
    show.add_argument("--since", default=None, metavar="WHEN",
                      help="only records from then on: 30m, 2h, 7d, or a UTC time 2026-01-31[T12:00[:00]]")
    show.add_argument("--client", action="store_true",
                      help="this machine's log ($VGPUVIRT_AUDIT_LOG or ~/.local/state/vgpuvirt/audit.jsonl)")
    show.set_defaults(func=run)


def since_stamp(text: str, now: float | None = None) -> str:
    """``--since`` as the records' own time format, so that records compare as strings."""
    m = _RELATIVE.match(text.strip())
    if m:
        t = (time.time() if now is None else now) - int(m[1]) * _UNITS[m[2]]
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
    m = _ABSOLUTE.match(text.strip())
    if m:
        clock = (m[2] or "00:00:00") + (":00" if m[2] and len(m[2]) == 5 else "")
        try:
            time.strptime(f"{m[1]}T{clock}", "%Y-%m-%dT%H:%M:%S")
        except ValueError:
            m = None
        else:
            return f"{m[1]}T{clock}.000Z"
    raise InvalidSpec("--since", text, "a duration (30m, 2h, 7d) or a UTC time (2026-01-31 or 2026-01-31T12:00)")


def plain(value: Any) -> str:
    """A record's field as inert text (JSON for non-strings), through the CLI's one escaper."""
    return printable(value if isinstance(value, str) else json.dumps(value))


def run(ctx: Context, args: argparse.Namespace) -> int:
    since = since_stamp(args.since) if args.since else None
    if args.client:
        path = client_audit.log_path()
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            raise InvalidSpec("--client", str(path), f"a readable audit log ({exc.strerror})") from None
        log = parse_audit(text, f"client log {path}")
    else:
        log = ctx.host().read_audit()
    records = [r for r in log.records if since is None or str(r.get("t", "")) >= since]
    incomplete = log.incomplete()
    if ctx.json:
        ctx.emit_json({"host": log.host, "records": records, "incomplete": incomplete,
                       "truncated": log.truncated})
        return 0
    if log.truncated:
        print("(older records left out: only the log's tail was read)")
    for r in records:
        print(render(r))
    if not records:
        print(f"{plain(log.host)}: no audit records" + (f" since {since}" if since else ""))
    for batch in incomplete:
        print(f"INCOMPLETE batch {plain(batch)}: a begin record and no end: it was cut mid-flight (the agent, "
              "the link or the host died); re-read the host before acting on it")
    return 0


def render(r: dict[str, Any]) -> str:
    t, ev = plain(r.get("t", "?")), r.get("event")
    head = f"{t}  {plain(r.get('batch', ''))}"
    if ev == "begin":
        who = f"{plain(r.get('client_user'))}@{plain(r.get('client_host'))}"
        via = f" via ssh from {plain(r['ssh_client'])}" if r.get("ssh_client") else ""
        sudo = f" sudo by {plain(r['sudo_user'])}" if r.get("sudo_user") else ""
        return (f"{head}  begin  {who}{via}{sudo} pid={plain(r.get('pid'))} uid={plain(r.get('uid'))} "
                f"root={plain(r.get('root'))} ops={plain(r.get('ops'))}")
    if ev == "op":
        what = (f"write {plain(r.get('path'))} = {plain(json.dumps(r.get('value')))}" if r.get("op") == "write"
                else "exec " + " ".join(plain(a) for a in r.get("argv") or []))
        outcome = plain(r.get("outcome"))
        if r.get("outcome") == "failed":
            outcome += f" errno={plain(r.get('errno'))} {plain(r.get('error'))}"
        if r.get("rc") is not None:
            outcome += f" exit={plain(r['rc'])}"
        return f"{head}  op {plain(r.get('n'))}  {what} -> {outcome}"
    if ev == "end":
        return f"{head}  end  ok={plain(r.get('ok'))} failed={plain(r.get('failed'))} skipped={plain(r.get('skipped'))}"
    if "action" in r:   # the client's own log
        rest = " ".join(f"{k}={plain(v)}" for k, v in r.items()
                        if k not in ("t", "action", "target", "outcome", "user", "client_host"))
        return (f"{t}  {plain(r.get('user'))}@{plain(r.get('client_host'))}  {plain(r['action'])} "
                f"{plain(r.get('target'))} -> {plain(r.get('outcome'))}  {rest}").rstrip()
    return f"{t}  {plain(json.dumps(r, sort_keys=True))}"
