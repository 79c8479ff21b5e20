"""SSHHost: a remote host over SSH (paramiko), agentless.

* Host keys are verified against known_hosts with RejectPolicy; an unknown or changed key is a
  :class:`HostKeyError`. Only ``allow_unknown_hosts=True`` (an explicit caller choice) lets an unknown
  key through: for that connection only, with a warning naming its fingerprint, never written to
  known_hosts. A changed key is refused either way.
* One connection, reused across calls and threads; TCP_NODELAY on the socket (paramiko does not set
  it, which costs ~40 ms per command through Nagle + delayed ACK); keepalive.
* Batched reads/writes are one exec of the remote ``python3`` running :mod:`vgpuvirt.host.agent`,
  whose source travels base64-encoded in argv and whose request travels as JSON on stdin.
* Commands are argv lists; every element is shell-quoted, so no value is ever interpreted by the
  remote shell. ``sudo=True`` prefixes ``sudo -n --`` (never prompts).
* Transport failures are retried (tenacity, policy injectable) for idempotent operations only; the
  connection's set-up (nothing of a request sent yet) for every call. Set-up errors are typed (.ssh_connect).

Opening a connection (host keys, error translation) is :mod:`.ssh_connect`; the agent's command line and
the resident agent's frames are :mod:`.ssh_agent`.
"""

from __future__ import annotations

import base64
import json
import logging
import select
import shlex
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import paramiko
import tenacity

from vgpuvirt.errors import (
    HostError,
    InvalidSpec,
    RemoteRequirementMissing,
    TransportError,
)
from vgpuvirt.host.agent import parts_needed
from vgpuvirt.host.base import BaseHost, Result
from vgpuvirt.host.ssh_agent import FOREIGN_BYTECODE, agent_command, read_frame, sudo_problem
from vgpuvirt.host.ssh_connect import open_client
from vgpuvirt.model import resolvable_host_name

__all__ = ["ARGV_REQUEST_MAX", "RetryFactory", "SSHHost", "agent_command", "default_retry", "no_retry"]

log = logging.getLogger(__name__)

RetryFactory = Callable[[], tenacity.Retrying]

# Largest request (base64 of zlib'd JSON) sent in argv. The remote shell gets the whole command line as
# one argument, which Linux caps at 128 KiB (MAX_ARG_STRLEN); the agent's bootstrap takes ~42 KiB of it.
ARGV_REQUEST_MAX = 64 * 1024


def default_retry() -> tenacity.Retrying:
    """Three attempts on retryable transport errors (a refused, cut or timed-out connection or SSH set-up;
    never a host-key error or a peer that is no SSH server), short exponential backoff."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, TransportError) and e.retryable),
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
        reraise=True,
    )

def no_retry() -> tenacity.Retrying:
    return tenacity.Retrying(stop=tenacity.stop_after_attempt(1), reraise=True)


def _close_quietly(chan: paramiko.Channel) -> None:
    """The exec watchdog's close: paramiko marks the channel closed (which wakes the waiting exec request) before
    it sends the close message, and that send fails on the dead link the watchdog is there for; the failure has
    nobody to go to in the timer's thread (it printed a traceback there) and the waiter reports the link."""
    try:
        chan.close()
    except (paramiko.SSHException, EOFError, OSError):
        pass


