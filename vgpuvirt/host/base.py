"""The Host protocol: the only door to a host.

A Host does three things, each in ONE round trip:

* ``run(argv)``: run a program given as argv (never through a shell) and return a :class:`Result`;
* ``read(patterns)``: read every file/symlink/dir matching a set of globs and return a :class:`Snapshot`;
* ``apply(ops)``: apply a batch of :class:`Op` (writes, checks, waits, execs), optionally under the
  host-side flock, and return one :class:`OpResult` per op.

:class:`BaseHost` implements ``read``/``apply`` on top of one primitive, ``_exchange(request)``,
which LocalHost runs in-process, SSHHost runs as one remote ``python3`` exec and SimHost runs
against the simulated sysfs. Every mutation is logged on the ``vgpuvirt.audit`` logger. The values
travel in :mod:`.ops` (Op, OpResult, BatchResult) and :mod:`.snapshot` (Result, Snapshot); this module
re-exports them.
"""

from __future__ import annotations

import errno
import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from vgpuvirt import audit as client_audit
from vgpuvirt.errors import HostError, InvalidSpec, LockTimeout
from vgpuvirt.host.audit_log import AuditLog, parse_audit
from vgpuvirt.host.ops import BatchResult, Op, OpResult
from vgpuvirt.host.snapshot import Entry, EntryKind, Result, Snapshot
from vgpuvirt.model import SysPath

# The protocol's values live in host/ops.py and host/snapshot.py; callers import them from here.
__all__ = ["DEFAULT_AUDIT_PATH", "DEFAULT_LOCK_PATH", "BaseHost", "BatchResult", "Entry", "EntryKind", "Host", "Op",
           "OpResult", "Result", "Snapshot"]

audit = logging.getLogger("vgpuvirt.audit")
log = logging.getLogger("vgpuvirt.host")

#: The host-side lock, in a directory of its own that only root can write (the agent creates it 0700 and
#: refuses one that is a link, another user's or writable by others): not in world-writable /run/lock.
DEFAULT_LOCK_PATH = "/run/vgpuvirt/lock"
#: The host's audit log (JSON lines, written by the agent inside each mutating batch; see docs/host.md).
DEFAULT_AUDIT_PATH = "/var/log/vgpuvirt/audit.jsonl"


@runtime_checkable
class Host(Protocol):
    """What every host (local, SSH, simulated) offers. Services depend only on this."""

    @property
    def name(self) -> str: ...

    @property
    def sysfs_root(self) -> str: ...

    @property
    def round_trips(self) -> int: ...

    @property
    def is_local(self) -> bool:
        """Whether this host is the machine this process runs on: its programs, its libvirt (``qemu:///system``)
        and its NVML are the ones here. A host only answers True when it knows it (LocalHost)."""
        ...

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            idempotent: bool = False) -> Result: ...

    def read(self, patterns: Iterable[str]) -> Snapshot: ...

    def apply(self, ops: Sequence[Op], *, lock: bool = True, on_error: str = "stop",
              reads_after: Iterable[str] = ()) -> BatchResult: ...

    def close(self) -> None: ...


