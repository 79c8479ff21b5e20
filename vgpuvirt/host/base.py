"""The Host protocol: the only door to a host.

A Host does three things, each in ONE round trip:

* ``run(argv)``: run a program given as argv (never through a shell) and return a :class:`Result`;
* ``read(patterns)``: read every file/symlink/dir matching a set of globs and return a :class:`Snapshot`;
* ``apply(ops)``: apply a batch of :class:`Op` (writes, checks, waits, execs), optionally under the
  host-side flock, and return one :class:`OpResult` per op.

:class:`BaseHost` implements ``read``/``apply`` on top of one primitive, ``_exchange(request)``,
which LocalHost runs in-process, SSHHost runs as one remote ``python3`` exec and SimHost runs
against the simulated sysfs. Every mutation is logged on the ``vgpuvirt.audit`` logger.
"""

from __future__ import annotations

import errno
import fnmatch
import getpass
import logging
import os
import posixpath
import socket
import threading
import uuid
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from vgpuvirt import audit as client_audit
from vgpuvirt.errors import HostError, InvalidSpec, LockTimeout
from vgpuvirt.host.audit_log import AuditLog, parse_audit
from vgpuvirt.model import SysPath

audit = logging.getLogger("vgpuvirt.audit")
log = logging.getLogger("vgpuvirt.host")

#: The host-side lock, in a directory of its own that only root can write (the agent creates it 0700 and
#: refuses one that is a link, another user's or writable by others): not in world-writable /run/lock.
DEFAULT_LOCK_PATH = "/run/vgpuvirt/lock"
#: The host's audit log (JSON lines, written by the agent inside each mutating batch; see docs/host.md).
DEFAULT_AUDIT_PATH = "/var/log/vgpuvirt/audit.jsonl"


