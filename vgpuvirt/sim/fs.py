"""The simulated sysfs: a filesystem view computed from a :class:`~vgpuvirt.sim.model.SimModel`.

:class:`SimFs` offers the duck-typed interface of ``vgpuvirt.host.agent.OsFs`` (``listdir``,
``kind``, ``exists``, ``readlink``, ``read``, ``write``), so the batch agent runs against it
unchanged. Paths are host paths (``/sys/bus/pci/devices/...``); symlinks anywhere in a path resolve
like the kernel's (relative targets, ``..`` against the link's real directory). Errors are
``OSError(errno, strerror)`` as the kernel gives them: ENOENT, ENOTDIR, EISDIR, EINVAL for
readlink of a non-link, and EACCES for reading a write-only attribute or writing a read-only one
(sysfs refuses such opens even for root, see docs/sim.md).

This module walks paths and opens attributes; the nodes are in :mod:`.fs_nodes`, the device tree
(``/sys/bus``, ``/sys/class``, ``/sys/devices``) in :mod:`.fs_devices`, NUMA, CPUs, IOMMU groups and
hugepages in :mod:`.fs_system`.
"""

from __future__ import annotations

import errno
from typing import Any

from vgpuvirt.sim.fs_devices import DeviceTree
from vgpuvirt.sim.fs_etc import EtcTree
from vgpuvirt.sim.fs_nodes import MAX_LINKS, PAGE_SIZE, Attr, Dir, Link, Node, _attr_for, _Fail, _norm, _Res
from vgpuvirt.sim.kstrto import oserror
from vgpuvirt.sim.model import Dev, SimModel

__all__ = ["MAX_LINKS", "PAGE_SIZE", "Attr", "Dir", "Link", "Node", "SimFs"]