class SSHHost(BaseHost):
    def __init__(
        self,
        hostname: str,
        *,
        port: int = 22,
        username: str | None = None,
        key_filename: str | None = None,
        known_hosts: str | None = None,
        allow_unknown_hosts: bool = False,
        sudo: bool = False,
        sysfs_root: str = "/",
        connect_timeout: float = 10.0,
        command_timeout: float = 300.0,
        keepalive: int = 15,
        retry: RetryFactory = default_retry,
        python: str = "python3",
        lock_path: str | None = None,
        resident: bool = True,
    ) -> None:
        if not hostname or any(c in hostname for c in " \t\n/@'\"\\;|&$`") or hostname.startswith("-") \
                or not resolvable_host_name(hostname):
            raise InvalidSpec("SSH host name", hostname, "a host name or IP address (DNS labels of 1 to 63 "
                                                         "characters, 253 in all)")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidSpec("SSH port", port, "1..65535")
        if username is not None and (not username or username.startswith("-")
                                     or not all(c.isalnum() or c in "._-" for c in username)):
            raise InvalidSpec("SSH user", username, "a POSIX user name")
        if not sysfs_root.startswith("/") or ".." in sysfs_root.split("/"):
            raise InvalidSpec("sysfs root", sysfs_root, "an absolute path without '..'")
        label = f"{username + '@' if username else ''}{hostname}{':' + str(port) if port != 22 else ''}"
        super().__init__(f"ssh://{label}", sysfs_root)
        self.hostname = hostname
        self.port = port
        self.username = username
        self.key_filename = key_filename
        self.known_hosts = known_hosts
        self.allow_unknown_hosts = allow_unknown_hosts
        self.sudo = sudo
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self.retry = retry
        self.python = python
        #: seconds the agent itself spent on the host in the last batched call (the rest is network and ssh)
        self.last_agent_s: float | None = None
        #: send the agent compiled by this client (no compilation on the host); set False for good once the
        #: host's Python turned out to read other bytecode (its bootstrap refused, having run nothing)
        self.bytecode = True
        if lock_path is not None:
            self.lock_path = lock_path
        self._client: paramiko.SSHClient | None = None
        self._conn_lock = threading.Lock()
        # One session channel opened ahead of time: opening a channel costs a round trip, and the next
        # exec then pays only for its exec request. Over a 25 ms link that is 25 ms off every call.
        self._spare: paramiko.Channel | None = None
        self._spare_lock = threading.Lock()
        # The connection's resident agent (``agent --serve`` on a session channel): reads and batches after
        # the first skip the interpreter's start and the agent's compilation on the host (~20 ms each).
        # One caller at a time uses it; a caller that finds it busy runs its own exec, as resident=False does.
        self.resident = resident
        self._resident: paramiko.Channel | None = None
        self._resident_lock = threading.Lock()

    @property
    def is_local(self) -> bool:
        return False    # even ssh://localhost may reach a container or a forwarded port: no proof of "here"

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> paramiko.SSHClient:
        with self._conn_lock:
            if self._client is not None:
                t = self._client.get_transport()
                if t is not None and t.is_active():
                    return self._client
                self._client.close()
                self._client = None
            client = open_client(self.name, self.hostname, self.port, username=self.username,
                                 key_filename=self.key_filename, known_hosts=self.known_hosts,
                                 allow_unknown_hosts=self.allow_unknown_hosts,
                                 connect_timeout=self.connect_timeout, keepalive=self.keepalive)
            self._client = client
            return client

    def _drop(self) -> None:
        with self._spare_lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
        resident, self._resident = self._resident, None
        if resident is not None:
            resident.close()
        with self._conn_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def close(self) -> None:
        self._drop()

    def host_key_line(self) -> str:
        """The known_hosts line of the key this connection verified (or, with ``allow_unknown_hosts``, accepted):
        lets another client of the same host (libvirt) check the very same key."""
        transport = self._connect().get_transport()
        if transport is None:
            raise TransportError(self.name, "the SSH connection closed")
        key = transport.get_remote_server_key()
        where = self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"
        return f"{where} {key.get_name()} {key.get_base64()}\n"

    # -- one exec ---------------------------------------------------------------------------
    def _command_line(self, argv: Sequence[str]) -> str:
        prefix = ["sudo", "-n", "--"] if self.sudo else []
        return " ".join(shlex.quote(a) for a in [*prefix, *argv])

    def _start(self, transport: paramiko.Transport, argv: Sequence[str], timeout: float) -> paramiko.Channel:
        """A session channel (the spare one when there is one) running ``argv``."""
        chan = self._take_spare(transport) or transport.open_session(timeout=self.connect_timeout)
        self._refill_spare(transport)
        chan.settimeout(timeout)
        # paramiko waits for the server's answer to the exec request without any timeout; a server that
        # stops answering there would hang us for ever. A watchdog closes the channel, which wakes that
        # wait with an SSHException (then: TransportError, connection dropped).
        watchdog = threading.Timer(self.connect_timeout, _close_quietly, (chan,))
        watchdog.daemon = True
        watchdog.start()
        try:
            chan.exec_command(self._command_line(argv))
        except BaseException:
            chan.close()
            raise
        finally:
            watchdog.cancel()
        return chan

    def _exec_once(self, argv: Sequence[str], stdin: bytes, timeout: float) -> tuple[int, bytes, bytes]:
        client = self._connect()
        self._count_round_trip()
        try:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("SSH session not active")
            chan = self._start(transport, argv, timeout)
            try:
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                out: list[bytes] = []
                err: list[bytes] = []
                deadline = time.monotonic() + timeout
                while True:
                    if chan.recv_ready():
                        out.append(chan.recv(1 << 16))
                        continue
                    if chan.recv_stderr_ready():
                        err.append(chan.recv_stderr(1 << 16))
                        continue
                    if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    if chan.closed and not chan.exit_status_ready():
                        raise paramiko.SSHException("channel closed before the command exited")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    if chan.eof_received:
                        # After EOF (no more data on either stream) paramiko keeps the channel's pipe readable
                        # for good, so select() would return at once until the exit status arrives: a busy loop
                        # of 250-1,700 turns per exec. Wait on the exit-status event (also set on close).
                        chan.status_event.wait(min(left, 1.0))
                    else:
                        select.select([chan], [], [], min(left, 1.0))
                # drain anything that raced with the exit status
                while chan.recv_ready():
                    out.append(chan.recv(1 << 16))
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(1 << 16))
                status = chan.recv_exit_status()
                if status == -1 and not transport.is_active():
                    # paramiko also "finishes" a channel whose transport died, with status -1: that is a
                    # lost connection (the command's outcome is unknown), not a command that failed.
                    raise paramiko.SSHException("connection closed before the command's exit status arrived")
                return status, b"".join(out), b"".join(err)
            finally:
                chan.close()
        except TimeoutError as exc:
            raise HostError(self.name, f"{argv[0]} did not finish within {timeout} s") from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(self.name, f"connection lost: {exc or type(exc).__name__}") from exc

    def _resident_once(self, packed: bytes, first: Sequence[str]) -> tuple[int, bytes, bytes]:
        """One request to the resident agent, started here with the request in argv when there is none.

        Returns (0, answer, b"") or, when the agent ended instead of answering, its (exit status, b"",
        stderr) for the same handling as a failed exec. A request is written to a live agent only:
        an agent found gone is restarted before anything is sent.
        """
        client = self._connect()
        self._count_round_trip()
        timeout = self.command_timeout
        try:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("SSH session not active")
            chan = self._resident
            if chan is not None and (chan.closed or chan.eof_received or chan.exit_status_ready()
                                     or chan.get_transport() is not transport):
                chan.close()
                chan = self._resident = None
            if chan is None:
                argv = [*agent_command(self.python, self.bytecode), "--serve", *first]
                chan = self._resident = self._start(transport, argv, timeout)
                if not first:
                    chan.sendall(struct.pack(">I", len(packed)) + packed)
            else:
                chan.sendall(struct.pack(">I", len(packed)) + packed)
            answer = read_frame(chan)
            if answer is not None:
                return 0, answer, b""
            # The agent ended without answering: report it as the exec path would.
            self._resident = None
            chan.status_event.wait(min(timeout, 5.0))
            err = b""
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
            status = chan.exit_status if chan.exit_status_ready() else -1
            chan.close()
            if status == -1 and not transport.is_active():
                raise paramiko.SSHException("connection closed before the agent answered")
            return (status if status != 0 else 1), b"", err or b"the resident agent closed its output"
        except TimeoutError as exc:
            self._close_resident()
            raise HostError(self.name, f"the agent did not answer within {timeout} s") from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(self.name, f"connection lost: {exc or type(exc).__name__}") from exc

    def _close_resident(self) -> None:
        chan, self._resident = self._resident, None
        if chan is not None:
            chan.close()

    def _take_spare(self, transport: paramiko.Transport) -> paramiko.Channel | None:
        with self._spare_lock:
            chan, self._spare = self._spare, None
        if chan is not None and (chan.closed or chan.get_transport() is not transport or not transport.is_active()):
            chan.close()
            return None
        return chan

    def _refill_spare(self, transport: paramiko.Transport) -> None:
        """Open the next call's channel in the background (failures only mean no spare)."""
        def opener() -> None:
            try:
                chan = transport.open_session(timeout=self.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError):
                return
            leftover: paramiko.Channel | None = chan
            with self._spare_lock:
                if self._spare is None and transport.is_active():
                    self._spare, leftover = chan, None
            if leftover is not None:
                leftover.close()
        threading.Thread(target=opener, name="vgpuvirt-ssh-spare", daemon=True).start()

    def _call(self, fn: Callable[[], Any], idempotent: bool) -> Any:
        if not idempotent:
            # Setting up the connection sends nothing of the request: it is retried for every call. The
            # request itself is sent once (its fate after a cut is unknown; the caller re-reads).
            self.retry()(self._connect)
            return fn()
        return self.retry()(fn)

    def _run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
             idempotent: bool = False) -> Result:
        argv = tuple(argv)
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise InvalidSpec("argv", argv, "a non-empty list of strings")
        rc, out, err = self._call(
            lambda: self._exec_once(argv, (stdin or "").encode(), timeout or self.command_timeout), idempotent)
        problem = sudo_problem(self.name, rc, err) if self.sudo else None
        if problem is not None:  # the command never ran: not its own exit status
            raise problem
        return Result(argv, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        payload = json.dumps({**request, "compress": True}).encode()
        packed = zlib.compress(payload, 6)
        # A request that fits travels in argv: sshd opens a session channel with a zero window and
        # widens it only once the command runs, so stdin costs one more round trip than argv.
        blob = base64.b64encode(packed).decode("ascii")
        in_argv = [blob] if len(blob) <= ARGV_REQUEST_MAX else []
        started = time.monotonic()
        if self.resident and self._resident_lock.acquire(blocking=False):
            try:
                rc, out, err = self._call(lambda: self._resident_once(packed, in_argv), idempotent)
            finally:
                self._resident_lock.release()
        else:
            # only the agent's parts that this request runs (a read: its core, half of it to load on the host)
            argv = [*agent_command(self.python, self.bytecode, parts_needed(request)), *in_argv]
            stdin = b"" if in_argv else payload
            rc, out, err = self._call(lambda: self._exec_once(argv, stdin, self.command_timeout), idempotent)
        if rc != 0 and self.bytecode and FOREIGN_BYTECODE in err:
            # Another Python on the host: the bootstrap stopped before the agent ran, so sending the same
            # request again (from source, as every later call will) cannot do anything twice.
            log.debug("%s: the host's python reads other bytecode; the agent goes as source", self.name)
            self.bytecode = False
            return self._exchange(request, idempotent=idempotent)
        problem = sudo_problem(self.name, rc, err) if self.sudo else None
        if problem is not None:
            raise problem
        if rc == 127 or (rc != 0 and b"not found" in err and self.python.encode() in err):
            raise RemoteRequirementMissing(self.name, f"{self.python} (>= 3.6) is required on the host but was not "
                                                      f"found: {err.decode(errors='replace').strip()}")
        if rc != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise HostError(self.name, f"remote agent failed (exit {rc}): {' | '.join(tail) or 'no output'}")
        try:
            # An agent that could not even parse the request answers uncompressed.
            response: dict[str, Any] = json.loads(zlib.decompress(out) if out[:1] != b"{" else out)
        except (zlib.error, ValueError) as exc:
            raise HostError(self.name, f"remote agent sent an unreadable answer ({len(out)} bytes)") from exc
        agent_s = response.get("agent_s")
        self.last_agent_s = float(agent_s) if isinstance(agent_s, (int, float)) else None
        log.debug("%s: agent call %.3f s, of which %s s on the host, %d bytes back", self.name,
                  time.monotonic() - started, agent_s, len(out))
        return response