class BaseHost:
    """read/apply over one ``_exchange`` primitive; subclasses supply transport."""

    lock_path: str = DEFAULT_LOCK_PATH
    lock_timeout: float = 60.0
    audit_path: str = DEFAULT_AUDIT_PATH

    def __init__(self, name: str, sysfs_root: str = "/") -> None:
        self._name = name
        self._sysfs_root = sysfs_root
        self._round_trips = 0
        self._rt_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def sysfs_root(self) -> str:
        return self._sysfs_root

    @property
    def round_trips(self) -> int:
        return self._round_trips

    @property
    def is_local(self) -> bool:
        # Only a host that runs its programs in this process's own machine can say yes; the others answer
        # for a machine elsewhere (SSH), a model (sim) or a record (capture).
        return False

    def _count_round_trip(self) -> None:
        with self._rt_lock:
            self._round_trips += 1

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            idempotent: bool = False) -> Result:
        """Run one program on the host (``_run``), recorded with its exit status in the client's audit log."""
        shown = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else [repr(argv)]
        try:
            result = self._run(argv, stdin=stdin, timeout=timeout, idempotent=idempotent)
        except Exception as exc:
            client_audit.record("run", self.name, "failed", argv=shown, error=f"{type(exc).__name__}: {exc}")
            raise
        client_audit.record("run", self.name, f"exit {result.exit_code}", argv=shown)
        return result

    def _run(self, argv: Sequence[str], *, stdin: str | None, timeout: float | None, idempotent: bool) -> Result:
        raise NotImplementedError

    def read_audit(self, *, max_bytes: int = 4 << 20) -> AuditLog:
        """The host's audit log (its last ``max_bytes``, whole records), in one round trip. Writes nothing.
        Where the log is, the host says (its configuration; LocalHost's ``audit_path``)."""
        response = self._checked(self._exchange(
            {"root": self.sysfs_root, "audit_read": {"max_bytes": int(max_bytes)}}, idempotent=True))
        return parse_audit(str(response.get("audit", "")), self.name, bool(response.get("truncated")))

    def close(self) -> None:
        pass

    def __enter__(self) -> BaseHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _checked(self, response: dict[str, Any]) -> dict[str, Any]:
        if response.get("fatal") == "lock" and response.get("errno") in (errno.EAGAIN, errno.EACCES):
            raise LockTimeout(self.name, f"{response.get('error')} (another vgpuvirt holds it for longer "
                                         f"than {self.lock_timeout} s)")
        if response.get("fatal") == "audit":
            # the log is there and ours, but cannot take the batch's records (full disk, read-only): the cause
            raise HostError(self.name, f"{response.get('error')}: nothing of the batch ran (every mutation is "
                                       "recorded on the host; free space or make the log writable)")
        if response.get("fatal") == "state":
            # the lock's or the audit log's directory failed its checks: nothing of the batch ran
            raise HostError(self.name, f"unsafe lock or audit location: {response.get('error')}")
        if "fatal" in response:
            raise HostError(self.name, f"agent refused the request ({response['fatal']}): {response.get('error')}")
        return response

    def read(self, patterns: Iterable[str]) -> Snapshot:
        pats = [str(SysPath(p)) for p in patterns]
        response = self._checked(self._exchange({"root": self.sysfs_root, "reads": pats}, idempotent=True))
        return Snapshot.from_wire(response["entries"], self.name)

    def apply(self, ops: Sequence[Op], *, lock: bool = True, on_error: str = "stop",
              reads_after: Iterable[str] = ()) -> BatchResult:
        if on_error not in ("stop", "continue"):
            raise InvalidSpec("on_error", on_error, "stop or continue")
        request: dict[str, Any] = {
            "root": self.sysfs_root,
            "ops": [op.to_wire() for op in ops],
            "on_error": on_error,
            "reads_after": [str(SysPath(p)) for p in reads_after],
            "lock": {"path": self.lock_path, "timeout": self.lock_timeout} if lock else None,
        }
        mutating = [op for op in ops if op.mutates]
        if mutating:
            # The agent records every mutating batch in the host's log, under an id of its own; this id and
            # who asked (as this machine knows it) let the two logs be matched.
            request["audit"] = {"id": uuid.uuid4().hex[:16], "client_user": _user(),
                                "client_host": client_audit.client_host()}
        for op in ops:
            if op.mutates:
                audit.info("%s: begin %s", self.name, op.describe())
        # A batch that mutates is never retried blindly: the caller re-reads and reconciles.
        try:
            raw = self._exchange(request, idempotent=not any(o.mutates for o in ops))
        except BaseException as exc:
            if mutating:       # the host may have done some or all of it: the client's log says so
                self._record_unanswered(request, mutating, "unknown: the answer was lost", exc)
            raise
        try:
            response = self._checked(raw)
        except Exception as exc:
            if mutating:       # the agent answered that nothing ran
                self._record_unanswered(request, mutating, "refused", exc)
            raise
        results = []
        for op, r in zip(ops, response["ops"], strict=True):
            res = OpResult(op=op, ok=bool(r.get("ok")), errno=r.get("errno"), error=r.get("error"),
                           skipped=bool(r.get("skipped")), value=r.get("value"), rc=r.get("rc"),
                           stdout=r.get("stdout", ""), stderr=r.get("stderr", ""))
            if op.mutates and not res.skipped:
                audit.info("%s: %s -> %s", self.name, op.describe(),
                           "ok" if res.ok else f"FAILED errno={res.errno} {res.error}")
            results.append(res)
        if response.get("audit_error"):
            log.warning("%s: %s (the batch ran; its audit records may be incomplete)", self.name,
                        response["audit_error"])
        if mutating:
            client_audit.record("apply", self.name, "ok" if all(r.ok for r in results) else "failed",
                                batch=request["audit"]["id"], host_batch=response.get("audit_batch"),
                                ops=[f"{r.op.describe()} -> {_outcome(r)}" for r in results if r.op.mutates])
        return BatchResult(tuple(results), Snapshot.from_wire(response.get("after", {}), self.name),
                           float(response.get("lock_wait_s", 0.0)))


    def _record_unanswered(self, request: dict[str, Any], mutating: Sequence[Op], outcome: str,
                           exc: BaseException) -> None:
        client_audit.record("apply", self.name, outcome, batch=request["audit"]["id"],
                            error=f"{type(exc).__name__}: {exc}", ops=[op.describe() for op in mutating])


def _outcome(r: OpResult) -> str:
    return "ok" if r.ok else "skipped" if r.skipped else f"failed errno={r.errno}"


def _user() -> str:
    return client_audit.os_user()
