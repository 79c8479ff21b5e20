"""The batch agent: one request in, one response out.

This file is self-contained (stdlib only, Python >= 3.6) because SSHHost sends its source to
the remote ``python3`` with the request (in argv, or on stdin when large): a whole inventory or a
whole batch of writes is ONE request. With ``--serve`` the same process stays and answers further
requests framed on stdin (see :func:`serve`), one per connection. LocalHost calls :func:`handle`
in-process and SimHost calls it with the simulator's filesystem, so every Host shares these exact
semantics.

Request (JSON)::

    {"root": "/", "reads": ["/sys/bus/pci/devices/*/vendor", ...],
     "ops": [{"op": "write", "path": ..., "value": ...}, ...],
     "on_error": "stop" | "continue", "lock": {"path": ..., "timeout": 30} | null,
     "reads_after": [...], "compress": false}

Paths are host paths (``/sys/...``) below ``root``; they never contain ``.`` or ``..``
components. Read patterns may use ``*``, ``?`` and ``[...]`` inside a component, and a component
may end in a guard that filters its matches by what exists below each one (REL is one plain
name: no wildcard, no ``/``)::

    *{!REL}     skip a match that has REL      (/sys/class/mdev_bus/*{!physfn}/...: not the VFs)
    *{?REL}     keep only matches that have REL
    *{1?REL}    keep only the first match, in name order, that has REL
                (/sys/bus/pci/devices/*/virtfn*{1?mdev_supported_types}/...: one VF per PF)

Guards let one request sample what is the same on many devices (a GPU's vGPU type names and
descriptions repeat on each of its 32 VFs) instead of opening it on every one of them.

Ops::

    write      path, value                 one write(2) of value
    check_int  path, min                   fail (errno ENOSPC) if int(content) < min
    check_absent path                      fail (errno EEXIST) if path exists
    wait       path, state (exists|absent|equals), value?, timeout
    exec       argv, stdin?, timeout       run a program (never through a shell)

Each op may carry ``"group"``: with on_error=continue a failure skips the rest of its group only.
"""

import errno as _errno
import sys
import time

MYPY = False
if MYPY:  # the type checker's view: importing typing (and subprocess, fnmatch) is left out of each exec's start
    import os
    from typing import Any, Callable, Dict, List, Optional
else:
    # posix is the C half of os: every system call the agent makes, without importing os.py (and
    # collections.abc with it), ~1 ms of each exec's start. What only os.py has (os.path, makedirs, a str
    # environ) comes from _os(), in the code that needs it (not a read on root /).
    import posix as os


def _os() -> "Any":
    """The os module itself, for what posix lacks."""
    import os as full
    return full

PROTOCOL = 1
MAX_READ = 1 << 20
_MAGIC = set("*?[")


class PathRefused(Exception):
    pass


class Escape(OSError):
    """A path that resolves outside the sysfs root (a symlink leads out): refused, never opened."""


def check_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise PathRefused("path must be absolute: %r" % (path,))
    for part in path.split("/")[1:]:
        if part in (".", ".."):
            raise PathRefused("path must not contain . or ..: %r" % (path,))
    return path


_NOFOLLOW_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


