"""ReplayHost: a read-only Host that answers from a capture file (``vgpuvirt capture``, ``--host capture:FILE``).

A capture holds what vgpuvirt read from one host in one round trip: every path its readers' globs matched (as
the agent reported them: file text, link target, directory, read error), the answers of the programs it runs
(argv, exit status, stdout, stderr) and of its NVML calls. :class:`ReplayFs` gives those back through the same
agent (:func:`vgpuvirt.host.agent.handle`) that serves a live host, so globs, guards (``{1?...}``), reads and
read-only batches behave exactly as they did on the host; a path that was not captured is absent, a program
that was not recorded is "not found" (exit 127). Anything that would change the host is refused before the
agent sees it (:class:`~vgpuvirt.errors.ReadOnlyHost`).

The file is JSON (gzip-compressed when its name ends in ``.gz``); :data:`CAPTURE_FORMAT` names it and
``version`` says which layout it has (see docs/capture.md).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpuvirt.errors import InvalidSpec, ReadOnlyHost
from vgpuvirt.host import agent
from vgpuvirt.host.base import BaseHost, BatchResult, Op, Result
from vgpuvirt.model import PciAddress

__all__ = ["CAPTURE_FORMAT", "CAPTURE_VERSION", "ReplayFs", "ReplayHost", "load_capture", "save_capture"]

CAPTURE_FORMAT = "vgpuvirt-capture"
CAPTURE_VERSION = 1
_KINDS = ("f", "l", "d", "e")


def load_capture(path: str) -> dict[str, Any]:
    """A capture file's content, checked to be one (a clear :class:`InvalidSpec` otherwise)."""
    try:
        opener: Any = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise InvalidSpec("capture file", path, "an existing file written by `vgpuvirt capture -o FILE`") from None
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidSpec("capture file", path, f"a vgpuvirt capture (JSON): {exc}") from None
    if not isinstance(data, dict) or data.get("format") != CAPTURE_FORMAT:
        raise InvalidSpec("capture file", path, f"a JSON object with \"format\": \"{CAPTURE_FORMAT}\"")
    if data.get("version") != CAPTURE_VERSION:
        raise InvalidSpec("capture file", path, f"capture version {CAPTURE_VERSION} (this one has "
                                                f"{data.get('version')!r}: written by another vgpuvirt)")
    problem = _problem(data)
    if problem:
        raise InvalidSpec("capture file", path, f"a vgpuvirt capture: {problem}")
    return data


def _opt(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, kind) and not isinstance(value, bool) if kind is int
                             else isinstance(value, kind))


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(a, str) for a in value)


def _problem(data: Mapping[str, Any]) -> str | None:
    """What makes ``data`` no capture (every value a replay hands on is checked here, once), or None."""
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return '"entries" is not an object'
    for p, e in entries.items():
        if not (isinstance(p, str) and p.startswith("/") and isinstance(e, list) and len(e) == 3 and e[0] in _KINDS
                and (_opt(e[1], str) if e[0] in ("f", "l") else e[1] is None) and _opt(e[2], int)):
            return f"entry {str(p)[:80]!r} is not [kind, text or target, errno]"
    programs, nvml = data.get("programs", []), data.get("nvml", [])
    if not isinstance(programs, list) or not isinstance(nvml, list):
        return '"programs" and "nvml" must be lists'
    for r in programs:
        if not (isinstance(r, dict) and _strings(r.get("argv")) and r["argv"] and _opt(r.get("rc"), int)
                and isinstance(r.get("stdout", ""), str) and isinstance(r.get("stderr", ""), str)
                and _opt(r.get("errno"), int) and _opt(r.get("error"), str)):
            return "a program record is not {argv, rc, stdout, stderr, errno}"
    for c in nvml:
        res = c.get("result") if isinstance(c, dict) else None
        if not (isinstance(c, dict) and isinstance(c.get("call"), str) and _strings(c.get("args"))
                and isinstance(res, dict) and isinstance(res.get("ok"), bool) and _opt(res.get("rc"), int)
                and _opt(res.get("stdout"), str) and _opt(res.get("errno"), int) and _opt(res.get("error"), str)):
            return "an NVML record is not {call, args, result: {ok, rc, stdout, errno, error}}"
    for key in ("host", "sysfs_root"):
        if not _opt(data.get(key), str):
            return f'"{key}" is not text'
    return None


def save_capture(data: Mapping[str, Any], path: str) -> None:
    """Write a capture (sorted keys: two captures of one host diff line by line); atomically, never half."""
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    tmp = f"{path}.tmp{os.getpid()}"
    opener: Any = gzip.open if path.endswith(".gz") else open
    try:
        with opener(tmp, "wt", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)        # a failed write leaves nothing behind, not even half a file
        raise


def _argv_key(argv: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(a) for a in argv)


