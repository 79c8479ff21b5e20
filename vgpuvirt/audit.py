"""The client's audit trail: what this machine asked of hosts and libvirt, with the outcome.

Each record is one JSON line appended to ``$VGPUVIRT_AUDIT_LOG`` or, by default,
``$XDG_STATE_HOME/vgpuvirt/audit.jsonl`` (``~/.local/state/vgpuvirt/audit.jsonl``), in a directory created
0700 and a file created 0600, never through a link; the same line goes to the ``vgpuvirt.audit`` logger.
Hosts keep their own log of every mutating batch (written by the agent, see docs/host.md); this one adds
what only the client sees: libvirt calls (define, start, shutdown, destroy, undefine, attach, detach,
volume deletion) and ``Host.run()``.

A record that cannot be written (read-only home, full disk) costs a warning, never the operation.
Stdlib only: every layer above ``model`` may record.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("vgpuvirt.audit.trail")

#: longest text kept of one field (a domain's XML is not the log's business)
FIELD_MAX = 256

_warned: set[str] = set()


def _open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def log_path() -> Path:
    env = os.environ.get("VGPUVIRT_AUDIT_LOG")
    if env:
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "vgpuvirt" / "audit.jsonl"


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def _clip(v: Any) -> Any:
    if isinstance(v, str) and len(v) > FIELD_MAX:
        return v[:FIELD_MAX] + f"...({len(v)} chars)"
    if isinstance(v, (list, tuple)):
        return [_clip(x) for x in v[:32]]
    return v


def os_user() -> str:
    """The account this process runs as (its uid's name), never ``$USER``/``$LOGNAME``, which anyone sets."""
    return _user_name(os.geteuid())


@functools.lru_cache(maxsize=8)
def _user_name(euid: int) -> str:
    # looked up once per uid: reading the user database (open, read, close /etc/passwd or NSS) for each record
    # was a third of a record's system calls, and each lets another thread take the interpreter
    try:
        import pwd
        return pwd.getpwuid(euid).pw_name
    except (ImportError, KeyError):
        return str(euid)


@functools.cache
def client_host() -> str:
    return socket.gethostname()   # once per process (a system call each record, for a name that stays)


class _Sink:
    """The log's file, kept open between records: opening and closing it per record were two of a record's three
    system calls, and each lets another thread take the interpreter (provisioning 32 hosts in threads).

    Kept per path (``$VGPUVIRT_AUDIT_LOG`` read at each record) and process (a forked child opens its own). A log
    rotated by renaming or deleted is noticed at the first record after at most ``RECHECK_S`` seconds (one
    ``stat`` of the path against the open file): records written within that window go where the open file went,
    into the renamed file (logrotate's default) or with a deleted one. A truncation in place (logrotate's
    ``copytruncate``) needs nothing: the file is open for appending.

    The lock guards which descriptor is current, not the write itself: a thread holding it through a write would
    make every other recording thread wait on it. A descriptor replaced while threads still write to it is closed
    by the last of them (never while in use: its number could be reused for another file).
    """

    RECHECK_S = 1.0

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd = -1
        self.path = ""
        self.ident: tuple[int, int] = (0, 0)
        self.checked = 0.0
        self.writers: dict[int, int] = {}      # descriptor -> threads writing to it now

    def write(self, path: Path, data: bytes) -> None:
        with self.lock:
            fd = self._current(path)
            self.writers[fd] = self.writers.get(fd, 0) + 1
        failed = False
        try:
            os.write(fd, data)
        except OSError:
            failed = True      # the next record opens the file again (a full disk may have room by then)
            raise
        finally:
            with self.lock:
                if failed and fd == self.fd:
                    self.fd = -1
                left = self.writers.pop(fd) - 1
                if left:
                    self.writers[fd] = left
                elif fd != self.fd:
                    _close(fd)

    def _current(self, path: Path) -> int:
        name, now = str(path), time.monotonic()
        if self.fd >= 0 and (name != self.path or now - self.checked >= self.RECHECK_S):
            if name != self.path or self._moved(path):
                self._retire()
            self.checked = now
        if self.fd < 0:
            try:
                fd = _open_log(path)
            except FileNotFoundError:   # the first record: its directory is made then, not checked at each record
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = _open_log(path)
            st = os.fstat(fd)
            self.fd, self.ident, self.path, self.checked = fd, (st.st_dev, st.st_ino), name, now
        return self.fd

    def _moved(self, path: Path) -> bool:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident

    def _retire(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0 and fd not in self.writers:
            _close(fd)       # else its last writer closes it

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread may have held the parent's) and the parent's
        descriptors closed (the threads that wrote to them are not in the child); its first record opens its own."""
        self.lock = threading.Lock()
        for fd in {self.fd, *self.writers} - {-1}:
            _close(fd)
        self.fd, self.writers = -1, {}


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


_sink = _Sink()
os.register_at_fork(after_in_child=_sink.after_fork)


def record(action: str, target: str, outcome: str, **fields: Any) -> None:
    """Append one record (``outcome``: ok, failed, or what a command exited with)."""
    rec = {"t": _now(), "user": os_user(), "client_host": client_host(), "pid": os.getpid(),
           "action": action, "target": target, "outcome": outcome,
           **{k: _clip(v) for k, v in fields.items() if v is not None}}
    line = json.dumps(rec, separators=(",", ":"), default=str)
    log.info("%s", line)
    path = log_path()
    try:
        _sink.write(path, (line + "\n").encode())
    except OSError as exc:
        if str(path) not in _warned:   # once per path: a read-only home should not flood the terminal
            _warned.add(str(path))
            log.warning("cannot write the audit log %s: %s (set VGPUVIRT_AUDIT_LOG)", path, exc.strerror or exc)


@contextmanager
def audited(action: str, target: str, **fields: Any) -> Iterator[None]:
    """Record ``action`` on ``target`` with its outcome: "ok", or "failed" with the error (and its code)."""
    try:
        yield
    except BaseException as exc:
        failed(action, target, exc, **fields)
        raise
    record(action, target, "ok", **fields)


def failed(action: str, target: str, exc: BaseException, **fields: Any) -> None:
    """Record ``action`` on ``target`` as failed with ``exc`` (and its code), as :func:`audited` does."""
    code = getattr(exc, "code", None)
    record(action, target, "failed", error=f"{type(exc).__name__}: {exc}",
           code=code if isinstance(code, int) else None, **fields)