class ReadFs:
    """The real filesystem below ``root``, confined to it: what a read needs (:class:`OsFs` adds the writes).

    Real sysfs is full of symlinks that stay inside it (``/sys/bus/pci/devices/X ->
    ../../../devices/pci0000:00/X``), so links are followed, but only to places inside ``root``: each
    directory a path passes through is resolved once per request (none for a directory a listing showed
    to be one; else one ``readlink``, a link's target resolved through the same cache) and one that lands
    outside raises :class:`Escape` (``EXDEV``). The final
    component is never followed: reads report a link as a link, writes open it ``O_NOFOLLOW``, and a write
    opens its directory first and checks where that really is (``/proc/self/fd``) before opening the
    attribute relative to it, so a directory swapped for a link after the check is caught too.
    A root of ``/`` needs none of this: every path is inside it.
    """

    def __init__(self, root: str = "/") -> None:
        if root == "/":
            self.root = real = "/"
        else:
            self.root = _os().path.abspath(root)
            real = _os().path.realpath(self.root)
        self.confined = self.root != "/"
        self._inside = real.rstrip("/") + "/"
        #: host directory ("" is the root, "/sys/bus") -> where it really is, checked to be inside the root
        self._dirs = {"": real.rstrip("/")}  # type: Dict[str, str]

    def forget(self) -> None:
        """Drop resolved directories (after writes: directories come and go, e.g. an mdev's)."""
        del_keys = [k for k in self._dirs if k]
        for k in del_keys:
            del self._dirs[k]

    def _escape(self, path: str, real: str) -> Escape:
        exc = Escape(_errno.EXDEV, "%s resolves to %s, outside the sysfs root %s (a symbolic link leads "
                     "out of it): refused" % (path, real, self.root))
        exc.real = real  # type: ignore[attr-defined]
        return exc

    def _dir(self, d: str, hops: int = 0) -> str:
        """Where host directory ``d`` really is; :class:`Escape` when that is outside the root."""
        real = self._dirs.get(d)
        if real is not None:
            return real
        parent, _, name = d.rpartition("/")
        preal = self._dir(parent, hops)
        real = preal + "/" + name
        try:
            link = os.readlink(real)   # one call tells a link (its target) from a directory (EINVAL)
        except OSError as exc:
            if exc.errno != _errno.EINVAL:
                raise
            link = None
        if link is not None:
            if hops >= 40:
                raise OSError(_errno.ELOOP, os.strerror(_errno.ELOOP), d)
            # ``preal`` has no links in it, so the target's ".." can be taken lexically; what the target
            # names is then resolved the same way, through the cache (sysfs links share long prefixes:
            # realpath() would lstat every component of each one again).
            target = _join(preal, link)
            if not (target + "/").startswith(self._inside):
                raise self._escape(d, target)
            real = self._dir(target[len(self._inside) - 1:] if target + "/" != self._inside else "", hops + 1)
        self._dirs[d] = real
        return real

    def _at(self, path: str) -> str:
        """``path`` below the root, its directories resolved and checked, its last component not followed."""
        if not self.confined:
            return path
        if path == "/":
            return self._dirs[""]
        parent, _, name = path.rpartition("/")
        try:
            return self._dir(parent) + "/" + name
        except Escape as exc:   # named after the path asked for, not the directory that leads out
            raise self._escape(path, getattr(exc, "real", "?") + "/" + name) from None

    def real(self, path: str) -> str:
        check_path(path)
        return self._at(path)

    def listdir(self, path: str) -> "List[str]":
        if not self.confined:
            return os.listdir(path)
        d = "" if path == "/" else path.rstrip("/")
        real = self._dir(d)
        # The listing's d_type tells which entries are plain directories: they need no lstat of their own
        # when a path goes through them (an inventory goes through ~6,000 type directories).
        names = []
        dirs = self._dirs
        with os.scandir(real) as it:
            for entry in it:
                name = entry.name
                names.append(name)
                if entry.is_dir(follow_symlinks=False):
                    dirs[d + "/" + name] = real + "/" + name
        return names

    def real_prefix(self, prefix: str) -> str:
        """Where the directory ``prefix`` (ending in "/") really is, with a "/": the walk reads many
        files below one directory and resolves it once for all of them."""
        return self._dir(prefix[:-1]) + "/"

    def read_entry(self, path: str, real: "Optional[str]" = None) -> "Optional[List[Any]]":
        """One open(O_NOFOLLOW) tells file, directory or symlink apart; a file costs open+read+close.

        ``real``: where ``path`` is, from :meth:`real_prefix`.
        """
        # Paths reaching here were built from validated patterns plus names from listdir (no '/', never
        # '.' or '..'), so they are not re-validated: that check was a fifth of a large inventory's time.
        if real is None:
            real = path
        try:
            if real is path and self.confined:
                parent, _, name = path.rpartition("/")
                real = (self._dirs.get(parent) or self._dir(parent)) + "/" + name
            fd = os.open(real, _NOFOLLOW_READ)
        except OSError as exc:
            if exc.errno == _errno.ELOOP and not isinstance(exc, Escape):
                try:
                    return ["l", os.readlink(real), None]
                except OSError as exc2:
                    # Gone since the open (or a stale cached name on a FUSE mount): absent, as above.
                    if exc2.errno in (_errno.ENOENT, _errno.ENOTDIR):
                        return None
                    return ["e", None, exc2.errno]
            if exc.errno in (_errno.ENOENT, _errno.ENOTDIR):
                return None
            return ["e", None, exc.errno]
        try:
            data = os.read(fd, 65536)
            if len(data) == 65536:
                rest = [data]
                while sum(len(c) for c in rest) < MAX_READ:
                    more = os.read(fd, 65536)
                    if not more:
                        break
                    rest.append(more)
                data = b"".join(rest)
            return ["f", data.decode("utf-8", "replace"), None]
        except OSError as exc:
            if exc.errno == _errno.EISDIR:
                return ["d", None, None]
            return ["e", None, exc.errno]
        finally:
            os.close(fd)

    def kind(self, path: str) -> "Optional[str]":
        """'l' symlink, 'd' directory, 'f' anything else, None if absent; :class:`Escape` out of the root."""
        try:
            st = os.lstat(self.real(path))
        except Escape:
            raise
        except OSError:
            return None
        import stat
        if stat.S_ISLNK(st.st_mode):
            return "l"
        if stat.S_ISDIR(st.st_mode):
            return "d"
        return "f"

    def readlink(self, path: str) -> str:
        return os.readlink(self.real(path))

    def read(self, path: str) -> str:
        try:
            fd = os.open(self.real(path), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise _no_link(exc, path, "read") from None
        try:
            chunks = []  # type: List[bytes]
            total = 0
            while total < MAX_READ:
                b = os.read(fd, 65536)
                if not b:
                    break
                chunks.append(b)
                total += len(b)
            return b"".join(chunks).decode("utf-8", "replace")
        finally:
            os.close(fd)


def _join(base: str, link: str) -> str:
    """``normpath(join(base, link))`` for a ``base`` without links, quick for sysfs's ``../../x/y`` targets."""
    if link[:1] != "/":
        while link[:3] == "../":
            base, link = base[:base.rfind("/")], link[3:]
        link = base + "/" + link
    if "/." in link or "//" in link or link.endswith("/"):
        link = _os().path.normpath(link)
    return link


def _no_link(exc: OSError, path: str, what: str) -> OSError:
    """O_NOFOLLOW's ELOOP said as what it means."""
    if exc.errno == _errno.ELOOP and not isinstance(exc, Escape):
        return OSError(_errno.ELOOP, "%s is a symbolic link: vgpuvirt does not %s through one" % (path, what))
    return exc


def _fd_path(fd: int) -> "Optional[str]":
    """Where an open directory really is (None without /proc: the check made by resolving it stands)."""
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return None


# >>> agent part "ops": the writes, the lock and the audit log's files (see parts_needed)


class OsFs(ReadFs):
    """:class:`ReadFs` and the writes: an attribute written with one ``write(2)``, a configuration file replaced
    atomically or removed; never through a link, and (confined) in a directory checked to be inside the root."""

    def write(self, path: str, value: str) -> None:
        # sysfs attributes take exactly one write(2); O_TRUNC as the shell's '>' does (sysfs ignores it,
        # a materialized tree needs it), never O_CREAT: a missing attribute is an error, not a new file;
        # O_NOFOLLOW: a write never goes through a link (sysfs attributes are plain files).
        flags = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW
        check_path(path)
        try:
            if not self.confined:
                fd = os.open(path, flags)
            else:
                parent, name = self._at(path).rsplit("/", 1)[0], path.rpartition("/")[2]
                dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    where = _fd_path(dfd)
                    if where is not None and not (where + "/").startswith(self._inside):
                        raise self._escape(path, where + "/" + name)
                    fd = os.open(name, flags, dir_fd=dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            raise _no_link(exc, path, "write") from None
        try:
            os.write(fd, value.encode("utf-8"))
        finally:
            os.close(fd)

    def replace_file(self, path: str, value: str, mode: int) -> None:
        """A whole configuration file (``/etc/modprobe.d/...``) replaced atomically: a new file beside it,
        fsynced, renamed over it; never written through a link (the rename replaces a link itself, it does
        not follow it), its directory checked to be inside the root as for :meth:`write`."""
        check_path(path)
        parent, name = self._at(path).rsplit("/", 1)[0] or "/", path.rpartition("/")[2]
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            where = _fd_path(dfd)
            if self.confined and where is not None and not (where + "/").startswith(self._inside):
                raise self._escape(path, where + "/" + name)
            tmp = ".%s.%d.tmp" % (name, os.getpid())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode & 0o7777, dir_fd=dfd)
            try:
                try:
                    _write_all(fd, value.encode("utf-8"))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove_file(self, path: str) -> None:
        """The undo of a :meth:`replace_file` that created a file: unlink it (a link itself, never what it points
        to), its directory checked to be inside the root as for :meth:`write`; already absent is fine."""
        check_path(path)
        try:
            parent, name = self._at(path).rsplit("/", 1)[0] or "/", path.rpartition("/")[2]
            dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno == _errno.ENOENT and not isinstance(exc, Escape):
                return          # no directory, no file
            raise
        try:
            where = _fd_path(dfd)
            if self.confined and where is not None and not (where + "/").startswith(self._inside):
                raise self._escape(path, where + "/" + name)
            try:
                os.unlink(name, dir_fd=dfd)
            except OSError as exc:
                if exc.errno != _errno.ENOENT:
                    raise
            os.fsync(dfd)
        finally:
            os.close(dfd)


class UnsafeState(Exception):
    """The lock's (or the audit log's) directory or file cannot be trusted: refused, with the reason."""


def open_state_dir(path: str) -> int:
    """An fd of directory ``path``, made 0700 if missing, after checking that only we can write there.

    The lock and the audit log live in such a directory (``/run/vgpuvirt``, ``/var/log/vgpuvirt``): one
    that another user owns, that others may write, or that is a link, could let another local user hold
    the lock, fill or forge the log, or redirect either. Such a directory is refused, never repaired.
    """
    path = _os().path.abspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        try:
            _os().makedirs(_os().path.dirname(path), 0o755, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:   # not a trust problem: the cause (read-only, full) is named as such
            raise OSError(exc.errno, "cannot create %s: %s" % (path, os.strerror(exc.errno or 0))) from None
    except OSError as exc:
        raise OSError(exc.errno, "cannot create %s: %s" % (path, os.strerror(exc.errno or 0))) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if _os().path.islink(path):
            raise UnsafeState("%s is a symbolic link: refusing to keep vgpuvirt's lock or log there "
                              "(remove the link)" % path) from None
        raise OSError(exc.errno, "cannot open %s: %s" % (path, os.strerror(exc.errno or 0))) from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = "is owned by uid %d, not by uid %d that runs vgpuvirt here" % (st.st_uid, os.geteuid())
    elif st.st_mode & 0o022:
        problem = "is group- or world-writable (mode %04o)" % (st.st_mode & 0o7777)
    if problem is not None:
        os.close(fd)
        raise UnsafeState("%s %s: refusing to keep vgpuvirt's lock or log there (make it a directory of "
                          "its own, mode 0700, or remove it)" % (path, problem))
    return fd


def open_state_file(path: str, flags: int) -> int:
    """``path`` (its directory checked by :func:`open_state_dir`) opened or created 0600, never through a link."""
    dfd = open_state_dir(_os().path.dirname(_os().path.abspath(path)))
    try:
        try:
            fd = os.open(_os().path.basename(path), flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
        except OSError as exc:
            if exc.errno == _errno.ELOOP:
                raise UnsafeState("%s is a symbolic link: refused (remove it)" % path) from None
            raise OSError(exc.errno, "cannot open %s: %s" % (path, os.strerror(exc.errno or 0))) from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o170000 != 0o100000:
        os.close(fd)
        raise UnsafeState("%s is not a plain file owned by uid %d: refused" % (path, os.geteuid()))
    return fd


class FlockLocker:
    """The host-side lock: an exclusive flock on a file in a directory only we can write (see open_state_dir)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.fd = None  # type: Optional[int]

    def __enter__(self) -> "FlockLocker":
        import fcntl
        self.fd = open_state_file(self.path, os.O_RDWR)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (_errno.EAGAIN, _errno.EACCES) or time.monotonic() > deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise
                time.sleep(0.01)

    def __exit__(self, *exc: "Any") -> None:
        import fcntl
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

# <<< agent part "ops"


_TERMINAL = ""        # trie keys that no component can be (components are non-empty and have no "/")
_MAGIC_KEY = "/m"     # [(matcher, guard, child)]: listed, matched, filtered
_LITERAL_KEY = "/l"   # [(name, child)]: opened by name


class _Guard:
    """A component's ``{!REL}``, ``{?REL}`` or ``{1?REL}`` (see the module docstring)."""

    __slots__ = ("first", "present", "rel")

    def __init__(self, text: str) -> None:
        self.first = text.startswith("1?")
        if self.first or text.startswith("?"):
            self.present, rel = True, text[2:] if self.first else text[1:]
        elif text.startswith("!"):
            self.present, rel = False, text[1:]
        else:
            raise PathRefused("a guard starts with !, ? or 1?: {%s}" % text)
        # (a "/" cannot reach here: patterns are split into components first)
        if rel in ("", ".", "..") or _MAGIC & set(rel) or "{" in rel or "}" in rel:
            raise PathRefused("a guard names one plain name: {%s}" % text)
        self.rel = rel

    def admits(self, fs: "Any", path: str) -> bool:
        try:
            there = fs.kind(path + "/" + self.rel) is not None
        except OSError:   # out of the sysfs root (Escape): not there
            there = False
        return there == self.present


def _split_component(part: str) -> "tuple[str, Optional[_Guard]]":
    if part.endswith("}") and "{" in part:
        i = part.index("{")
        if not part[:i]:
            raise PathRefused("a guard follows a name pattern: %r" % part)
        return part[:i], _Guard(part[i + 1:-1])
    if "{" in part or "}" in part:
        raise PathRefused("a guard is {...} at the end of a component: %r" % part)
    return part, None


def _build_trie(patterns: "List[str]") -> "Dict[str, Any]":
    """Merge patterns by component so shared prefixes are listed once, however many leaves hang below.

    A node maps each component's text to its child node, and lists its children once more under
    ``_MAGIC_KEY`` as (matcher, guard, child) when they need a listing (wildcards or a guard; matcher
    None matches every name not starting with ``.``) or under ``_LITERAL_KEY`` as (name, child).
    """
    trie = {}  # type: Dict[str, Any]
    for pattern in patterns:
        check_path(pattern)
        node = trie
        for part in [p for p in pattern.split("/") if p]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
                glob, guard = _split_component(part)
                if guard is not None or _MAGIC & set(glob):
                    node.setdefault(_MAGIC_KEY, []).append((_matcher(glob), guard, child))
                else:
                    node.setdefault(_LITERAL_KEY, []).append((part, child))
            node = child
        node[_TERMINAL] = True
    return trie


def _matcher(glob: str) -> "Any":
    """A predicate for one name, as fnmatchcase; None for ``*`` (every name without a leading dot)."""
    if glob == "*":
        return None
    if "*" not in glob and "?" not in glob and "[" not in glob:   # a plain name with a guard
        return lambda name: name == glob
    full = _star_matcher(glob) if "?" not in glob and "[" not in glob else _re_matcher(glob)
    if glob.startswith("."):
        return full
    # as the shell's glob: a wildcard does not match a leading dot
    return lambda name: name[:1] != "." and full(name)


def _re_matcher(glob: str) -> "Callable[[str], bool]":
    import fnmatch  # imports re: only for the globs that need it
    import re
    match = re.compile(fnmatch.translate(glob)).match
    return lambda name: match(name) is not None


def _star_matcher(glob: str) -> "Callable[[str], bool]":
    """``virtfn*``, ``*.bin``, ``a*b*c`` without importing re (a third of the agent's start)."""
    parts = glob.split("*")
    head, tail, middle = parts[0], parts[-1], [m for m in parts[1:-1] if m]
    least = len(head) + len(tail) + sum(len(m) for m in middle)

    def match(name: str) -> bool:
        if len(name) < least or not name.startswith(head) or not name.endswith(tail):
            return False
        pos, end = len(head), len(name) - len(tail)
        for m in middle:
            i = name.find(m, pos, end)
            if i < 0:
                return False
            pos = i + len(m)
        return True
    return match


def _slow_read_entry(fs: "Any", path: str) -> "Optional[List[Any]]":
    k = fs.kind(path)
    if k is None:
        return None
    try:
        if k == "l":
            return ["l", fs.readlink(path), None]
        if k == "d":
            return ["d", None, None]
        return ["f", fs.read(path), None]
    except OSError as exc:
        return ["e", None, exc.errno]


#: A listing with at least this many matches is where a parallel read splits its work.
SPLIT_MIN = 32


def read_entries(fs: "Any", patterns: "List[str]", out: "Dict[str, Any]", workers: int = 1,
                 encoded: "Optional[Any]" = None) -> "Dict[str, Any]":
    """Expand every glob (``*?[`` inside components) and record each match: file text, link target, dir.

    Written as closures over the trie: a large inventory visits ~10k nodes, and attribute lookups
    and argument passing were a third of its time. With ``workers`` > 1 the subtrees below the first
    large listings (the 273 PCI devices, the 256 mdev parents, ...) are read by that many forked
    processes; only the standalone agent asks for it (forking a threaded caller is not safe).
    ``encoded``, a pair (list, dumps), lets the readers send their entries as JSON text ready to
    splice into the answer (appended to the list) instead of merging them into ``out``: each
    process then encodes its own share, at the same time as the others.
    """
    trie = _build_trie(patterns)
    read = getattr(fs, "read_entry", None)
    if read is None:
        def read(path: str) -> "Optional[List[Any]]":
            return _slow_read_entry(fs, path)
    listdir = fs.listdir
    # a confined OsFs resolves a directory once for all the files read below it (see OsFs.real_prefix)
    real_prefix = getattr(fs, "real_prefix", None) if getattr(fs, "confined", False) else None
    deferred = [] if workers > 1 else None  # type: Optional[List[Any]]

    def visit(node: "Dict[str, Any]", path: str) -> None:
        if _TERMINAL in node and path not in out:
            entry = read(path)
            if entry is None:
                return  # absent: nothing below it either
            out[path] = entry
        if _MAGIC_KEY in node or _LITERAL_KEY in node:
            walk(node, path + "/")

    def walk(node: "Dict[str, Any]", prefix: str) -> None:
        magic = node.get(_MAGIC_KEY)
        listed = None  # type: Optional[set[str]]
        if magic:
            try:
                names = sorted(listdir(prefix[:-1] or "/"))
            except OSError as exc:
                names = []
                if exc.errno == _errno.EXDEV and prefix[:-1] not in out:   # out of the root: say so
                    out[prefix[:-1]] = ["e", None, _errno.EXDEV]
            listed = set(names)
            split = deferred is not None and len(names) >= SPLIT_MIN
            taken = set()  # type: set[int]  # {1?...} patterns that already have their match
            for name in names:
                for i, (match, guard, child) in enumerate(magic):
                    if match is None:
                        if name[:1] == ".":
                            continue
                    elif not match(name):
                        continue
                    if guard is not None:
                        if i in taken or not guard.admits(fs, prefix + name):
                            continue
                        if guard.first:
                            taken.add(i)
                    if split:
                        deferred.append((child, prefix + name))  # type: ignore[union-attr]
                    else:
                        visit(child, prefix + name)
        base = None  # type: Optional[str]
        for name, child in node.get(_LITERAL_KEY, ()):
            # The listing made for the wildcards already says which plain names exist: an absent
            # attribute (boot_vga on a VF, sriov_* on a non-SR-IOV device) costs no open.
            if listed is not None and name not in listed:
                continue
            if len(child) == 1 and _TERMINAL in child:    # a leaf: the common case, read inline
                path = prefix + name
                if path not in out:
                    if real_prefix is not None:
                        if base is None:
                            try:
                                base = real_prefix(prefix)
                            except OSError:   # absent, or out of the root: read_entry says which, per file
                                base = ""
                        entry = read(path, base + name) if base else read(path)   # type: ignore[call-arg]
                    else:
                        entry = read(path)
                    if entry is not None:
                        out[path] = entry
            else:
                visit(child, prefix + name)

    walk(trie, "/")
    if deferred:
        deferred_items = deferred
        deferred = None   # the subtrees themselves are walked whole
        _read_in_parallel(deferred_items, visit, out, workers, encoded)
    return out


def _read_in_parallel(items: "List[Any]", visit: "Any", out: "Dict[str, Any]", workers: int,
                      encoded: "Optional[Any]" = None) -> None:
    """Visit ``items`` in ``workers`` processes: forked children send their entries back through a pipe.

    Items are dealt round-robin so that each process gets a share of every kind of subtree. A child
    sends its entries by marshal (merged into ``out`` here) or, with ``encoded``, as JSON object
    members that the caller splices into its answer. A child that fails to start or to answer
    costs only time: its share is then read here.
    """
    import marshal
    children = []  # type: List[Any]
    for k in range(1, min(workers, len(items))):
        share = items[k::workers]
        fds = ()  # type: tuple[int, ...]
        try:
            fds = os.pipe()
            pid = os.fork()
        except OSError:   # no fd or no process to spare: this share is read here
            for fd in fds:
                os.close(fd)
            children.append((None, None, share))
            continue
        rfd, wfd = fds
        if pid == 0:  # the child: read its share, hand it over, leave without running any cleanup
            code = 1
            try:
                os.close(rfd)
                out.clear()
                for node, path in share:
                    visit(node, path)
                data = encoded[1](out)[1:-1].encode("utf-8") if encoded is not None else marshal.dumps(out)
                view = memoryview(data)
                while view:
                    view = view[os.write(wfd, view):]
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        children.append((pid, rfd, share))
    for node, path in items[0::workers]:
        visit(node, path)
    for pid, rfd, share in children:
        data = None
        if pid is not None:
            chunks = []
            while True:
                chunk = os.read(rfd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
            os.close(rfd)
            _, status = os.waitpid(pid, 0)
            if status == 0:
                data = b"".join(chunks)
        if data is not None and encoded is not None:
            if data:
                encoded[0].append(data.decode("utf-8"))
            continue
        got = None
        if data is not None:
            try:
                got = marshal.loads(data)  # noqa: S302 (our own forked child, same interpreter)
            except (EOFError, ValueError, TypeError):
                got = None
        if got is None:
            for node, path in share:
                visit(node, path)
        else:
            for path, entry in got.items():
                out.setdefault(path, entry)


def _why(exc: OSError) -> str:
    """The kernel's strerror, or the sentence of our own refusals (Escape, a link not written through)."""
    if exc.filename is None and exc.strerror and exc.errno in (_errno.EXDEV, _errno.ELOOP):
        return exc.strerror
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _err(code: "Optional[int]", message: str) -> "Dict[str, Any]":
    return {"ok": False, "errno": code, "error": message}


# >>> agent part "ops": running a batch


def _run_op(fs: "Any", op: "Dict[str, Any]") -> "Dict[str, Any]":
    kind = op.get("op")
    path = op.get("path")
    try:
        if path is not None:
            check_path(path)
        if kind == "write":
            value = op["value"]
            if not isinstance(value, str) or "\0" in value:
                return _err(_errno.EINVAL, "value must be text")
            fs.write(path, value)
            return {"ok": True}
        if kind == "check_int":
            try:
                raw = fs.read(path)
            except OSError as exc:
                return _err(exc.errno, "cannot read %s: %s" % (path, _why(exc)))
            try:
                value = int(raw.strip())
            except ValueError:
                return _err(_errno.EINVAL, "%s holds %r, not an integer" % (path, raw.strip()))
            if value < int(op["min"]):
                return dict(_err(_errno.ENOSPC, "%s is %d (< %d)" % (path, value, int(op["min"]))), value=value)
            return {"ok": True, "value": value}
        if kind == "check_absent":
            if fs.kind(path) is not None:
                return _err(_errno.EEXIST, "%s exists" % path)
            return {"ok": True}
        if kind == "wait":
            state = op.get("state", "exists")
            deadline = time.monotonic() + float(op.get("timeout", 10))
            interval = float(op.get("interval", 0.02))
            while True:
                present = fs.kind(path) is not None
                if state == "exists" and present:
                    return {"ok": True}
                if state == "absent" and not present:
                    return {"ok": True}
                if state == "equals" and present:
                    try:
                        cur = fs.read(path).strip()
                    except OSError:
                        cur = None
                    if cur == str(op.get("value")).strip():
                        return {"ok": True}
                if (state == "link_endswith" and present and fs.kind(path) == "l"
                        and fs.readlink(path).rstrip("/").endswith("/" + str(op.get("value")))):
                    return {"ok": True}
                if time.monotonic() >= deadline:
                    return _err(_errno.ETIMEDOUT, "timed out waiting for %s to be %s %s" % (
                        path, state, op.get("value", "")))
                time.sleep(interval)
        if kind == "replace_file":
            value = op["value"]
            if not isinstance(value, str) or "\0" in value:
                return _err(_errno.EINVAL, "value must be text")
            fs.replace_file(path, value, int(op.get("mode", 0o644)))
            return {"ok": True}
        if kind == "remove_file":
            fs.remove_file(path)
            return {"ok": True}
        if kind == "nvml":
            # A simulated host answers from its model; a real one through libnvidia-ml (ctypes).
            handler = getattr(fs, "nvml", None)
            answer = handler(op) if handler is not None else nvml_call(op)  # type: Dict[str, Any]
            return answer
        if kind == "exec":
            # A simulated filesystem (vgpuvirt.sim) runs its own emulated tools instead of real programs.
            runner = getattr(fs, "run", None)
            if runner is not None:
                bad = _bad_argv(op)
                if bad is not None:
                    return bad
                emulated: Dict[str, Any] = runner(op["argv"], op)
                return emulated
            started = _exec_start(op)
            return started if isinstance(started, dict) else _exec_finish(op, started)
        return _err(_errno.EINVAL, "unknown op %r" % (kind,))
    except PathRefused as exc:
        return _err(_errno.EINVAL, str(exc))
    except OSError as exc:
        return _err(exc.errno, _why(exc))


def _bad_argv(op: "Dict[str, Any]") -> "Optional[Dict[str, Any]]":
    argv = op.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return _err(_errno.EINVAL, "argv must be a non-empty list of strings")
    return None


#: a started program's stdout pipe is widened to this (Linux F_SETPIPE_SZ, best effort) so that a program
#: run next to others (see :func:`concurrent`) can print a large report (``nvidia-smi -q -x``) without waiting
#: for us to read it
_PIPE_SIZE = 1 << 20


def _exec_start(op: "Dict[str, Any]") -> "Any":
    """Start an exec op's program: (the Popen, its deadline), or the op's result dict when it cannot start."""
    bad = _bad_argv(op)
    if bad is not None:
        return bad
    argv = op["argv"]
    import subprocess
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if op.get("stdin") else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return dict(_err(exc.errno, "cannot run %s: %s" % (argv[0], os.strerror(exc.errno or 0))),
                    rc=127, stdout="", stderr=str(exc))
    try:
        import fcntl
        if proc.stdout is not None:
            fcntl.fcntl(proc.stdout.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_SIZE)
    except (ImportError, OSError, ValueError):   # another OS, or above /proc/sys/fs/pipe-max-size: as is
        pass
    return proc, time.monotonic() + float(op.get("timeout", 60))


def _exec_finish(op: "Dict[str, Any]", started: "Any") -> "Dict[str, Any]":
    """Wait for a started program (until its op's timeout, counted from its start): its result dict."""
    import subprocess
    proc, deadline = started
    argv = op["argv"]
    stdin = (op.get("stdin") or "").encode("utf-8") or None
    try:
        out, err = proc.communicate(stdin, timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return dict(_err(_errno.ETIMEDOUT, "%s timed out" % argv[0]), rc=-9,
                    stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"))
    res = {"ok": proc.returncode in op.get("ok_codes", [0]), "rc": proc.returncode,
           "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")}
    if not res["ok"]:
        res["errno"] = None
        res["error"] = "%s exited %d" % (argv[0], proc.returncode)
    return res


def concurrent(fs: "Any", ops: "List[Dict[str, Any]]", on_error: str) -> bool:
    """Whether a batch's programs may all run at once, next to its reads: every op a read-only exec of a real
    program (not the simulator's), none in a group, and on_error=continue. Such a batch gives the same
    results in any order (nothing it runs changes what another op or a read sees, and no failure skips
    anything), so a metrics collection's four tools and its sysfs reads take the time of the slowest."""
    return (bool(ops) and on_error == "continue" and getattr(fs, "run", None) is None
            and all(op.get("op") == "exec" and not mutates(op) and op.get("group") is None for op in ops))


def run_ops(fs: "Any", ops: "List[Dict[str, Any]]", on_error: str,
            audit: "Optional[Audit]" = None) -> "List[Dict[str, Any]]":
    results = []  # type: List[Dict[str, Any]]
    stopped = False
    failed_groups = set()  # type: set[str]
    for n, op in enumerate(ops):
        group = op.get("group")
        if stopped or (group is not None and group in failed_groups):
            results.append({"ok": False, "skipped": True, "errno": None, "error": "skipped"})
            if audit is not None:
                audit.op(n, op, results[-1])
            continue
        res = _run_op(fs, op)
        results.append(res)
        if audit is not None:
            audit.op(n, op, res)
        if not res.get("ok"):
            if on_error == "continue":
                if group is not None:
                    failed_groups.add(group)
            else:
                stopped = True
    return results


def _batch(request: "Dict[str, Any]", fs: "Any", response: "Dict[str, Any]", locker: "Any", workers: int,
           encoded: "Optional[Any]", auditor: "Any", audit_path: "Optional[str]") -> "Dict[str, Any]":
    """The ops of a request and its ``reads_after``, under the lock: :func:`handle`'s second half."""
    ops = request.get("ops", [])
    lock = request.get("lock")
    if locker is None and lock:
        locker = FlockLocker(lock["path"], float(lock.get("timeout", 30)))
    t0 = time.monotonic()
    try:
        if lock and locker is not None:
            try:
                locker.__enter__()
            except UnsafeState as exc:
                return {"v": PROTOCOL, "fatal": "state", "error": str(exc)}
            except OSError as exc:
                return {"v": PROTOCOL, "fatal": "lock", "errno": exc.errno,
                        "error": "cannot take lock %s: %s" % (lock.get("path"), os.strerror(exc.errno or 0))}
        response["lock_wait_s"] = round(time.monotonic() - t0, 4)
        audit = None  # type: Optional[Audit]
        if any(mutates(op) for op in ops):
            opened = open_audit(request, auditor, audit_path)
            if isinstance(opened, dict):
                return opened
            audit = opened
            response["audit_batch"] = audit.batch
        on_error = request.get("on_error", "stop")
        # A read-only batch (the metrics' tools) changes nothing that its reads would see: its programs
        # run while the files are read, and the reads may use the forked readers as the first read does.
        running = [_exec_start(op) for op in ops] if concurrent(fs, ops, on_error) else None
        read_only = not any(mutates(op) for op in ops)
        if running is None:
            response["ops"] = run_ops(fs, ops, on_error, audit)
            if audit is not None:
                problem = audit.end(response["ops"])
                if problem:
                    response["audit_error"] = problem
            forget = getattr(fs, "forget", None)
            if forget is not None:
                forget()   # the batch may have made or removed directories
        try:
            read_entries(fs, request.get("reads_after", []), response["after"], workers if read_only else 1,
                         _part(encoded, "after"))
        except PathRefused as exc:
            for started in running or ():
                if not isinstance(started, dict):
                    started[0].kill()
                    started[0].communicate()
            return {"v": PROTOCOL, "fatal": "refused", "error": str(exc)}
        if running is not None:
            response["ops"] = [p if isinstance(p, dict) else _exec_finish(ops[i], p)
                               for i, p in enumerate(running)]
    finally:
        if lock and locker is not None:
            locker.__exit__(None, None, None)
    return response
# <<< agent part "ops"


# An SSH client ships the agent without the parts (marked ``# >>> agent part "NAME"`` ... ``# <<<``) that a
# request does not run (vgpuvirt.host.ssh_agent): reads, the commonest request and the one a monitoring check
# repeats, then start the agent with half of it to load. The core (outside every part) answers reads; a part's
# code runs only where the core calls into it, under the conditions :func:`parts_needed` names.

#: each part: a name it defines, which tells whether it was shipped
PART_MARKS = {"ops": "run_ops", "nvml": "nvml_call", "serve": "serve"}


def parts_needed(request: "Any") -> "List[str]":
    """The parts besides the core that answering ``request`` (one not in resident mode) may run."""
    if not isinstance(request, dict):
        return []
    ops = request.get("ops")
    parts = []  # type: List[str]
    if ops or request.get("reads_after") or request.get("lock") or "audit_read" in request:
        parts.append("ops")
    if isinstance(ops, list) and any(isinstance(op, dict) and op.get("op") == "nvml" for op in ops):
        parts.append("nvml")
    return parts


def _missing_parts(needed: "List[str]") -> "Optional[Dict[str, Any]]":
    missing = [p for p in needed if PART_MARKS[p] not in globals()]
    if not missing:
        return None
    return {"v": PROTOCOL, "fatal": "agent", "error": "this agent was sent without its part(s) %s, which the "
                                                      "request needs: nothing was done" % ", ".join(missing)}


def handle(request: "Dict[str, Any]", fs: "Any" = None, locker: "Any" = None,
           workers: int = 1, encoded: "Optional[Any]" = None, auditor: "Any" = None,
           audit_path: "Optional[str]" = None) -> "Dict[str, Any]":
    """Execute one request; return the response dict. Never raises for per-item failures.

    ``workers`` > 1 lets the reads fork that many readers (see :func:`read_entries`): the first read, and
    ``reads_after`` when no op mutates. ``encoded``: (dict, dumps); the readers' JSON fragments of each part
    of the answer ("entries", "after") are appended to the dict's list of that name, for the caller to splice.
    ``auditor`` replaces the audit log file (SimHost keeps its log in memory): see :class:`Audit`.
    ``audit_path``: the log, for a caller that runs on the host itself (LocalHost's option); by default the
    host's configuration says (:func:`host_audit_path`). The request never chooses it.
    """
    needed = parts_needed(request)
    refused = _missing_parts(needed)
    if refused is not None:
        return refused
    if "audit_read" in request:
        return read_audit(request["audit_read"], auditor, audit_path)
    if fs is None:
        # the writes come with the ops part (OsFs); what reads only needs ReadFs, in the core
        root = request.get("root", "/")
        fs = OsFs(root) if "ops" in needed else ReadFs(root)
    response = {"v": PROTOCOL, "entries": {}, "ops": [], "after": {}}  # type: Dict[str, Any]
    try:
        read_entries(fs, request.get("reads", []), response["entries"], workers, _part(encoded, "entries"))
    except PathRefused as exc:
        return {"v": PROTOCOL, "fatal": "refused", "error": str(exc)}
    if request.get("ops") or request.get("reads_after"):
        return _batch(request, fs, response, locker, workers, encoded, auditor, audit_path)
    return response


def _part(encoded: "Optional[Any]", name: str) -> "Optional[Any]":
    """The (list, dumps) pair of :func:`read_entries` for one part of the answer."""
    return None if encoded is None else (encoded[0].setdefault(name, []), encoded[1])


# ------------------------------------------------------------------------------------------- audit
# The host decides what is recorded: which ops change something (by what they do, not by the request's
# word), where the log is (its own configuration), and each batch's id. A request cannot steer any of it.

# >>> agent part "ops": what mutates, and the audit log


#: programs an exec may run without being a mutation: name -> argument lists (a "BUSID" word is a PCI bus id,
#: "QUERY" a ``--query-gpu=`` field list, "FORMAT" a ``--format=csv...`` word)
READ_ONLY_PROGRAMS = {
    "nvidia-smi": (("-q", "-x"), ("mig", "-lgi"), ("mig", "-lgip"), ("mig", "-lgipp"), ("mig", "-lci"),
                   ("vgpu", "-q"), ("mig", "-i", "BUSID", "-lgi"), ("QUERY", "FORMAT")),
    "dmesg": ((),),
}  # type: Dict[str, Any]
#: NVML calls that read
READ_ONLY_NVML = ("vgpu_scheduler_get",)
#: ops that only look (their results say what they saw)
LOOKING_OPS = ("check_int", "check_absent", "wait")
_BUS_ID_CHARS = set("0123456789abcdefABCDEF:.")
_QUERY_FIELD_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789._,")
_CSV_OPTIONS = ("csv", "noheader", "nounits")


def _word_fits(word, shape):
    # type: (str, str) -> bool
    if shape == "BUSID":
        return bool(word) and set(word) <= _BUS_ID_CHARS
    if shape == "QUERY":     # --query-gpu only reads (fields: lower-case names, dots, commas)
        fields = word[len("--query-gpu="):]
        return word.startswith("--query-gpu=") and bool(fields) and set(fields) <= _QUERY_FIELD_CHARS
    if shape == "FORMAT":
        opts = word[len("--format="):].split(",")
        return word.startswith("--format=") and opts[0] == "csv" and all(o in _CSV_OPTIONS for o in opts)
    return word == shape


def _trusted_program(path: str) -> bool:
    """An absolute program path that only root (or we) can change: the file and its directory."""
    for p in (path, _os().path.dirname(path)):
        try:
            st = os.stat(p)
        except OSError:
            return False
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return False
    return True


def _reads_only(argv: "Any") -> bool:
    """Whether an exec's argv is one of :data:`READ_ONLY_PROGRAMS`' (bare name, or a path only root controls)."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return False
    prog = argv[0]
    name = prog.rsplit("/", 1)[-1]
    if name not in READ_ONLY_PROGRAMS or ("/" in prog and not (prog.startswith("/") and _trusted_program(prog))):
        return False
    for shape in READ_ONLY_PROGRAMS[name]:
        args = argv[1:]
        # (no zip(strict=): the agent runs on Python 3.6 too)
        if len(args) == len(shape) and all(_word_fits(args[i], w) for i, w in enumerate(shape)):
            return True
    return False


def mutates(op: "Dict[str, Any]") -> bool:
    """Whether an op may change the host, judged by what it does: its ``read_only`` word is not believed
    (a read-only exec is one of :data:`READ_ONLY_PROGRAMS`' argument lists, with no stdin). Unknown ops count
    as mutations (they fail, and their attempt is recorded)."""
    kind = op.get("op")
    if kind in LOOKING_OPS:
        return False
    if kind == "exec":
        return bool(op.get("stdin")) or not _reads_only(op.get("argv"))
    if kind == "nvml":
        return op.get("value") not in READ_ONLY_NVML
    return True


#: what an audit record keeps of a written value or an argument
AUDIT_VALUE_MAX = 256
#: where the host's configuration is (root's); a JSON object, e.g. {"audit_path": "/var/log/vgpuvirt/audit.jsonl"}
HOST_CONFIG = "/etc/vgpuvirt/agent.json"
#: the host's audit log when its configuration names none
DEFAULT_AUDIT_LOG = "/var/log/vgpuvirt/audit.jsonl"
#: records reserved per mutating op before a batch starts (a record is at most ~8 KiB: 32 argv words of 256
#: characters); an op record is rarely over 1 KiB, so this leaves room for the escaping of odd bytes
_RESERVE_PER_OP = 16384


def host_audit_path() -> str:
    """The audit log this host's configuration names (:data:`HOST_CONFIG`; a user's own,
    ``~/.config/vgpuvirt/agent.json``, when the agent does not run as root), else the default (root:
    :data:`DEFAULT_AUDIT_LOG`; a user: ``~/.local/state/vgpuvirt/host-audit.jsonl``). A configuration that
    others can change, or that does not parse, is refused (UnsafeState): mutations stop until it is fixed."""
    root = os.geteuid() == 0
    osp = _os().path
    home = osp.expanduser("~")
    conf = HOST_CONFIG if root else osp.join(home, ".config", "vgpuvirt", "agent.json")
    default = DEFAULT_AUDIT_LOG if root else osp.join(home, ".local", "state", "vgpuvirt", "host-audit.jsonl")
    try:
        fd = os.open(conf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return default
    except OSError as exc:
        raise UnsafeState("cannot read the host configuration %s: %s" % (conf, _why(exc))) from None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022 \
                or st.st_size > 65536:
            raise UnsafeState("the host configuration %s is not a small plain file that only uid %d can "
                              "change: refused" % (conf, os.geteuid()))
        raw = os.read(fd, 65537)
    finally:
        os.close(fd)
    try:
        cfg = _json_codec()[0](raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnsafeState("the host configuration %s is not JSON: %s" % (conf, exc)) from None
    path = cfg.get("audit_path", default) if isinstance(cfg, dict) else None
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise UnsafeState("the host configuration %s: audit_path must be an absolute path" % conf)
    return path


def _clip(text: "Any") -> "Any":
    if isinstance(text, str) and len(text) > AUDIT_VALUE_MAX:
        return text[:AUDIT_VALUE_MAX] + "...(%d chars)" % len(text)
    return text


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % (int(t * 1000) % 1000)


class AuditUnwritable(OSError):
    """The audit log cannot take this batch's records (full disk, read-only file system...): the batch is
    refused before anything runs, naming that cause (not an "unsafe location")."""


def _reserve(fd: int, nbytes: int) -> None:
    """Reserve ``nbytes`` after the log's end (fallocate KEEP_SIZE), so that the batch's records cannot meet a
    full disk halfway: ENOSPC now refuses the batch. Where fallocate is not there (another OS, a file system
    without it), the file system's free space is checked instead."""
    size = os.fstat(fd).st_size
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
        fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
        if fallocate(fd, 1, size, nbytes) == 0:     # 1: FALLOC_FL_KEEP_SIZE
            return
        code = ctypes.get_errno()
    except (ImportError, OSError, AttributeError):
        code = _errno.EOPNOTSUPP
    if code not in (_errno.EOPNOTSUPP, _errno.ENOSYS, _errno.EINVAL):
        raise AuditUnwritable(code, os.strerror(code))
    vfs = os.fstatvfs(fd)
    if vfs.f_bavail * vfs.f_frsize < nbytes:
        raise AuditUnwritable(_errno.ENOSPC, "%s (%d bytes free, the batch's records need up to %d)" % (
            os.strerror(_errno.ENOSPC), vfs.f_bavail * vfs.f_frsize, nbytes))


class FileAuditor:
    """The host's audit log: append-only JSON lines in a directory only we can write (open_state_dir).

    Each record is one whole line written with one ``write(2)`` on an ``O_APPEND`` descriptor (records of
    concurrent batches never interleave) and fsync'd; a write that comes out short is cut back, so no torn
    line stays, and a log found ending mid-line (a crash mid-write) gets its newline first. The file is
    opened for each batch, so a log rotated by renaming it is simply started anew.
    """

    def __init__(self, path: str) -> None:
        if not path.startswith("/"):
            raise UnsafeState("the audit log must be an absolute path: %r" % (path,))
        self.fd = open_state_file(path, os.O_RDWR | os.O_APPEND)

    def reserve(self, nbytes: int) -> None:
        _reserve(self.fd, nbytes)
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":
            self.write("")                        # end the torn line, so the next record stands alone

    def write(self, line: str) -> None:
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8")
        before = os.fstat(self.fd).st_size
        n = os.write(self.fd, data)
        if n < len(data):
            os.ftruncate(self.fd, before)         # never leave half a record (a full disk, a size limit)
            raise AuditUnwritable(_errno.ENOSPC, os.strerror(_errno.ENOSPC))
        os.fsync(self.fd)

    def sync(self) -> None:
        pass                                       # each write is fsync'd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_audit(request: "Dict[str, Any]", auditor: "Any", path: "Optional[str]") -> "Any":
    """The batch's :class:`Audit` (its "begin" written), or the fatal answer that refuses the batch: an unsafe
    location (``state``) or a log that cannot be written (``audit``, naming the cause). Closes what it opened."""
    where = path
    out = None
    try:
        if auditor is None:
            where = path or host_audit_path()
            out = FileAuditor(where)
        return Audit(request, auditor or out)
    except UnsafeState as exc:
        problem = {"v": PROTOCOL, "fatal": "state", "error": str(exc)}  # type: Dict[str, Any]
    except OSError as exc:
        problem = {"v": PROTOCOL, "fatal": "audit", "errno": exc.errno,
                   "error": "cannot write the audit log %s: %s" % (where, exc.strerror or _why(exc))}
    if out is not None:
        out.close()
    return problem


class Audit:
    """One mutating batch's records: "begin" (who, from where, which process), one per mutating op with its
    outcome, "end". A batch cut mid-flight (the agent killed, the host down) leaves a "begin" without its
    "end". The batch id is the host's own (random, so no request can reuse another batch's); the client's id
    is kept as ``request``. What the client says of itself (``client_user``, ``client_host``) is recorded as
    its claim next to what the host knows (``uid``, ``ssh_client``, ``sudo_user``)."""

    def __init__(self, request: "Dict[str, Any]", out: "Any") -> None:
        self.out = out
        self.dumps = _json_codec()[1]
        cfg = request.get("audit")
        cfg = cfg if isinstance(cfg, dict) else {}
        self.batch = _hex(os.urandom(8))
        ops = [op for op in request.get("ops", []) if isinstance(op, dict) and mutates(op)]
        reserve = getattr(out, "reserve", None)
        if reserve is not None:
            reserve(_RESERVE_PER_OP * (len(ops) + 2))
        environ = _os().environ
        ssh = environ.get("SSH_CONNECTION", "").split()
        self._emit({"event": "begin", "request": _clip(_text(cfg.get("id"))),
                    "client_user": _clip(_text(cfg.get("client_user"))),
                    "client_host": _clip(_text(cfg.get("client_host"))),
                    "ssh_client": ssh[0] if ssh else None, "sudo_user": environ.get("SUDO_USER"),
                    "pid": os.getpid(), "uid": os.geteuid(), "root": _clip(_text(request.get("root", "/"))),
                    "ops": len(ops)})
        self.out.sync()
        self.problem = None  # type: Optional[str]

    def _emit(self, record: "Dict[str, Any]") -> None:
        self.out.write(self.dumps(dict({"t": _now(), "batch": self.batch}, **record)) + "\n")

    def op(self, n: int, op: "Dict[str, Any]", res: "Dict[str, Any]") -> None:
        if not mutates(op):
            return
        outcome = "skipped" if res.get("skipped") else "ok" if res.get("ok") else "failed"
        rec = {"event": "op", "n": n, "op": _clip(_text(op.get("op"))), "outcome": outcome}  # type: Dict[str, Any]
        if op.get("op") == "remove_file":
            rec["path"] = _clip(_text(op.get("path")))
        elif op.get("op") in ("write", "replace_file"):
            rec["path"], rec["value"] = _clip(_text(op.get("path"))), _clip(_text(op.get("value")))
        elif op.get("op") == "nvml":
            rec["call"], rec["argv"] = _clip(_text(op.get("value"))), [_clip(_text(a)) for a in _list(op)][:8]
        else:
            rec["argv"] = [_clip(_text(a)) for a in _list(op)][:32]
            rec["rc"] = res.get("rc")
        if outcome == "failed":
            rec["errno"], rec["error"] = res.get("errno"), _clip(_text(res.get("error")))
        try:
            self._emit(rec)
        except OSError as exc:   # the log's disk failed despite the reservation: the batch goes on, the caller is told
            self.problem = self.problem or "audit log: %s" % (exc.strerror or os.strerror(exc.errno or 0))

    def end(self, results: "List[Dict[str, Any]]") -> "Optional[str]":
        counts = {"ok": 0, "failed": 0, "skipped": 0}
        for r in results:
            counts["skipped" if r.get("skipped") else "ok" if r.get("ok") else "failed"] += 1
        try:
            self._emit(dict({"event": "end"}, **counts))
        except OSError as exc:
            self.problem = self.problem or "audit log: %s" % (exc.strerror or os.strerror(exc.errno or 0))
        finally:
            self.out.close()
        return self.problem


def _hex(b: bytes) -> str:
    return "".join("%02x" % c for c in bytearray(b))


def _text(v: "Any") -> "Any":
    """A request's value as the log keeps it: None, a number or text (anything else as its repr)."""
    return v if v is None or isinstance(v, (str, int, float)) else repr(v)


def _list(op: "Dict[str, Any]") -> "List[Any]":
    argv = op.get("argv")
    return list(argv) if isinstance(argv, list) else [] if argv is None else [argv]


def read_audit(spec: "Dict[str, Any]", auditor: "Any" = None, path: "Optional[str]" = None) -> "Dict[str, Any]":
    """The tail (``max_bytes``, whole lines) of the host's audit log (the request names no path). Creates
    nothing: a missing log reads as empty."""
    max_bytes = int(spec.get("max_bytes") or MAX_READ * 4)
    if auditor is not None:
        text = auditor.text()
        return {"v": PROTOCOL, "audit": text[-max_bytes:], "exists": True}
    osp = _os().path
    try:
        path = osp.abspath(path or host_audit_path())
    except UnsafeState as exc:
        return {"v": PROTOCOL, "fatal": "state", "error": str(exc)}
    if not osp.lexists(osp.dirname(path)):
        return {"v": PROTOCOL, "audit": "", "exists": False}
    try:
        dfd = open_state_dir(osp.dirname(path))
        try:
            fd = os.open(osp.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
    except UnsafeState as exc:
        return {"v": PROTOCOL, "fatal": "state", "error": str(exc)}
    except OSError as exc:
        if exc.errno == _errno.ENOENT:
            return {"v": PROTOCOL, "audit": "", "exists": False}
        return {"v": PROTOCOL, "fatal": "state", "error": "cannot read the audit log %s: %s" % (
            path, "a symbolic link: refused" if exc.errno == _errno.ELOOP else os.strerror(exc.errno or 0))}
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        os.lseek(fd, start, 0)   # SEEK_SET
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        data = b"".join(chunks)
        if start:   # began mid-record: drop the partial line
            data = data[data.find(b"\n") + 1:]
        return {"v": PROTOCOL, "audit": data.decode("utf-8", "replace"), "exists": True, "truncated": start > 0}
    finally:
        os.close(fd)

# <<< agent part "ops"


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


def _no_default(obj: "Any") -> "Any":
    raise TypeError("%r is not JSON serializable" % (obj,))


def _json_codec() -> "Any":
    """(loads, dumps): the C scanner and encoder that the json module itself uses, or json.

    ``import json`` brings ``re`` and with it enum, functools and collections: about a third of
    the agent's start, paid on every exec. The C parts need none of it. Output is what
    ``json.dumps(obj, separators=(",", ":"))`` gives.
    """
    try:
        import _json

        class Context(object):
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            memo = {}  # type: Dict[str, Any]

            @staticmethod
            def parse_constant(name: str) -> "Any":
                raise ValueError("%s is not valid here" % name)

        scan = _json.make_scanner(Context())  # type: ignore[arg-type]  # duck-typed, as json.decoder does
        encode = _json.make_encoder(None, _no_default, _json.encode_basestring_ascii, None, ":", ",",
                                    False, False, True)

        def loads(text: str) -> "Any":
            text = text.strip(" \t\r\n")
            try:
                obj, end = scan(text, 0)
            except StopIteration as exc:
                raise ValueError("not JSON (at character %s)" % exc.value) from None
            if end != len(text):
                raise ValueError("extra data after the JSON value (at character %d)" % end)
            return obj

        def dumps(obj: "Any") -> str:
            return "".join(encode(obj, 0))
        return loads, dumps
    except (ImportError, AttributeError, TypeError):   # another Python, or other internals
        import json
        return json.loads, lambda obj: json.dumps(obj, separators=(",", ":"))


def _answer(raw: "Optional[bytes]", codec: "Any", started: float, error: "Optional[Exception]" = None) -> bytes:
    """One request's bytes (zlib'd or plain JSON) in, the response's bytes out (zlib'd if asked)."""
    loads, dumps = codec
    request = {}  # type: Dict[str, Any]
    fragments = {}  # type: Dict[str, List[str]]
    try:
        if error is not None:
            raise error
        assert raw is not None
        if raw[:1] != b"{":
            import zlib
            raw = zlib.decompress(raw)
        request = loads(raw.decode("utf-8"))
        if not isinstance(request, dict):
            raise ValueError("the request must be a JSON object")
    except Exception as exc:  # bad JSON, base64 (binascii.Error) or zlib data (zlib.error): one clear answer
        out = {"v": PROTOCOL, "fatal": "request", "error": "bad request: %s" % exc}  # type: Dict[str, Any]
        request = {}
    else:
        # A lone process may fork readers; the request can cap them ("workers": 1 reads serially).
        wanted = request.get("workers")
        auto = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        workers = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 1 else auto
        # Forked readers encode their own entries: spliced below, next to this process's.
        out = handle(request, workers=workers, encoded=(fragments, dumps) if workers > 1 else None)
    out["agent_s"] = round(time.monotonic() - started, 4)   # the host's share of a slow call, for the log
    spliced = []  # type: List[str]
    for name, parts in sorted(fragments.items()):
        if parts and name in out:
            # (a path two processes both reached would appear twice: equal reads of one file, json keeps one)
            members = ",".join(part for part in (dumps(out.pop(name))[1:-1], *parts) if part)
            spliced.append('"%s":{%s},' % (name, members))
    data = ("{" + "".join(spliced) + dumps(out)[1:]).encode("utf-8")  # type: bytes
    if request.get("compress"):
        import zlib
        data = zlib.compress(data, 1)   # level 1: 4x faster than 6 on a large inventory, 15% bigger
    return data


def _argv_request() -> bytes:
    # a small request comes as base64 of zlib'd JSON in argv: saves SSHHost a round trip
    import binascii  # not base64: that module imports re
    blob = sys.argv[-1]
    if blob.strip(_B64):
        raise ValueError("the argv request is not base64")
    return binascii.a2b_base64(blob.encode("ascii"))


def _read_exactly(fd: int, n: int) -> "Optional[bytes]":
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# >>> agent part "nvml": the vGPU scheduler through libnvidia-ml
# ---------------------------------------------------------------------------------------------- NVML
# The vGPU scheduler through libnvidia-ml with ctypes (a host reached over SSH has python3, not pynvml).
# An "nvml" op: {"op": "nvml", "value": CALL, "argv": [PCI bus id, ...]}; the answer carries the state as
# JSON in "stdout", or rc = the NVML return code (3 NOT_SUPPORTED, 13 FUNCTION_NOT_FOUND, 12 no library).
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13


def _nvml_structs() -> "Any":
    import ctypes as C

    class Params(C.Union):          # nvmlVgpuSchedulerParams_t / SetParams_t share this shape (2 x uint)
        _fields_ = [("a", C.c_uint), ("b", C.c_uint)]

    class GetState(C.Structure):    # nvmlVgpuSchedulerGetState_t
        _fields_ = [("policy", C.c_uint), ("arr", C.c_uint), ("p", C.c_uint * 2)]

    class SetState(C.Structure):    # nvmlVgpuSchedulerSetState_t
        _fields_ = [("policy", C.c_uint), ("arr", C.c_uint), ("p", C.c_uint * 2)]

    class Caps(C.Structure):        # nvmlVgpuSchedulerCapabilities_t
        _fields_ = [("supported", C.c_uint * 3), ("max_ts", C.c_uint), ("min_ts", C.c_uint),
                    ("arr", C.c_uint), ("max_freq", C.c_uint), ("min_freq", C.c_uint),
                    ("max_avg", C.c_uint), ("min_avg", C.c_uint)]

    class LogEntry(C.Structure):    # nvmlVgpuSchedulerLogEntry_t
        _fields_ = [("timestamp", C.c_ulonglong), ("run_total", C.c_ulonglong), ("run", C.c_ulonglong),
                    ("runlist", C.c_uint), ("target", C.c_ulonglong), ("preempt", C.c_ulonglong)]

    class PciInfo(C.Structure):     # nvmlPciInfo_t
        _fields_ = [("busIdLegacy", C.c_char * 16), ("domain", C.c_uint), ("bus", C.c_uint),
                    ("device", C.c_uint), ("pciDeviceId", C.c_uint), ("pciSubSystemId", C.c_uint),
                    ("busId", C.c_char * 32)]

    class Log(C.Structure):         # nvmlVgpuSchedulerLog_t
        _fields_ = [("engine", C.c_uint), ("policy", C.c_uint), ("arr", C.c_uint), ("p", C.c_uint * 2),
                    ("count", C.c_uint), ("entries", LogEntry * 200)]
    return C, GetState, SetState, Caps, Log, PciInfo


def _nvml_migration_structs() -> "Any":
    """vGPU migration metadata, as NVIDIA's own bindings (nvidia-ml-py) lay them out."""
    import ctypes as C

    class VgpuMeta(C.Structure):    # nvmlVgpuMetadata_t
        _fields_ = [("version", C.c_uint), ("revision", C.c_uint), ("guestInfoState", C.c_uint),
                    ("guestDriverVersion", C.c_char * 80), ("hostDriverVersion", C.c_char * 80),
                    ("reserved", C.c_uint * 6), ("vgpuVirtualizationCaps", C.c_uint), ("guestVgpuVersion", C.c_uint),
                    ("opaqueDataSize", C.c_uint), ("opaqueData", C.c_char * (4 + 256))]

    class VgpuVersion(C.Structure):  # nvmlVgpuVersion_t
        _fields_ = [("minVersion", C.c_uint), ("maxVersion", C.c_uint)]

    class PgpuMeta(C.Structure):    # nvmlVgpuPgpuMetadata_t
        _fields_ = [("version", C.c_uint), ("revision", C.c_uint), ("hostDriverVersion", C.c_char * 80),
                    ("pgpuVirtualizationCaps", C.c_uint), ("reserved", C.c_uint * 5),
                    ("hostSupportedVgpuRange", VgpuVersion), ("opaqueDataSize", C.c_uint),
                    ("opaqueData", C.c_char * 256)]

    class Compat(C.Structure):      # nvmlVgpuPgpuCompatibility_t
        _fields_ = [("vgpuVmCompatibility", C.c_uint), ("compatibilityLimitCode", C.c_uint)]
    return VgpuMeta, PgpuMeta, Compat


def _nvml_migration(C: "Any", fn: "Any", check: "Any", call: str, args: "List[str]") -> "Dict[str, Any]":
    """``vgpu_migration_metadata MDEV_UUID`` (the source: nvmlVgpuInstanceGetMetadata of the vGPU whose mdev
    UUID that is) and ``vgpu_migration_compat BUS_ID METADATA_HEX`` (the destination: nvmlDeviceGetVgpuMetadata
    of that GPU, then nvmlGetVgpuCompatibility of the two), as XenServer's pre-checks ask them."""
    import json
    VgpuMeta, PgpuMeta, Compat = _nvml_migration_structs()
    if call == "vgpu_migration_metadata":
        want = args[0].lower()
        count = C.c_uint()
        check(fn("nvmlDeviceGetCount_v2")(C.byref(count)), "nvmlDeviceGetCount")
        for i in range(count.value):
            h = C.c_void_p()
            check(fn("nvmlDeviceGetHandleByIndex_v2")(i, C.byref(h)), "GetHandleByIndex")
            n = C.c_uint(0)
            rc = fn("nvmlDeviceGetActiveVgpus")(h, C.byref(n), None)
            if rc not in (0, 7) or n.value == 0:       # 7: INSUFFICIENT_SIZE, the count is in n
                continue
            ids = (C.c_uint * n.value)()
            check(fn("nvmlDeviceGetActiveVgpus")(h, C.byref(n), ids), "GetActiveVgpus")
            for inst in ids[:n.value]:
                buf = C.create_string_buffer(80)
                if fn("nvmlVgpuInstanceGetMdevUUID")(inst, buf, 80) != 0 or buf.value.decode().lower() != want:
                    continue
                meta, size = VgpuMeta(), C.c_uint(C.sizeof(VgpuMeta))
                check(fn("nvmlVgpuInstanceGetMetadata")(inst, C.byref(meta), C.byref(size)), "GetMetadata")
                return {"ok": True, "rc": 0, "stdout": json.dumps({
                    "caps": meta.vgpuVirtualizationCaps, "host_driver": meta.hostDriverVersion.decode(),
                    "guest_driver": meta.guestDriverVersion.decode(), "blob": bytes(meta).hex()})}
        raise RuntimeError(6, "no active vGPU with mdev UUID %s: Not Found" % want)
    handle, pg = C.c_void_p(), PgpuMeta()
    check(fn("nvmlDeviceGetHandleByPciBusId_v2")(args[0].encode(), C.byref(handle)), args[0])
    size = C.c_uint(C.sizeof(PgpuMeta))
    check(fn("nvmlDeviceGetVgpuMetadata")(handle, C.byref(pg), C.byref(size)), "DeviceGetVgpuMetadata")
    raw = bytes.fromhex(args[1])
    if len(raw) != C.sizeof(VgpuMeta):
        raise ValueError("vGPU metadata of %d bytes, not %d" % (len(raw), C.sizeof(VgpuMeta)))
    vm, compat = VgpuMeta.from_buffer_copy(raw), Compat()
    check(fn("nvmlGetVgpuCompatibility")(C.byref(vm), C.byref(pg), C.byref(compat)), "GetVgpuCompatibility")
    return {"ok": True, "rc": 0, "stdout": json.dumps({
        "vm": compat.vgpuVmCompatibility, "limit": compat.compatibilityLimitCode,
        "pgpu_caps": pg.pgpuVirtualizationCaps, "host_driver": pg.hostDriverVersion.decode()})}


def nvml_call(op: "Dict[str, Any]") -> "Dict[str, Any]":
    import json
    try:
        C, GetState, SetState, Caps, Log, PciInfo = _nvml_structs()
        lib = C.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return dict(_err(None, "NVML library not found: %s" % exc), rc=NVML_ERROR_LIBRARY_NOT_FOUND)
    call, args = op.get("value"), [str(a) for a in op.get("argv") or []]

    def fn(name: str) -> "Any":
        f = getattr(lib, name, None)
        if f is None:
            raise LookupError(name)
        return f

    def check(rc: int, what: str) -> None:
        if rc != 0:
            text = "NVML error %d" % rc
            try:
                es = fn("nvmlErrorString")
                es.restype = C.c_char_p
                text = es(rc).decode("utf-8", "replace")
            except LookupError:
                pass
            raise RuntimeError(rc, "%s: %s" % (what, text))
    try:
        check(fn("nvmlInit_v2")(), "nvmlInit")
        try:
            if call == "vgpu_scheduler_get" and args[:1] == ["all"]:
                # every GPU NVML sees, each answered alone: a caller that does not know the GPUs yet (a layout's
                # one read) gets them all in one call; a GPU's own failure is its entry's, not the call's
                count, out_all = C.c_uint(), []
                check(fn("nvmlDeviceGetCount_v2")(C.byref(count)), "nvmlDeviceGetCount")
                for i in range(count.value):
                    h, pci = C.c_void_p(), PciInfo()
                    check(fn("nvmlDeviceGetHandleByIndex_v2")(i, C.byref(h)), "GetHandleByIndex")
                    check(fn("nvmlDeviceGetPciInfo_v3")(h, C.byref(pci)), "GetPciInfo")
                    one = nvml_call({"value": call, "argv": [pci.busId.decode()]})
                    out_all.append({"gpu": pci.busId.decode(), "ok": one.get("ok"), "rc": one.get("rc"),
                                    "state": json.loads(one["stdout"]) if one.get("ok") else None,
                                    "error": one.get("error")})
                return {"ok": True, "rc": 0, "stdout": json.dumps(out_all)}
            if call in ("vgpu_migration_metadata", "vgpu_migration_compat"):
                return _nvml_migration(C, fn, check, str(call), args)
            handle = C.c_void_p()
            check(fn("nvmlDeviceGetHandleByPciBusId_v2")(args[0].encode(), C.byref(handle)), args[0])
            if call == "vgpu_scheduler_get":
                st, caps, log = GetState(), Caps(), Log()
                check(fn("nvmlDeviceGetVgpuSchedulerState")(handle, C.byref(st)), "GetVgpuSchedulerState")
                out = {"policy": st.policy, "arr": st.arr,
                       # with ARR on the union holds (avgFactor, timeslice), else (timeslice,)
                       "timeslice_ns": st.p[1] if st.arr == 2 else st.p[0]}
                if fn("nvmlDeviceGetVgpuSchedulerCapabilities")(handle, C.byref(caps)) == 0:
                    out["capabilities"] = {"policies": [p for p in caps.supported if p],
                                           "min_timeslice_ns": caps.min_ts, "max_timeslice_ns": caps.max_ts,
                                           "adaptive": bool(caps.arr)}
                if fn("nvmlDeviceGetVgpuSchedulerLog")(handle, C.byref(log)) == 0:
                    out["log_entries"] = log.count
                return {"ok": True, "rc": 0, "stdout": json.dumps(out)}
            if call == "vgpu_scheduler_set":
                st = SetState()
                st.policy, st.arr = int(args[1]), int(args[2])
                st.p[0] = int(args[3])      # timeslice (ns) when ARR is off; 0: the driver's default
                check(fn("nvmlDeviceSetVgpuSchedulerState")(handle, C.byref(st)), "SetVgpuSchedulerState")
                return {"ok": True, "rc": 0, "stdout": "{}"}
            return dict(_err(_errno.EINVAL, "unknown NVML call %r" % (call,)), rc=2)
        finally:
            fn("nvmlShutdown")()
    except LookupError as exc:
        return dict(_err(None, "NVML has no %s (driver too old)" % exc), rc=NVML_ERROR_FUNCTION_NOT_FOUND)
    except RuntimeError as exc:
        return dict(_err(None, str(exc.args[1])), rc=exc.args[0])
    except (IndexError, ValueError) as exc:
        return dict(_err(_errno.EINVAL, "bad NVML arguments: %s" % exc), rc=2)

# <<< agent part "nvml"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# >>> agent part "serve": the resident agent


def serve(codec: "Any") -> None:
    """Resident mode (``--serve``): answer framed requests on stdin until it closes.

    A frame is a 4-byte big-endian length and that many bytes. SSHHost keeps one such agent per
    connection, so a call after the first pays neither the interpreter's start nor the agent's
    compilation (~20 ms of host CPU per call); a request given in argv is answered first.
    """
    import struct
    if len(sys.argv) > 2:
        started = time.monotonic()
        try:
            first, error = _argv_request(), None  # type: Optional[bytes], Optional[Exception]
        except Exception as exc:
            first, error = None, exc
        data = _answer(first, codec, started, error)
        _write_all(1, struct.pack(">I", len(data)) + data)
    while True:
        head = _read_exactly(0, 4)
        if head is None:
            return
        raw = _read_exactly(0, struct.unpack(">I", head)[0])
        if raw is None:
            return
        started = time.monotonic()
        data = _answer(raw, codec, started)
        _write_all(1, struct.pack(">I", len(data)) + data)

# <<< agent part "serve"


def main() -> None:
    started = time.monotonic()
    codec = _json_codec()
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        if PART_MARKS["serve"] not in globals():
            sys.exit("vgpuvirt-agent: sent without its resident part (--serve)")
        serve(codec)
        return
    try:
        raw, error = (_argv_request() if len(sys.argv) > 1 else sys.stdin.buffer.read()), None
    except Exception as exc:
        raw, error = None, exc
    sys.stdout.buffer.write(_answer(raw, codec, started, error))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