class ReplayFs:
    """The agent's filesystem interface over a capture's entries, plus its recorded programs and NVML calls.

    Directories are the ones the capture holds and every directory above a captured path (a read of
    ``/sys/bus/pci/devices/*/vendor`` records the files, not the directories it listed)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._entries: dict[str, list[Any]] = dict(data.get("entries", {}))
        self._children: dict[str, set[str]] = {}
        for p in self._entries:
            parts = p.split("/")
            for i in range(1, len(parts)):
                self._children.setdefault("/".join(parts[:i]) or "/", set()).add(parts[i])
        # sysfs reaches one device by several paths (/sys/bus/pci/devices/X, /sys/class/mdev_bus/X, both links to
        # /sys/devices/.../X): where a link leads -> the captured links that lead there
        self._aliases: dict[str, list[str]] = {}
        for p, e in self._entries.items():
            if e[0] == "l" and e[1]:
                self._aliases.setdefault(posixpath.normpath(posixpath.join(posixpath.dirname(p), e[1])), []).append(p)
        self._programs = {_argv_key(r["argv"]): r for r in data.get("programs", [])}
        self._nvml = {(str(r["call"]), _argv_key(r["args"])): r["result"] for r in data.get("nvml", [])}

    def _held(self, path: str) -> bool:
        return path in self._entries or path in self._children

    def _find(self, path: str) -> str:
        """``path`` as the capture holds it: itself, or the same file reached through another captured link to
        the same directory (a reader asking ``/sys/class/mdev_bus/X/vendor`` where the capture read
        ``/sys/bus/pci/devices/X/vendor``). The last component is never followed, as the agent's reads."""
        if self._held(path):
            return path
        parts = path.split("/")
        for i in range(len(parts) - 1, 1, -1):
            prefix, rest = "/".join(parts[:i]), "/".join(parts[i:])
            e = self._entries.get(prefix)
            if e is None or e[0] != "l" or not e[1]:
                continue
            where = posixpath.normpath(posixpath.join(posixpath.dirname(prefix), e[1]))
            for other in (where, *self._aliases.get(where, ())):
                if other != prefix and self._held(f"{other}/{rest}"):
                    return f"{other}/{rest}"
        return path

    # ---- what the agent reads with
    def read_entry(self, path: str) -> list[Any] | None:
        path = self._find(path)
        e = self._entries.get(path)
        if e is None:
            return ["d", None, None] if path in self._children else None
        kind, value, code = e
        return [kind, value if kind in ("f", "l") else None, code]

    def kind(self, path: str) -> str | None:
        path = self._find(path)
        e = self._entries.get(path)
        if e is not None:
            return "f" if e[0] == "e" else str(e[0])
        return "d" if path in self._children else None

    def listdir(self, path: str) -> list[str]:
        names = self._children.get(self._find(path.rstrip("/") or "/"))
        if names is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return sorted(names)

    def read(self, path: str) -> str:
        path = self._find(path)
        e = self._entries.get(path)
        if e is None:
            code = errno.EISDIR if path in self._children else errno.ENOENT
            raise OSError(code, os.strerror(code), path)
        if e[0] == "e":
            raise OSError(e[2] or errno.EIO, os.strerror(e[2] or errno.EIO), path)
        if e[0] != "f":
            raise OSError(errno.EISDIR if e[0] == "d" else errno.EINVAL, "not a file", path)
        return str(e[1])

    def readlink(self, path: str) -> str:
        e = self._entries.get(self._find(path))
        if e is None or e[0] != "l":
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return str(e[1])

    # ---- never reached through ReplayHost (it refuses mutating batches first); kept for direct agent use
    def write(self, path: str, value: str) -> None:
        raise OSError(errno.EROFS, "a replay of a captured host is read-only", path)

    def replace_file(self, path: str, value: str, mode: int) -> None:
        raise OSError(errno.EROFS, "a replay of a captured host is read-only", path)

    def remove_file(self, path: str) -> None:
        raise OSError(errno.EROFS, "a replay of a captured host is read-only", path)

    # ---- programs and NVML
    def answer(self, argv: Sequence[str], ok_codes: Sequence[int] = (0,)) -> dict[str, Any]:
        """A recorded program's answer as the agent gives it, judged by the asker's ``ok_codes``."""
        rec = self._programs.get(_argv_key(argv))
        if rec is None:
            return {"ok": False, "rc": 127, "errno": errno.ENOENT, "stdout": "",
                    "error": f"cannot run {argv[0]}: not recorded in this capture",
                    "stderr": f"{argv[0]}: not recorded in this capture"}
        res = {"rc": rec.get("rc"), "stdout": rec.get("stdout", ""), "stderr": rec.get("stderr", "")}
        if rec.get("errno") is not None:         # it could not start, or timed out: as it was
            return {**res, "ok": False, "errno": rec["errno"], "error": rec.get("error")}
        if rec.get("rc") in ok_codes:
            return {**res, "ok": True}
        return {**res, "ok": False, "errno": None, "error": f"{argv[0]} exited {rec.get('rc')}"}

    def recorded(self, argv: Sequence[str]) -> bool:
        return _argv_key(argv) in self._programs

    def run(self, argv: list[str], op: dict[str, Any]) -> dict[str, Any]:
        return self.answer(argv, op.get("ok_codes", [0]))

    def nvml(self, op: dict[str, Any]) -> dict[str, Any]:
        call, args = str(op.get("value")), _argv_key(op.get("argv") or ())
        got = self._nvml.get((call, args))
        if got is not None:
            return _readable(dict(got))
        everything = self._nvml.get((call, ("all",)))
        if everything is None or len(args) != 1:
            return {"ok": False, "errno": None, "rc": 9, "error": f"NVML {call} {' '.join(args)} was not recorded "
                                                                  "in this capture"}
        try:
            return _one_from_all(everything, args[0])
        except (ValueError, TypeError, AttributeError, InvalidSpec):
            return _UNREADABLE


