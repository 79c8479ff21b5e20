"""Opening one SSH connection: TCP_NODELAY, host keys verified (RejectPolicy unless the caller opts in),
paramiko's failures translated into this package's errors."""

from __future__ import annotations

import base64
import hashlib
import logging
import socket

import paramiko

from vgpuvirt.errors import HostError, HostKeyError, TransportError

log = logging.getLogger("vgpuvirt.host.ssh")


def _abandon(client: paramiko.SSHClient, sock: socket.socket) -> None:
    # Stop paramiko's transport thread before closing its socket; closing the socket first makes the
    # thread log "Socket exception: Bad file descriptor" on stderr.
    client.close()
    sock.close()


class _AcceptUnknownOnce(paramiko.MissingHostKeyPolicy):
    """The explicit insecure opt-in: let an unknown host key through for this connection, say so.

    Unlike paramiko's AutoAddPolicy it writes nothing: AutoAddPolicy saves the key into the
    known_hosts file the client loaded, turning one ``--insecure-accept-unknown-host-key`` into
    trust for good.
    """

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        log.warning("%s: accepting UNKNOWN %s host key SHA256:%s for this connection only "
                    "(allow_unknown_hosts; not added to known_hosts)", hostname, key.get_name(), digest)



def open_client(name: str, hostname: str, port: int, *, username: str | None, key_filename: str | None,
                known_hosts: str | None, allow_unknown_hosts: bool, connect_timeout: float,
                keepalive: int) -> paramiko.SSHClient:
    """A connected, authenticated client to ``hostname:port``; errors name the host as ``name``."""
    try:
        sock = socket.create_connection((hostname, port), timeout=connect_timeout)
    except OSError as exc:
        raise TransportError(name, f"cannot connect: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = paramiko.SSHClient()
    if known_hosts:
        try:
            client.load_host_keys(known_hosts)
        except OSError as exc:
            sock.close()
            raise HostKeyError(name, f"cannot read known_hosts {known_hosts}: {exc}") from exc
    else:
        client.load_system_host_keys()
    policy: paramiko.MissingHostKeyPolicy = _AcceptUnknownOnce() if allow_unknown_hosts else paramiko.RejectPolicy()
    client.set_missing_host_key_policy(policy)
    try:
        client.connect(hostname, port=port, username=username, key_filename=key_filename, sock=sock,
                       timeout=connect_timeout, banner_timeout=connect_timeout, auth_timeout=connect_timeout,
                       look_for_keys=key_filename is None, allow_agent=True)
    except paramiko.BadHostKeyException as exc:
        _abandon(client, sock)
        raise HostKeyError(name, f"host key CHANGED (got {exc.key.get_name()} "
                                 f"{exc.key.get_base64()[:16]}...): refusing to connect; "
                                 "check the host and update known_hosts") from exc
    except paramiko.AuthenticationException as exc:
        _abandon(client, sock)
        raise HostError(name, f"authentication failed: {exc}") from exc
    except paramiko.SSHException as exc:
        _abandon(client, sock)
        if "not found in known_hosts" in str(exc):
            raise HostKeyError(name, "host key unknown (not in known_hosts): refusing to connect; "
                                     "add it with ssh-keyscan after checking its fingerprint, "
                                     "or opt in explicitly (allow_unknown_hosts=True, CLI "
                                     "--insecure-accept-unknown-host-key)") from exc
        raise TransportError(name, f"SSH handshake failed: {exc}") from exc
    except OSError as exc:
        _abandon(client, sock)
        raise TransportError(name, f"connection failed: {exc}") from exc
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(keepalive)
    return client