@dataclass(frozen=True)
class Result:
    """What a command did: argv, exit code, stdout, stderr (text)."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


EntryKind = Literal["file", "link", "dir", "error"]
_KINDS: dict[str, EntryKind] = {"f": "file", "l": "link", "d": "dir", "e": "error"}


class Entry(NamedTuple):
    """One path of a snapshot. A tuple, not a dataclass: a large inventory makes ~10k of them per read."""

    kind: EntryKind
    text: str | None = None      # file content (raw, with its newline)
    target: str | None = None    # symlink target as readlink(2) gives it
    errno: int | None = None     # for kind == "error": why the read failed


class Snapshot(Mapping[str, Entry]):
    """An immutable picture of part of a host's filesystem, keyed by host path (``/sys/...``)."""

    def __init__(self, entries: Mapping[str, Entry], host: str = "") -> None:
        self._entries = dict(entries)
        self.host = host
        self._children: dict[str, list[str]] | None = None

    @classmethod
    def from_wire(cls, raw: Mapping[str, Sequence[Any]], host: str = "") -> Snapshot:
        kinds, new = _KINDS, Entry._make
        snap = cls.__new__(cls)   # the comprehension's dict is ours already: no copy
        snap._entries = {p: new((kinds[k], v if k == "f" else None, v if k == "l" else None, e))
                         for p, (k, v, e) in raw.items()}
        snap.host, snap._children = host, None
        return snap

    def __getitem__(self, path: str) -> Entry:
        return self._entries[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # The dict's own views: Mapping's generic ones look every key up again.
    def items(self) -> ItemsView[str, Entry]:
        return self._entries.items()

    def keys(self) -> KeysView[str]:
        return self._entries.keys()

    def values(self) -> ValuesView[Entry]:
        return self._entries.values()

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def get(self, path: str, default: Any = None) -> Any:
        return self._entries.get(path, default)

    def text(self, path: str) -> str | None:
        """File content stripped of surrounding whitespace, or None when absent/unreadable."""
        e = self._entries.get(path)
        return e.text.strip() if e is not None and e.text is not None else None

    def raw(self, path: str) -> str | None:
        e = self._entries.get(path)
        return e.text if e is not None else None

    def int(self, path: str) -> int | None:
        t = self.text(path)
        if t is None:
            return None
        try:
            return int(t, 0)
        except ValueError:
            return None

    def link(self, path: str) -> str | None:
        e = self._entries.get(path)
        return e.target if e is not None else None

    def link_name(self, path: str) -> str | None:
        """The last component of a symlink's target (``driver`` -> ``nvidia``)."""
        t = self.link(path)
        return posixpath.basename(t.rstrip("/")) if t else None

    def resolve_link(self, path: str) -> str | None:
        """A symlink's target made absolute against the link's directory (lexically)."""
        t = self.link(path)
        if t is None:
            return None
        return posixpath.normpath(posixpath.join(posixpath.dirname(path), t))

    def has(self, path: str) -> bool:
        return path in self._entries

    def is_dir(self, path: str) -> bool:
        e = self._entries.get(path)
        return e is not None and e.kind == "dir"

    def children(self, directory: str) -> list[str]:
        """Names directly below ``directory`` that the snapshot holds, sorted."""
        if self._children is None:
            idx: dict[str, list[str]] = {}
            for p in self._entries:
                parent, _, name = p.rpartition("/")
                idx.setdefault(parent or "/", []).append(name)
            for names in idx.values():
                names.sort()
            self._children = idx
        return list(self._children.get(directory.rstrip("/") or "/", []))

    def glob(self, pattern: str) -> list[str]:
        """Paths in the snapshot matching a glob, component by component (``*`` never crosses ``/``)."""
        parts = pattern.split("/")
        return sorted(p for p in self._entries
                      if len(p.split("/")) == len(parts)
                      and all(fnmatch.fnmatchcase(a, b) for a, b in zip(p.split("/"), parts, strict=True)))

    def to_wire(self) -> dict[str, list[Any]]:
        rev = {v: k for k, v in _KINDS.items()}
        return {p: [rev[e.kind], e.text if e.kind == "file" else e.target, e.errno]
                for p, e in sorted(self._entries.items())}


@dataclass(frozen=True)
class Op:
    """One step of a batch. Build with the constructors; paths are validated host paths."""

    op: str
    path: str | None = None
    value: str | None = None
    min: int | None = None
    state: str | None = None
    timeout: float | None = None
    argv: tuple[str, ...] | None = None
    stdin: str | None = None
    group: str | None = None
    ok_codes: tuple[int, ...] | None = None
    read_only: bool = False

    @staticmethod
    def write(path: str, value: str, *, group: str | None = None) -> Op:
        if not isinstance(value, str) or "\0" in value:
            raise InvalidSpec("sysfs value", value, "text without NUL bytes")
        return Op("write", str(SysPath(path)), value=value, group=group)

    @staticmethod
    def check_int(path: str, minimum: int, *, group: str | None = None) -> Op:
        return Op("check_int", str(SysPath(path)), min=int(minimum), group=group)

    @staticmethod
    def check_absent(path: str, *, group: str | None = None) -> Op:
        return Op("check_absent", str(SysPath(path)), group=group)

    @staticmethod
    def wait(path: str, state: str = "exists", value: str | None = None, timeout: float = 10.0,
             *, group: str | None = None) -> Op:
        if state not in ("exists", "absent", "equals", "link_endswith"):
            raise InvalidSpec("wait state", state, "exists, absent, equals or link_endswith")
        return Op("wait", str(SysPath(path)), value=value, state=state, timeout=timeout, group=group)

    @staticmethod
    def exec(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 60.0,
             group: str | None = None, ok_codes: Sequence[int] = (0,), read_only: bool = False) -> Op:
        """A program run on the host. ``read_only=True`` (e.g. ``nvidia-smi -q -x``) declares that it changes
        nothing: it is not audited as a mutation and a batch of such ops may be retried after a dropped link."""
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise InvalidSpec("argv", argv, "a non-empty list of strings")
        return Op("exec", argv=tuple(argv), stdin=stdin, timeout=timeout, group=group,
                  ok_codes=tuple(ok_codes), read_only=read_only)

    @property
    def mutates(self) -> bool:
        return self.op == "write" or (self.op == "exec" and not self.read_only)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op}
        for k in ("path", "value", "min", "state", "timeout", "stdin", "group"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.argv is not None:
            d["argv"] = list(self.argv)
        if self.ok_codes is not None:
            d["ok_codes"] = list(self.ok_codes)
        if self.read_only:
            d["read_only"] = True   # the host's audit log records mutating execs only
        return d

    def describe(self) -> str:
        if self.op == "write":
            return f"write {self.value!r} > {self.path}"
        if self.op == "exec":
            return "exec " + " ".join(self.argv or ())
        return f"{self.op} {self.path}"


@dataclass(frozen=True)
class OpResult:
    op: Op
    ok: bool
    errno: int | None = None
    error: str | None = None
    skipped: bool = False
    value: int | None = None
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True)
class BatchResult:
    results: tuple[OpResult, ...]
    after: Snapshot = field(default_factory=lambda: Snapshot({}))
    lock_wait_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def __iter__(self) -> Iterator[OpResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> OpResult:
        return self.results[i]

    def failures(self) -> list[OpResult]:
        return [r for r in self.results if not r.ok and not r.skipped]


@runtime_checkable
class Host(Protocol):
    """What every host (local, SSH, simulated) offers. Services depend only on this."""

    @property
    def name(self) -> str: ...

    @property
    def sysfs_root(self) -> str: ...

    @property
    def round_trips(self) -> int: ...

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
        """The host's audit log (its last ``max_bytes``, whole records), in one round trip. Writes nothing."""
        response = self._checked(self._exchange(
            {"root": self.sysfs_root, "audit_read": {"path": self.audit_path, "max_bytes": int(max_bytes)}},
            idempotent=True))
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
            # The agent writes the host's audit log inside the batch; who asked is only known here.
            request["audit"] = {"path": self.audit_path, "id": uuid.uuid4().hex[:16], "client_user": _user(),
                                "client_host": socket.gethostname()}
        for op in ops:
            if op.mutates:
                audit.info("%s: begin %s", self.name, op.describe())
        # A batch that mutates is never retried blindly: the caller re-reads and reconciles.
        response = self._checked(self._exchange(request, idempotent=not any(o.mutates for o in ops)))
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
                                batch=request["audit"]["id"],
                                ops=[f"{r.op.describe()} -> {_outcome(r)}" for r in results if r.op.mutates])
        return BatchResult(tuple(results), Snapshot.from_wire(response.get("after", {}), self.name),
                           float(response.get("lock_wait_s", 0.0)))



def _outcome(r: OpResult) -> str:
    return "ok" if r.ok else "skipped" if r.skipped else f"failed errno={r.errno}"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.geteuid())
