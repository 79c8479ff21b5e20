"""The host's audit log as the client reads it: records, and the batches cut mid-flight.

The agent writes it (``vgpuvirt.host.agent.Audit``); :meth:`BaseHost.read_audit` reads it in one round
trip; ``vgpuvirt audit show`` prints it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import InvalidSpec

__all__ = ["AuditLog", "checked_audit_path", "parse_audit"]


def checked_audit_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or path.endswith("/") \
            or any(p in (".", "..") for p in path.split("/")):
        raise InvalidSpec("audit log path", path, "an absolute file path without '.' or '..'")
    return path


@dataclass(frozen=True)
class AuditLog:
    """The host's audit records (oldest first) as :meth:`BaseHost.read_audit` returned them."""

    host: str
    records: tuple[dict[str, Any], ...]
    truncated: bool = False     # only the tail was read

    def incomplete(self) -> list[str]:
        """Batches with a "begin" and no "end": cut mid-flight (the agent killed, the link or the host down)."""
        begun = [r.get("batch") for r in self.records if r.get("event") == "begin"]
        ended = {r.get("batch") for r in self.records if r.get("event") == "end"}
        return [str(b) for b in begun if b not in ended]


def parse_audit(text: str, host: str, truncated: bool = False) -> AuditLog:
    """The records of a log's text. A last line without its newline that does not parse is a record being
    written (or cut by a crash mid-write): left out, not shown as unreadable."""
    records: list[dict[str, Any]] = []
    lines = text.split("\n")
    if lines and lines[-1].strip():
        try:
            json.loads(lines[-1])
        except ValueError:
            lines.pop()
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        records.append(rec if isinstance(rec, dict) else {"event": "unreadable", "text": line[:200]})
    return AuditLog(host, tuple(records), truncated)
