"""Opening one SSH connection: TCP_NODELAY, host keys verified (RejectPolicy unless the caller opts in),
paramiko's failures translated into this package's typed errors, paramiko's own log kept off stderr.

Every failure of the set-up is one of: TransportError "cannot connect" (TCP), HandshakeFailed (the set-up
was cut or timed out: retryable), NotAnSshServer, HostKeyError (unknown, changed, revoked, CA-only),
AuthenticationFailed / KeyFileRefused. Nothing else escapes (paramiko raised bare EOFErrors here).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import stat

import paramiko

from vgpuvirt.errors import (
    AuthenticationFailed,
    HandshakeFailed,
    HostKeyError,
    KeyFileRefused,
    NotAnSshServer,
    TransportError,
    VgpuvirtError,
)
from vgpuvirt.host.ssh_known_hosts import KnownHosts, load_known_hosts

log = logging.getLogger("vgpuvirt.host.ssh")

# paramiko logs a failed set-up as an ERROR with a whole traceback, one record per line, on the
# "paramiko.transport" logger, which reaches stderr through any root handler (the CLI's). Our connections
# log on this channel instead; its records become one-line DEBUG records of vgpuvirt.host.ssh (-vv).
PARAMIKO_LOG = "vgpuvirt.host.ssh.paramiko"


class _AsDebug(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("paramiko: %s", record.getMessage())


_paramiko_log = logging.getLogger(PARAMIKO_LOG)
_paramiko_log.propagate = False
_paramiko_log.addHandler(_AsDebug())

DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519", "id_dsa")


class _FirstBytes(socket.socket):
    """A socket that keeps the first bytes the peer sent: they tell "not SSH" from "SSH, cut"."""

    first = b""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if len(self.first) < 256:
            self.first += data[: 256 - len(self.first)]
        return data


def _speaks_ssh(first: bytes) -> bool:
    """True unless the peer sent a line that cannot begin an SSH banner (RFC 4253 4.2: the server may send
    other lines first, so only the absence of any ``SSH-`` line, or a start that cannot become one, counts)."""
    if not first:
        return True   # nothing came: a cut, not a wrong protocol
    *complete, partial = first.split(b"\n")
    return any(line.startswith(b"SSH-") for line in complete) or (partial != b"" and (
        partial.startswith(b"SSH-") or b"SSH-".startswith(partial)))


def _abandon(client: paramiko.SSHClient, sock: socket.socket) -> None:
    # Stop paramiko's transport thread before closing its socket; closing the socket first makes the
    # thread log "Socket exception: Bad file descriptor" on stderr.
    client.close()
    sock.close()


def _fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class _Policy(paramiko.MissingHostKeyPolicy):
    """A host key that known_hosts does not list: refused (revoked, CA-only or unknown), or, with the explicit
    insecure opt-in, let through for this connection with a warning.

    Unlike paramiko's AutoAddPolicy it writes nothing: AutoAddPolicy saves the key into the known_hosts
    file the client loaded, turning one ``--insecure-accept-unknown-host-key`` into trust for good.
    """

    def __init__(self, name: str, known: KnownHosts, allow_unknown: bool) -> None:
        self.name = name
        self.known = known
        self.allow_unknown = allow_unknown

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.known.is_revoked(key):
            raise HostKeyError(self.name, f"host key {key.get_name()} {_fingerprint(key)} is REVOKED in "
                                          "known_hosts (@revoked): refusing to connect")
        if self.allow_unknown:
            log.warning("%s: accepting UNKNOWN %s host key %s for this connection only "
                        "(allow_unknown_hosts; not added to known_hosts)", hostname, key.get_name(),
                        _fingerprint(key))
            return
        ca = self.known.authority_line(hostname)
        if ca is not None:
            raise HostKeyError(self.name, f"host key unknown: known_hosts line {ca} trusts a certificate "
                                          "authority (@cert-authority) for this host, and vgpuvirt does not "
                                          "verify host certificates: add the host's own key to known_hosts")
        # the fingerprint, so the user can compare it with the host's own (ssh-keygen -lf on the host) first
        raise HostKeyError(self.name, f"host key unknown (not in known_hosts): {key.get_name()} "
                                      f"{_fingerprint(key)}; refusing to connect; add it with ssh-keyscan after "
                                      "checking that fingerprint on the host (ssh-keygen -lf "
                                      "/etc/ssh/ssh_host_*_key.pub), or opt in explicitly (allow_unknown_hosts=True)")


def _checked_key(name: str, path: str) -> str:
    """``path`` if it is a private key we may use, else KeyFileRefused.

    Like OpenSSH, a key that group or others can read is not used: whoever could read it may hold a copy.
    An explicitly named key is refused; a default ~/.ssh/id_* is skipped with a warning (_key_files)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise KeyFileRefused(name, f"cannot read private key {path}: {exc.strerror}") from exc
    if stat.S_IMODE(mode) & 0o077:
        why = (f"private key {path} is readable by group/others (mode {stat.S_IMODE(mode):04o}): refusing to use "
               f"it; chmod 600 {path}")
        raise KeyFileRefused(name, why)
    return path


