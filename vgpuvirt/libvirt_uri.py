"""The libvirt URI that goes with a Host, and one-line reasons for a failed libvirt connection.

An SSH host's default URI reaches libvirt over the same SSH identity the host itself uses: same user, port,
private key and known_hosts file, and the host key verified strictly. The transport is libvirt's plain ``ssh``
one (the OpenSSH client), chosen deliberately over ``libssh``: with libvirt 9.0 and libssh 0.10.6 (Debian 12)
a ``qemu+libssh://`` connection stops answering after a handful of ``virDomainGetXMLDesc`` calls and never
times out (issue 28), while OpenSSH carries the same calls in milliseconds. The ``ssh`` transport takes a key
file but no known_hosts file, so the URI names a small wrapper (``command=``) that runs ``ssh`` with that
file and strict checking::

    qemu+ssh://root@gpu1:2222/system?keyfile=/root/.ssh/id_ed25519&command=~/.cache/vgpuvirt/libvirt-ssh/ssh-...

The wrapper (:func:`ssh_wrapper`) passes ``-F none`` (no ssh_config: the same settings paramiko uses),
``UserKnownHostsFile=<the host's file>``, ``GlobalKnownHostsFile=none``, ``StrictHostKeyChecking=yes`` (an
unknown key and a changed key are refused, nothing is written), ``BatchMode=yes`` (never a prompt), and a
connect timeout and keep-alives, so a dead link ends in seconds instead of hanging.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from typing import Any
from urllib.parse import quote, unquote, urlsplit

# the ssh:// default known_hosts, as paramiko's SSHHost reads it
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


# ssh's keep-alive: a link that stops carrying data is closed after INTERVAL * COUNT seconds, so libvirt's
# call fails instead of waiting forever (the per-call bound in libvirt_conn covers a daemon that hangs)
SSH_CONNECT_TIMEOUT_S = 15
SSH_ALIVE_INTERVAL_S = 5
SSH_ALIVE_COUNT = 3
WRAPPER_MARK = "# vgpuvirt libvirt ssh wrapper; known_hosts="


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vgpuvirt", "libvirt-ssh")


def _private_dir(path: str) -> str:
    """``path`` created 0700; refused when another user owns it or others may write to it (they could
    swap the wrapper that libvirt runs)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} is not a private directory of this user (owner uid {st.st_uid}, "
                              f"mode {st.st_mode & 0o777:o}); vgpuvirt writes its libvirt ssh wrapper there")
    return path


def wrapper_text(known_hosts: str) -> str:
    """The wrapper script that libvirt's ``ssh`` transport runs instead of ``ssh`` (see the module doc)."""
    if any(c in known_hosts for c in '"\n\r\0'):
        raise ValueError(f"known_hosts path {known_hosts!r}: a path without quotes or line breaks")
    # ssh expands %-tokens in UserKnownHostsFile (%%: a literal %); the double quotes keep spaces in the path
    kh_opt = "UserKnownHostsFile=\"" + known_hosts.replace("%", "%%") + "\""
    opts = ["-F", "none", "-o", kh_opt, "-o", "GlobalKnownHostsFile=none", "-o", "StrictHostKeyChecking=yes",
            "-o", "UpdateHostKeys=no", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
            "-o", f"ServerAliveInterval={SSH_ALIVE_INTERVAL_S}", "-o", f"ServerAliveCountMax={SSH_ALIVE_COUNT}"]
    quoted = " ".join("'" + o.replace("'", "'\\''") + "'" for o in opts)
    return f"#!/bin/sh\n{WRAPPER_MARK}{known_hosts}\nexec ssh {quoted} \"$@\"\n"


def ssh_wrapper(known_hosts: str, directory: str | None = None) -> str:
    """Path of an executable wrapper running ``ssh`` checked strictly against ``known_hosts`` (absolute).

    Written once into ``directory`` (default: a private per-user cache directory), named by its content, so
    concurrent callers share one file and a path never changes meaning."""
    text = wrapper_text(known_hosts)
    d = _private_dir(directory or _cache_dir())
    path = os.path.join(d, "ssh-" + hashlib.sha256(text.encode()).hexdigest()[:20])
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text and os.access(path, os.X_OK):
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ssh-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o700)
        os.replace(tmp, path)       # atomic: a concurrent reader sees the old file or the whole new one
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def ssh_uri(hostname: str, *, port: int = 22, username: str | None = None, identity: str | None = None,
            known_hosts: str | None = None, driver: str = "qemu", path: str = "/system",
            wrapper_dir: str | None = None) -> str:
    """``qemu+ssh://`` URI for libvirt on an SSH host, verifying its key strictly against ``known_hosts``
    (through :func:`ssh_wrapper`, written into ``wrapper_dir`` or the per-user cache)."""
    host = f"[{hostname}]" if ":" in hostname else hostname
    netloc = f"{quote(username, safe='')}@" if username else ""
    netloc += host + (f":{port}" if port != 22 else "")
    # libvirt wants absolute paths (it does not expand ~ and resolves nothing against our cwd)
    kh = os.path.abspath(os.path.expanduser(known_hosts or DEFAULT_KNOWN_HOSTS))
    params: list[tuple[str, str]] = []
    if identity:
        params.append(("keyfile", os.path.abspath(os.path.expanduser(identity))))
    params.append(("command", ssh_wrapper(kh, wrapper_dir)))
    query = "&".join(f"{k}={quote(v, safe='/')}" for k, v in params)
    return f"{driver}+ssh://{netloc}{path}?{query}"


