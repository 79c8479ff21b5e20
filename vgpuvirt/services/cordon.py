"""Host cordon: a mark kept on the host itself, so that every controller's placement skips the host and says why.

The mark is ``/var/lib/vgpuvirt/cordon.json`` (under the host's root, beside nothing else of vgpuvirt's that
survives a reboot: a host taken out for repair is rebooted and must stay cordoned). It is written by the agent
in the host's locked, audited batch (``replace_file``: a new file renamed over the old one), and read in the
inventory's one round trip (it is one of the inventory's globs), so placement learns it at no extra cost.
Uncordon writes ``{}``: an empty mark, which the audit log records like the cordon itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Host, Op

STATE_DIR = "/var/lib/vgpuvirt"
CORDON_FILE = f"{STATE_DIR}/cordon.json"
MAX_REASON = 200


@dataclass(frozen=True)
class Cordon:
    reason: str
    by: str
    since: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "by": self.by, "since": self.since}


def parse_cordon(text: str | None) -> Cordon | None:
    """The mark's text -> a Cordon, or None (no file, ``{}``). A mark that does not parse still cordons: a
    damaged file must not quietly put the host back into service."""
    if not text or not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return Cordon("unreadable cordon mark (fix or uncordon)", "?", "?")
    if not isinstance(data, dict) or not data:
        return None
    return Cordon(str(data.get("reason") or "no reason given")[:MAX_REASON], str(data.get("by") or "?"),
                  str(data.get("since") or "?"))


def check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON or not reason.isprintable():
        raise InvalidSpec("cordon reason", reason, f"one printable line of at most {MAX_REASON} characters")
    return reason.strip()


def cordon_ops(reason: str | None, by: str, root: str = "/") -> list[Op]:
    """The batch that sets (``reason``) or clears (None) the mark, on a host whose tree is at ``root``."""
    text = "{}\n"
    if reason is not None:
        mark = {"reason": check_reason(reason), "by": by,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        text = json.dumps(mark, sort_keys=True) + "\n"
    # argv, no shell: the directory may not exist yet on a host vgpuvirt never cordoned
    return [Op.exec(["mkdir", "-p", "-m", "0700", root.rstrip("/") + STATE_DIR]), Op.replace_file(CORDON_FILE, text)]


def read_cordon(host: Host) -> Cordon | None:
    return parse_cordon(host.read([CORDON_FILE]).text(CORDON_FILE))


def set_cordon(host: Host, reason: str | None, *, by: str = "vgpuvirt") -> tuple[Cordon | None, Cordon | None]:
    """Cordon (``reason``) or uncordon (None) ``host``; returns (before, after) as read back in the same batch."""
    from vgpuvirt.errors import HostError

    before = read_cordon(host)
    batch = host.apply(cordon_ops(reason, by, host.sysfs_root), reads_after=[CORDON_FILE])
    bad = next((r for r in batch if not r.ok), None)
    if bad is not None:
        raise HostError(host.name, f"cannot {'cordon' if reason else 'uncordon'}: {bad.error or bad.errno}")
    return before, parse_cordon(batch.after.text(CORDON_FILE))


def describe(c: Cordon | None) -> dict[str, Any] | None:
    return c.to_dict() if c is not None else None