def _key_files(name: str, key_filename: str | None) -> list[str]:
    if key_filename is not None:
        return [_checked_key(name, os.path.expanduser(key_filename))]
    found = []
    for base in DEFAULT_KEYS:
        p = os.path.expanduser(f"~/.ssh/{base}")
        if not os.path.exists(p):
            continue
        try:
            found.append(_checked_key(name, p))
        except KeyFileRefused as exc:
            log.warning("%s (skipped)", exc)
    return found


def open_client(name: str, hostname: str, port: int, *, username: str | None, key_filename: str | None,
                known_hosts: str | None, allow_unknown_hosts: bool, connect_timeout: float,
                keepalive: int) -> paramiko.SSHClient:
    """A connected, authenticated client to ``hostname:port``; errors name the host as ``name``."""
    client = paramiko.SSHClient()
    try:
        known = load_known_hosts(known_hosts, into=client.get_host_keys())
    except OSError as exc:
        raise HostKeyError(name, f"cannot read known_hosts {known_hosts}: {exc.strerror}") from exc
    keys = _key_files(name, key_filename)
    try:
        plain_sock = socket.create_connection((hostname, port), timeout=connect_timeout)
    except OSError as exc:
        raise TransportError(name, f"cannot connect: {exc}") from exc
    sock = _FirstBytes(plain_sock.family, plain_sock.type, plain_sock.proto, fileno=plain_sock.detach())
    sock.settimeout(connect_timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.set_log_channel(PARAMIKO_LOG)
    client.set_missing_host_key_policy(_Policy(name, known, allow_unknown_hosts))
    try:
        # key_filename takes a list too (paramiko's documented API; the stubs say str only)
        client.connect(hostname, port=port, username=username, key_filename=keys or None,  # type: ignore[arg-type]
                       sock=sock,
                       timeout=connect_timeout, banner_timeout=connect_timeout, auth_timeout=connect_timeout,
                       look_for_keys=False, allow_agent=True)
    except VgpuvirtError:
        _abandon(client, sock)
        raise
    except paramiko.BadHostKeyException as exc:
        _abandon(client, sock)
        if known.is_revoked(exc.key):
            raise HostKeyError(name, f"host key {exc.key.get_name()} {_fingerprint(exc.key)} is REVOKED in "
                                     "known_hosts (@revoked): refusing to connect") from exc
        raise HostKeyError(name, f"host key CHANGED (got {exc.key.get_name()} {_fingerprint(exc.key)}): "
                                 "refusing to connect; check the host and update known_hosts") from exc
    except paramiko.AuthenticationException as exc:
        transport = client.get_transport()
        cut = transport is None or not transport.is_active()
        _abandon(client, sock)
        if cut:  # paramiko reports a connection lost during authentication as an authentication failure
            raise HandshakeFailed(name, "connection closed during SSH authentication") from exc
        raise AuthenticationFailed(name, f"authentication failed ({exc}): the server refused "
                                         f"{'the key ' + keys[0] if key_filename else 'every key offered'}"
                                         f"{' for user ' + username if username else ''}") from exc
    except (paramiko.SSHException, EOFError, OSError) as exc:
        _abandon(client, sock)
        if not _speaks_ssh(sock.first):
            seen = sock.first.split(b"\n", 1)[0].strip()[:60].decode("ascii", "replace")
            raise NotAnSshServer(name, f"not an SSH server: it answered {seen!r}; "
                                       "check the host and port") from exc
        raise HandshakeFailed(name, "SSH set-up cut or timed out before the session was ready "
                                    f"({str(exc) or type(exc).__name__})") from exc
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(keepalive)
    return client