def default_uri(host: Any) -> str:
    """The libvirt URI for a Host: ``test:///default`` for a simulated host, ``qemu:///system`` for this
    machine, :func:`ssh_uri` with the host's own SSH settings for an SSH host."""
    # An SSHHost exists only once its module is loaded: looking it up instead of importing it keeps paramiko
    # out of a local or simulated host's run (the local verbs on a GPU host without paramiko crashed here).
    ssh = sys.modules.get("vgpuvirt.host.ssh")
    if ssh is not None and isinstance(host, ssh.SSHHost):
        return ssh_uri(host.hostname, port=host.port, username=host.username, identity=host.key_filename,
                       known_hosts=host.known_hosts)
    if host.is_local:
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
                   known_hosts=path, wrapper_dir=directory)


def display_uri(uri: str) -> str:
    """The URI without its query (key and known_hosts paths): what a one-line error names."""
    return uri.split("?", 1)[0]


def _param(uri: str, name: str) -> str | None:
    m = re.search(rf"[?&]{name}=([^&]*)", uri)
    return unquote(m[1]) if m else None


def _known_hosts_of(uri: str) -> str | None:
    """The known_hosts file a URI checks: its ``known_hosts`` parameter (libssh), or the one named in our
    ``command=`` wrapper (ssh)."""
    kh = _param(uri, "known_hosts")
    cmd = _param(uri, "command")
    if kh or not cmd:
        return kh
    try:
        with open(cmd, encoding="utf-8", errors="replace") as f:
            for line in f.read(4096).splitlines():
                if line.startswith(WRAPPER_MARK):
                    return line[len(WRAPPER_MARK):]
    except OSError:
        pass
    return None


#: libvirt's messages that say only that the ssh link closed (the ssh child's stderr was not read in time: seen
#: under load as "Cannot recv data: Value too large for defined data type" for a changed host key)
_LINK_CLOSED = r"Cannot recv data|End of file while reading data|Connection reset"

_REASONS: tuple[tuple[str, str], ...] = (
    # (pattern in libvirt's message, reason); {kh} {key} {where} are filled in
    (r"No \S+ host key is known for|Can't verify the session host key|host key .* was not accepted",
     "host key of {where} is not in {kh} (checked strictly; add the host's key after checking its fingerprint)"),
    (r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for \S+ has changed|(?-i:HOST KEY VERIFICATION FAILED)|"
     r"differs from stored identity",
     "host key of {where} CHANGED: it differs from the one in {kh}{fp}; refusing (possible man-in-the-middle)"),
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
    (r"ssh: (not found|No such file)|Cannot find 'ssh'",
     "the OpenSSH client (ssh) is not installed on this machine: libvirt's ssh transport runs it"),
    (_LINK_CLOSED, "the link to {where} closed during set-up: {msg}"),
)


SSH_PROBE_TIMEOUT_S = 15


def ssh_probe(uri: str) -> str | None:
    """ssh's own stderr for the connection ``uri`` makes, through the same wrapper (strict host key, batch mode),
    running ``true``: asked only after libvirt failed without saying why. None when ``uri`` is not a
    ``+ssh`` URI through a vgpuvirt wrapper, or the probe itself cannot run."""
    parts = urlsplit(uri)
    cmd = _param(uri, "command")
    if not parts.scheme.endswith("+ssh") or not parts.hostname or not cmd or _known_hosts_of(uri) is None:
        return None
    argv = [cmd, "-T", "-p", str(parts.port or 22)]
    if parts.username:
        argv += ["-l", unquote(parts.username)]
    key = _param(uri, "keyfile")
    if key:
        argv += ["-i", key]
    try:
        r = subprocess.run([*argv, "--", parts.hostname, "true"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=SSH_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stderr if r.returncode != 0 else None


def connect_failure(uri: str, message: str | None, probe: Any = None) -> str:
    """One line saying why opening ``uri`` failed, from libvirt's message (which names neither the file nor
    the flag, and for the ``ssh`` transport often just says the data link closed). ``probe(uri)`` (e.g.
    :func:`ssh_probe`) is asked for ssh's own words when libvirt's say only that the link closed."""
    msg = " ".join((message or "no reason given").split())
    specific = any(re.search(p, msg, re.IGNORECASE) for p, _r in _REASONS if p != _LINK_CLOSED)
    if probe is not None and not specific and re.search(_LINK_CLOSED, msg, re.IGNORECASE):
        said = probe(uri)
        if said:
            msg = " ".join(said.split()) + f" (libvirt: {msg})"
    parts = urlsplit(uri)
    where = parts.hostname or "this machine"
    if parts.hostname and parts.port:
        where += f":{parts.port}"
    kh = _known_hosts_of(uri) or "the known_hosts file"
    key = _param(uri, "keyfile") or "(default keys)"
    m = re.search(r"(SHA256:[A-Za-z0-9+/=]+)", msg)
    fp = f" (the host sent {m[1].rstrip('.')})" if m else ""
    for pattern, reason in _REASONS:
        if re.search(pattern, msg, re.IGNORECASE):
            return f"libvirt {display_uri(uri)}: " + reason.format(where=where, kh=kh, key=key, msg=msg, fp=fp)
    return f"libvirt {display_uri(uri)}: cannot connect: {msg}"
