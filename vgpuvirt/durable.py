"""Records the client keeps (``iommu prepare --record FILE``), written durably and never through a link.

A record describes a change vgpuvirt is about to make (the drivers it will take devices from), so it
must be on disk, complete, BEFORE the change: written to a temporary file in the target's directory,
fsynced, then given its name, and the directory fsynced. A full disk, a missing or unwritable
directory, a link planted at the name: each is a :class:`RecordError` raised before anything changed.

The name is taken with ``link(2)``, which neither follows nor replaces what is already there: an
existing file (an earlier record, which may hold the only copy of some original drivers) or a planted
symlink makes the write fail (``O_EXCL`` semantics); ``O_NOFOLLOW`` guards the temporary file. Every
step works relative to one open descriptor of the directory, so swapping the directory for a link
halfway cannot redirect the write.
"""

from __future__ import annotations

import errno as _errno
import os
import secrets
import stat

from vgpuvirt.errors import RecordError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _name_taken(path: str, dfd: int, name: str) -> RecordError:
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        return RecordError(path, _errno.ELOOP, "is a symbolic link: refusing to write through it")
    if stat.S_ISREG(st.st_mode):
        return RecordError(path, _errno.EEXIST, "already exists: refusing to replace it (an earlier record may "
                                                 "hold the only copy of the original drivers); release with it "
                                                 "first, or name a new file")
    return RecordError(path, _errno.EEXIST, "exists and is not a regular file")


def write_new_file(path: str | os.PathLike[str], text: str, *, mode: int = 0o600) -> None:
    """Create ``path`` holding ``text``, durably (temp file, fsync, link into place, fsync directory).
    Raises :class:`RecordError` (with what to do) and leaves nothing behind when it cannot."""
    p = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(p))
    if not name or name in (".", ".."):
        raise RecordError(p, _errno.EISDIR, "names a directory, not a file")
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError as exc:
        why = ("does not exist" if exc.errno == _errno.ENOENT else "is not a directory"
               if exc.errno == _errno.ENOTDIR else f"cannot be opened ({exc.strerror})")
        raise RecordError(p, exc.errno, f"its directory {directory} {why}") from None
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd: int | None = None
    try:
        try:
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            raise _name_taken(p, dfd, name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
        view = memoryview(text.encode())
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = None
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            raise _name_taken(p, dfd, name) from None    # appeared since we looked: never replaced
        os.unlink(tmp, dir_fd=dfd)
        os.fsync(dfd)
    except OSError as exc:
        raise RecordError(p, exc.errno, f"cannot be written ({exc.strerror or exc})") from None
    finally:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass          # already linked and unlinked, or a stray temp file: harmless either way
        os.close(dfd)