class SimFs(DeviceTree, EtcTree):
    """The agent-compatible filesystem of one simulated host."""

    def __init__(self, model: SimModel) -> None:
        self.model = model
        self._version = -1
        self._dircache: dict[str, dict[str, Node]] = {}
        self._children: dict[str, list[Dev]] = {}
        # Path resolutions of the current model version, keyed by (normalized path, follow final link):
        # a full inventory read resolves ~60,000 paths, nearly all sharing their parent with the last one.
        self._ok: dict[tuple[str, bool], _Res] = {}
        self._bad: dict[tuple[str, bool], tuple[int, int]] = {}
        # /proc/sys/kernel/random/boot_id: a new one after each simulated reboot, as on Linux
        boot_id = Attr(lambda: self.model.boot_id + "\n")
        random: dict[str, Node] = {"boot_id": boot_id}
        proc: dict[str, Node] = {"sys": Dir(lambda: {"kernel": Dir(lambda: {"random": Dir(lambda: random)})}),
                                 "cmdline": Attr(lambda: self._cmdline() + "\n"),
                                 "driver": Dir(self._proc_driver)}
        files = self.model.state_files
        state = Dir(lambda: {n: Attr(show=lambda n=n: files[n], mode=0o600) for n in sorted(files)})  # type: ignore[misc]
        # the simulated package database: the vGPU manager version installed (what `sim install-driver` writes)
        pkg = Dir(lambda: {"driver_version": Attr(
            show=lambda: (self.model.installed_driver or self.model.driver_version) + "\n", mode=0o644)})
        var: dict[str, Node] = {"lib": Dir(lambda: {"vgpuvirt": state, "vgpuvirt-sim": pkg})}
        self._root = Dir(lambda: {"sys": Dir(self._sys), "etc": Dir(self._etc), "proc": Dir(lambda: proc),
                                  "var": Dir(lambda: var)})

    # ------------------------------------------------------------------ path walking

    def _fresh(self) -> None:
        if self._version != self.model.version:
            self._dircache.clear()
            self._ok.clear()
            self._bad.clear()
            kids: dict[str, list[Dev]] = {}
            for d in self.model.devices.values():
                kids.setdefault(d.sysfs_dir.rsplit("/", 1)[0], []).append(d)
            self._children = kids
            self._version = self.model.version

    def _entries(self, path: str, node: Dir) -> dict[str, Node]:
        e = self._dircache.get(path)
        if e is None:
            e = node.fill()
            self._dircache[path] = e
        return e

    def _walk(self, path: str, follow: bool) -> tuple[Node, str]:
        """Resolve ``path``; return the node and its canonical path. ``follow``: follow a final symlink.

        Like the kernel: every component but the last is followed if it is a link, ``..`` goes up from
        the canonical directory reached so far, and more than MAX_LINKS links in one walk is ELOOP.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise oserror(errno.ENOENT)
        with self.model.lock:
            self._fresh()
            hit = self._ok.get((path, follow))     # most calls: an already normalized, resolved path
            if hit is not None:
                return hit[0], hit[1]
            try:
                node, canon, _ = self._resolve(_norm(path), follow, 0)
            except _Fail as f:
                raise oserror(f.code) from None
            return node, canon

    def _resolve(self, path: str, follow: bool, depth: int) -> _Res:
        key = (path, follow)
        hit = self._ok.get(key)
        if hit is not None:
            return hit
        bad = self._bad.get(key)
        if bad is not None:
            raise _Fail(*bad)
        try:
            res = self._resolve_uncached(path, follow, depth)
        except _Fail as f:
            if f.cacheable:
                self._bad[key] = (f.code, f.links)
            raise
        self._ok[key] = res
        return res

    def _resolve_uncached(self, path: str, follow: bool, depth: int) -> _Res:
        # ``path`` is normalized: "/" or "/a/b" without empty components. The parent is resolved (and
        # memoized) first, with links followed, as the walk follows every non-final component.
        if path == "/":
            return self._root, "/", 0
        cut = path.rfind("/")
        name = path[cut + 1:]
        pnode, pcanon, plinks = self._resolve(path[:cut] or "/", True, depth)
        if name == ".":
            return pnode, pcanon, plinks
        if name == "..":
            if pcanon == "/":
                return pnode, pcanon, plinks
            # A canonical path holds no links, so its parent is found without following any.
            up, ucanon, _ = self._resolve(pcanon[:pcanon.rfind("/")] or "/", True, depth)
            return up, ucanon, plinks
        if not isinstance(pnode, Dir):
            raise _Fail(errno.ENOTDIR, plinks)
        child = self._entries(pcanon, pnode).get(name)
        if child is None:
            raise _Fail(errno.ENOENT, plinks)
        if isinstance(child, Link) and follow:
            links = plinks + 1
            if links > MAX_LINKS:
                raise _Fail(errno.ELOOP, links)
            if depth >= MAX_LINKS:      # a cycle of links: ELOOP, but not a fact about the keys on the way
                raise _Fail(errno.ELOOP, MAX_LINKS + 1, cacheable=False)
            target = child.target
            tpath = _norm(target if target.startswith("/") else (pcanon if pcanon != "/" else "") + "/" + target)
            try:
                node, canon, tlinks = self._resolve(tpath, True, depth + 1)
            except _Fail as f:
                total = links + f.links
                raise _Fail(errno.ELOOP if total > MAX_LINKS else f.code, total, f.cacheable) from None
            total = links + tlinks
            if total > MAX_LINKS:
                raise _Fail(errno.ELOOP, total)
            return node, canon, total
        return child, (pcanon if pcanon != "/" else "") + "/" + name, plinks

    # ------------------------------------------------------------------ the OsFs interface

    def listdir(self, path: str) -> list[str]:
        node, canon = self._walk(path, True)
        if not isinstance(node, Dir):
            raise oserror(errno.ENOTDIR)
        with self.model.lock:
            return list(self._entries(canon, node))

    def kind(self, path: str) -> str | None:
        try:
            node, _ = self._walk(path, False)
        except OSError:
            return None
        return "l" if isinstance(node, Link) else "d" if isinstance(node, Dir) else "f"

    def exists(self, path: str) -> bool:
        try:
            self._walk(path, True)
        except OSError:
            return False
        return True

    def read_entry(self, path: str) -> list[Any] | None:
        """The agent's per-path read in one resolution; the same answers as its kind()+readlink()/read()."""
        try:
            node, _ = self._walk(path, False)
        except OSError:
            return None
        if isinstance(node, Link):
            return ["l", node.target, None]
        if isinstance(node, Dir):
            return ["d", None, None]
        if node.show is None or not node.mode & 0o444:
            return ["e", None, errno.EACCES]
        try:
            with self.model.lock:
                return ["f", node.show(), None]
        except OSError as exc:
            return ["e", None, exc.errno]

    def readlink(self, path: str) -> str:
        node, _ = self._walk(path, False)
        if not isinstance(node, Link):
            raise oserror(errno.EINVAL)
        return node.target

    def stat(self, path: str, follow: bool = False) -> tuple[str, int]:
        """(kind, permission bits) for the FUSE front-end."""
        node, _ = self._walk(path, follow)
        if isinstance(node, Link):
            return "l", 0o777
        if isinstance(node, Dir):
            return "d", 0o755
        return "f", node.mode

    def check_open(self, path: str, read: bool, write: bool) -> None:
        """sysfs's open-time check: EACCES when the attribute lacks the mode bits or the operation."""
        node, _ = self._walk(path, True)
        if isinstance(node, Dir) and not write:
            return                              # a directory opens for reading (listing)
        _attr_for(node, read, write)

    def read(self, path: str) -> str:
        show = _attr_for(self._walk(path, True)[0], read=True, write=False).show
        assert show is not None                 # _attr_for checked it
        with self.model.lock:
            return show()

    def write(self, path: str, value: str) -> None:
        store = _attr_for(self._walk(path, True)[0], read=False, write=True).store
        assert store is not None                # _attr_for checked it
        if len(value.encode("utf-8")) > PAGE_SIZE:
            raise oserror(errno.E2BIG)
        if not value:
            return                              # sysfs_kf_write: a zero-length write never reaches store()
        with self.model.lock:
            store(value)
