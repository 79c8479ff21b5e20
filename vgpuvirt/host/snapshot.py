"""What a host answers: a program's :class:`Result` and a :class:`Snapshot` of the files a read matched
(part of the Host protocol, :mod:`vgpuvirt.host.base`)."""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple


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

    def __eq__(self, other: object) -> bool:
        # two snapshots: their dicts compare in C (Mapping's generic __eq__ copies both into new dicts first)
        if isinstance(other, Snapshot):
            return self._entries == other._entries
        return super().__eq__(other)

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
        # Only paths under the pattern's literal leading directories can match: test those alone (a snapshot
        # of a large host holds ~11,000 paths; fnmatch on each of them cost ~15 ms a glob).
        literal = []
        for part in parts[:-1]:
            if any(c in part for c in "*?["):
                break
            literal.append(part)
        prefix = "/".join(literal) + "/" if literal else ""
        return sorted(p for p in self._entries
                      if p.startswith(prefix) and len(p.split("/")) == len(parts)
                      and all(fnmatch.fnmatchcase(a, b) for a, b in zip(p.split("/"), parts, strict=True)))

    def to_wire(self) -> dict[str, list[Any]]:
        rev = {v: k for k, v in _KINDS.items()}
        return {p: [rev[e.kind], e.text if e.kind == "file" else e.target, e.errno]
                for p, e in sorted(self._entries.items())}
