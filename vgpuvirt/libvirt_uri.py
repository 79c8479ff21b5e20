"""The libvirt URI that goes with a Host, and one-line reasons for a failed libvirt connection.

An SSH host's default URI reaches libvirt over the same SSH identity the host itself uses: same user, port,
private key and known_hosts file, and the host key verified strictly. libvirt's plain ``ssh`` transport runs
the ``ssh`` binary, which can be given a key file but not a known_hosts file (only a wrapper script could), so
the default is the ``libssh`` transport, where both are URI parameters::

    qemu+libssh://root@gpu1:2222/system?known_hosts=/root/.ssh/known_hosts&known_hosts_verify=normal
        &keyfile=/root/.ssh/id_ed25519&sshauth=privkey

``known_hosts_verify=normal`` with no interactive callback (the Python bindings' ``open`` has none) refuses an
unknown key and a changed key alike, and never writes the file.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import quote, urlsplit

# the ssh:// default known_hosts, as paramiko's SSHHost reads it
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def ssh_uri(hostname: str, *, port: int = 22, username: str | None = None, identity: str | None = None,
            known_hosts: str | None = None, driver: str = "qemu", path: str = "/system") -> str:
    """``qemu+libssh://`` URI for libvirt on an SSH host, verifying its key strictly against ``known_hosts``."""
    host = f"[{hostname}]" if ":" in hostname else hostname
    netloc = f"{quote(username, safe='')}@" if username else ""
    netloc += host + (f":{port}" if port != 22 else "")
    # libvirt wants absolute paths (it does not expand ~ and resolves nothing against our cwd)
    params = [("known_hosts", os.path.abspath(os.path.expanduser(known_hosts or DEFAULT_KNOWN_HOSTS))),
              ("known_hosts_verify", "normal")]
    if identity:
        params += [("keyfile", os.path.abspath(os.path.expanduser(identity))), ("sshauth", "privkey")]
    query = "&".join(f"{k}={quote(v, safe='/')}" for k, v in params)
    return f"{driver}+libssh://{netloc}{path}?{query}"


def default_uri(host: Any) -> str:
    """The libvirt URI for a Host: ``test:///default`` for a simulated host, ``qemu:///system`` for this
    machine, :func:`ssh_uri` with the host's own SSH settings for an SSH host."""
    from vgpuvirt.host.local import LocalHost
    from vgpuvirt.host.ssh import SSHHost

    if isinstance(host, SSHHost):
        return ssh_uri(host.hostname, port=host.port, username=host.username, identity=host.key_filename,
                       known_hosts=host.known_hosts)
    if isinstance(host, LocalHost):
        return "qemu:///system"
    return "test:///default"


def accepted_key_uri(host: Any, directory: str) -> str:
    """:func:`default_uri` of an SSH host opened with ``allow_unknown_hosts``: libvirt checks the key that the
    host's own connection accepted (a changed key was refused there), through a known_hosts file written in
    ``directory`` for this run only (the user's file plus that key); the user's file is never written."""
    known = os.path.abspath(os.path.expanduser(host.known_hosts or DEFAULT_KNOWN_HOSTS))
    try:
        with open(known, encoding="utf-8", errors="replace") as f:
            lines = f.read()
    except FileNotFoundError:
        lines = ""
    path = os.path.join(directory, "known_hosts")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(lines + ("" if not lines or lines.endswith("\n") else "\n") + host.host_key_line())
    return ssh_uri(host.hostname, port=host.port, username=host.username, identity=host.key_filename,
                   known_hosts=path)


def display_uri(uri: str) -> str:
    """The URI without its query (key and known_hosts paths): what a one-line error names."""
    return uri.split("?", 1)[0]


def _param(uri: str, name: str) -> str | None:
    m = re.search(rf"[?&]{name}=([^&]*)", uri)
    return m[1] if m else None


_REASONS: tuple[tuple[str, str], ...] = (
    # (pattern in libvirt's message, reason); {kh} {key} {where} are filled in
    (r"Can't verify the session host key|host key .* was not accepted",
     "host key of {where} is not in {kh} (checked strictly; add the host's key after checking its fingerprint)"),
    (r"(?-i:HOST KEY VERIFICATION FAILED)|differs from stored identity",
     "host key of {where} CHANGED: it differs from the one in {kh}; refusing (possible man-in-the-middle)"),
    (r"Host key verification failed",
     "host key of {where} not verified by ssh (unknown or changed in ssh's known_hosts)"),
    (r"error while reading private key|Failed to read private key|no such (private )?key",
     "cannot read the private key {key}"),
    (r"Access denied|failed to authenticate|Permission denied|authentication failed",
     "SSH authentication refused for {where} (key {key})"),
    (r"Connection refused", "connection refused by {where}"),
    (r"No route to host|Network is unreachable|Name or service not known|Could not resolve|"
     r"Temporary failure in name resolution", "{where} unreachable: {msg}"),
    (r"Failed to connect socket to .*(libvirt-sock|virtqemud-sock).*No such file|"
     r"Failed to connect socket to .*Connection refused",
     "libvirtd is not running on {where} (its socket does not answer)"),
    (r"Cannot recv data|End of file while reading data|Connection reset",
     "the link to {where} closed during set-up: {msg}"),
)


def connect_failure(uri: str, message: str | None) -> str:
    """One line saying why opening ``uri`` failed, from libvirt's message (which names neither the file nor
    the flag, and for the ``ssh`` transport often just says the data link closed)."""
    msg = " ".join((message or "no reason given").split())
    parts = urlsplit(uri)
    where = parts.hostname or "this machine"
    if parts.hostname and parts.port:
        where += f":{parts.port}"
    kh = _param(uri, "known_hosts") or "the known_hosts file"
    key = _param(uri, "keyfile") or "(default keys)"
    for pattern, reason in _REASONS:
        if re.search(pattern, msg, re.IGNORECASE):
            return f"libvirt {display_uri(uri)}: " + reason.format(where=where, kh=kh, key=key, msg=msg)
    return f"libvirt {display_uri(uri)}: cannot connect: {msg}"