#: the answer to an NVML call whose record cannot be what the agent answered (a capture edited by hand)
_UNREADABLE = {"ok": False, "errno": None, "rc": 999, "error": "the capture's NVML answer is unreadable"}


def _readable(answer: dict[str, Any]) -> dict[str, Any]:
    if answer.get("ok"):
        try:
            json.loads(answer.get("stdout") or "null")
        except ValueError:
            return dict(_UNREADABLE)
    return answer


def _one_from_all(everything: Mapping[str, Any], bus_id: str) -> dict[str, Any]:
    """One GPU's ``vgpu_scheduler_get`` answer from the recorded ``all`` answer (the agent builds the latter
    from the former, GPU by GPU: see :func:`vgpuvirt.host.agent.nvml_call`)."""
    if not everything.get("ok"):
        return dict(everything)          # NVML missing or failing: the same for every GPU
    want = PciAddress.from_nvml(bus_id)
    for e in json.loads(everything.get("stdout") or "[]"):
        if PciAddress.from_nvml(str(e.get("gpu"))) == want:
            if e.get("ok"):
                return {"ok": True, "rc": 0, "stdout": json.dumps(e.get("state"))}
            return {"ok": False, "errno": None, "rc": e.get("rc"), "error": e.get("error")}
    return {"ok": False, "errno": None, "rc": 6, "error": f"{bus_id}: Not Found"}


class ReplayHost(BaseHost):
    """A captured host, read-only: reads, read-only programs and NVML reads answer as the host did."""

    def __init__(self, path: str, *, name: str | None = None) -> None:
        self.path = path
        self.capture = load_capture(path)
        # The recorded host's own name: a replay answers as the host did, names included (a plan's mdev UUIDs are
        # derived from it, the exporter labels series with it).
        super().__init__(name or str(self.capture.get("host") or f"capture:{path}"),
                         str(self.capture.get("sysfs_root") or "/"))
        self.fs = ReplayFs(self.capture)

    @property
    def is_local(self) -> bool:
        return False        # a record of a host as it was, even when recorded here: NVML now is not that host

    def _refuse(self, what: str) -> ReadOnlyHost:
        return ReadOnlyHost(self.name, f"refused: {what} (capture {self.path} is a read-only record of this "
                                       "host; run it against the host itself)")

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        if "audit_read" in request:
            raise self._refuse("reading the audit log, which a capture does not hold")
        for op in request.get("ops", []):
            if agent.mutates(op):
                raise self._refuse(f"{op.get('op')} {op.get('path') or ' '.join(op.get('argv') or ())}")
        self._count_round_trip()
        response: dict[str, Any] = agent.handle(request, fs=self.fs)
        return response

    def apply(self, ops: Sequence[Op], *, lock: bool = True, on_error: str = "stop",
              reads_after: Iterable[str] = ()) -> BatchResult:
        changing = [op for op in ops if op.mutates]
        if changing:
            raise self._refuse(changing[0].describe() + (f" and {len(changing) - 1} more change(s)"
                                                         if len(changing) > 1 else ""))
        # no host-side lock: nothing can change a capture (and a lock file would be a write)
        return super().apply(ops, lock=False, on_error=on_error, reads_after=reads_after)

    def _run(self, argv: Sequence[str], *, stdin: str | None, timeout: float | None, idempotent: bool) -> Result:
        args = _argv_key(argv)
        if not args:
            raise InvalidSpec("argv", args, "a non-empty list of strings")
        if not self.fs.recorded(args):
            raise self._refuse(f"running {' '.join(args)}, which the capture did not record")
        self._count_round_trip()
        r = self.fs.answer(args, (0,))
        return Result(args, int(r.get("rc") or 0), str(r.get("stdout", "")), str(r.get("stderr", "")))
