"""known_hosts, read here rather than by paramiko: paramiko's HostKeys has no notion of OpenSSH's markers.

It reads ``@revoked host key-type base64`` as a host named ``@revoked`` with key type ``host`` (the line is
lost, so a revoked key that is also listed as trusted is trusted), and chokes or silently skips
``@cert-authority``. Here:

* ``@revoked`` keys are never accepted, for any host (OpenSSH: "must not ever be accepted"), even when
  another line lists them as trusted;
* ``@cert-authority`` lines are kept aside: vgpuvirt (paramiko) does not verify host certificates, so a
  host that known_hosts trusts only through a CA is refused with a line that says so, instead of "unknown";
* every other line is loaded as paramiko would; a malformed line is skipped, as OpenSSH does.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import re
from dataclasses import dataclass, field

import paramiko

log = logging.getLogger("vgpuvirt.host.ssh")

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass
class KnownHosts:
    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    #: (key type, key blob) of every @revoked line
    revoked: set[tuple[str, bytes]] = field(default_factory=set)
    #: (line number, host patterns) of every @cert-authority line
    authorities: list[tuple[int, list[str]]] = field(default_factory=list)

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return (key.get_name(), key.asbytes()) in self.revoked

    def authority_line(self, lookup: str) -> int | None:
        """The line of a @cert-authority entry whose patterns match ``lookup`` (``host`` or ``[host]:port``)."""
        for lineno, patterns in self.authorities:
            if host_matches(lookup, patterns):
                return lineno
        return None


def host_matches(lookup: str, patterns: list[str]) -> bool:
    """OpenSSH's host pattern list: ``*``/``?`` wildcards, ``!`` negation (wins), ``|1|`` hashed names."""
    lookup = lookup.lower()
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        p = pattern[1:] if negated else pattern
        if p.startswith("|1|"):
            hit = hmac.compare_digest(paramiko.HostKeys.hash_host(lookup, p), p)
        else:  # only * and ? are wildcards ("[127.0.0.1]:2222" is literal brackets, not fnmatch's set)
            hit = re.fullmatch(".*".join(".".join(map(re.escape, part.split("?"))) for part in p.lower().split("*")),
                               lookup) is not None
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def load_known_hosts(path: str | None, *, into: paramiko.HostKeys | None = None) -> KnownHosts:
    """Parse ``path`` (default ``~/.ssh/known_hosts``; a missing default file is an empty one); the trusted
    keys go ``into`` the given HostKeys (a client's), else a new one.

    Raises OSError when an explicitly named file cannot be read."""
    explicit = path is not None
    path = os.path.expanduser(path or DEFAULT_KNOWN_HOSTS)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        if explicit:
            raise
        return KnownHosts(into if into is not None else paramiko.HostKeys())
    known = KnownHosts(into if into is not None else paramiko.HostKeys())
    plain: list[paramiko.hostkeys.HostKeyEntry] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            fields = line.split()
            marker = fields[0].lower()
            if marker not in ("@revoked", "@cert-authority") or len(fields) < 4:
                log.debug("%s:%d: unknown marker or short line, skipped", path, lineno)
                continue
            if marker == "@cert-authority":
                known.authorities.append((lineno, fields[1].split(",")))
                continue
            try:
                known.revoked.add((fields[2], base64.b64decode(fields[3], validate=True)))
            except (binascii.Error, ValueError):
                log.debug("%s:%d: @revoked key is not base64, skipped", path, lineno)
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception as exc:  # paramiko raises several kinds for a bad line
            log.debug("%s:%d: unreadable line skipped: %s", path, lineno, exc)
            continue
        if entry is not None and entry.key is not None:
            plain.append(entry)
    seen: set[tuple[str, str]] = set()
    for entry in plain:
        if known.is_revoked(entry.key):
            continue
        for name in entry.hostnames:
            # HostKeys.add replaces a key of the same type; the file's first line for a host wins, as in paramiko
            if (name, entry.key.get_name()) not in seen:
                seen.add((name, entry.key.get_name()))
                known.keys.add(name, entry.key.get_name(), entry.key)
    return known
