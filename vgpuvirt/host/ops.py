"""What a host is asked to do in a batch: :class:`Op` (write, check, wait, exec) and its :class:`OpResult`,
gathered in a :class:`BatchResult` (part of the Host protocol, :mod:`vgpuvirt.host.base`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.snapshot import Snapshot
from vgpuvirt.model import SysPath


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
    mode: int | None = None

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
        nothing: it is not audited as a mutation, a batch of such ops may be retried after a dropped link, and
        a batch of only such ops (no group, on_error="continue") runs them at once, next to its
        ``reads_after`` (a program that must finish before the files are read is not read-only)."""
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise InvalidSpec("argv", argv, "a non-empty list of strings")
        return Op("exec", argv=tuple(argv), stdin=stdin, timeout=timeout, group=group,
                  ok_codes=tuple(ok_codes), read_only=read_only)

    @staticmethod
    def replace_file(path: str, text: str, *, mode: int = 0o644, group: str | None = None) -> Op:
        """Replace a whole configuration file (``/etc/modprobe.d/...``) atomically (new file, fsync, rename)."""
        if not isinstance(text, str) or "\0" in text:
            raise InvalidSpec("file content", text, "text without NUL bytes")
        return Op("replace_file", str(SysPath(path)), value=text, mode=int(mode), group=group)

    @staticmethod
    def remove_file(path: str, *, group: str | None = None) -> Op:
        """Remove a configuration file (``/etc/modprobe.d/...``) that a change made and its undo takes away again;
        one that is already absent is fine (never through a link: the link itself goes)."""
        return Op("remove_file", str(SysPath(path)), group=group)

    @staticmethod
    def nvml(call: str, args: Sequence[str], *, read_only: bool, group: str | None = None) -> Op:
        """One NVML call on the host (its answer, as JSON, in the result's stdout; its NVML code in rc)."""
        if call not in ("vgpu_scheduler_get", "vgpu_scheduler_set", "vgpu_migration_metadata", "vgpu_migration_compat"):
            raise InvalidSpec("NVML call", call, "vgpu_scheduler_get, vgpu_scheduler_set, vgpu_migration_metadata "
                                                 "or vgpu_migration_compat")
        if not all(isinstance(a, str) and a.isprintable() for a in args):
            raise InvalidSpec("NVML arguments", args, "printable strings")
        return Op("nvml", value=call, argv=tuple(args), read_only=read_only, group=group)

    @property
    def mutates(self) -> bool:
        return self.op in ("write", "replace_file", "remove_file") or (self.op in ("exec", "nvml")
                                                                        and not self.read_only)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op}
        for k in ("path", "value", "min", "state", "timeout", "stdin", "group", "mode"):
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
        if self.op == "replace_file":
            return f"replace {self.path} ({len(self.value or '')} bytes)"
        if self.op == "remove_file":
            return f"remove {self.path}"
        if self.op == "nvml":
            return f"nvml {self.value} " + " ".join(self.argv or ())
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
