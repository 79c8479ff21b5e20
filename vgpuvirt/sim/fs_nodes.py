"""The nodes of the simulated sysfs (attributes, links, directories) and the rules of opening them."""

from __future__ import annotations

import errno
import posixpath
import re
from collections.abc import Callable

from vgpuvirt.sim.kstrto import oserror

PAGE_SIZE = 4096
MAX_LINKS = 40


class Attr:
    """A sysfs attribute: ``show()`` returns its text, ``store(text)`` applies a write."""

    __slots__ = ("mode", "show", "store")

    def __init__(self, show: Callable[[], str] | None = None, store: Callable[[str], None] | None = None,
                 mode: int | None = None) -> None:
        self.show = show
        self.store = store
        self.mode = mode if mode is not None else (0o644 if show and store else 0o444 if show else 0o200)


class _Text:
    """The ``show`` of a constant attribute: one object, where a closure over the text was three (function, cell,
    cell tuple) for the garbage collector to walk; a host's tree has thousands."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self) -> str:
        return self.text


class Link:
    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target


class Dir:
    __slots__ = ("fill",)

    def __init__(self, fill: Callable[[], dict[str, Node]]) -> None:
        self.fill = fill


Node = Attr | Link | Dir


#: what a normalized absolute path never holds: empty, "." or ".." components, a trailing "/"
_ODD = re.compile(r"//|/\.\.?(/|\0|$)|/(\0|$)")


def rel_link(link_dir: str, target: str) -> str:
    """``posixpath.relpath(target, link_dir)``; for the simulator's own paths (absolute, normalized) without the
    ``abspath``/``commonprefix`` work of the general one: a host's sysfs has thousands of links."""
    if not (link_dir.startswith("/") and target.startswith("/")) or _ODD.search(link_dir + "\0" + target):
        return posixpath.relpath(target, link_dir)
    here = link_dir.split("/")[1:] if link_dir != "/" else []
    there = target.split("/")[1:] if target != "/" else []
    common = 0
    for a, b in zip(here, there, strict=False):   # (the shorter ends the common part)
        if a != b:
            break
        common += 1
    return "/".join([".."] * (len(here) - common) + there[common:]) or "."


def const(text: str) -> Attr:
    return Attr(show=_Text(text))


def noop(_: str) -> None:
    return None


def bitmap(cpus: frozenset[int], nbits: int) -> str:
    """The kernel's %*pb cpumask format: 32-bit hex words, most significant first, comma separated."""
    words = max(1, (nbits + 31) // 32)
    value = sum(1 << c for c in cpus)
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


class FsFail(Exception):
    """A failed resolution: the errno and how many links were followed before it (for ELOOP accounting)."""

    def __init__(self, code: int, links: int, cacheable: bool = True) -> None:
        self.code = code
        self.links = links
        self.cacheable = cacheable


# A resolution: the node, its canonical path, and the number of symlinks followed to reach it.
Resolved = tuple[Node, str, int]


def norm_path(path: str) -> str:
    """Drop empty components ('//', a trailing '/'): the walk ignores them, so keys need not tell them apart."""
    if "//" in path or (path.endswith("/") and path != "/"):
        return "/" + "/".join(p for p in path.split("/") if p)
    return path


def attr_for(node: object, read: bool, write: bool) -> Attr:
    """The attribute an open for ``read``/``write`` reaches: EISDIR on a directory, EACCES when the
    attribute lacks the mode bits or the operation (sysfs's open-time checks)."""
    if isinstance(node, Dir):
        raise oserror(errno.EISDIR)
    assert isinstance(node, Attr)
    if read and (node.show is None or not node.mode & 0o444):
        raise oserror(errno.EACCES)
    if write and (node.store is None or not node.mode & 0o222):
        raise oserror(errno.EACCES)
    return node
