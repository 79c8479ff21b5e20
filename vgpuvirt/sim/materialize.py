"""Write a simulated host's sysfs as a static tree: directories, plain files and relative symlinks.

The tree is a snapshot for ``--sysfs-root`` (LocalHost/SSHHost read it like a real /sys); writes to
it change files, not state. Write-only attributes become empty files with mode 0200.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from vgpuvirt.errors import HostError
from vgpuvirt.sim.fs import SimFs
from vgpuvirt.sim.model import SimModel
from vgpuvirt.sim.profiles import Profile, load_profile

#: The host files vgpuvirt reads outside /sys: the kernel command line, the NVIDIA driver's version and
#: loaded parameters (the vGPU scheduler's registry keys).
_PROC = ("/proc/cmdline", "/proc/driver")


def _copy(fs: SimFs, src: str, dst: str, stack: list[str]) -> None:
    kind, mode = fs.stat(src)
    if kind == "l":
        os.symlink(fs.readlink(src), dst)
    elif kind == "d":
        os.makedirs(dst, exist_ok=True)
        stack.append(src)
    else:
        try:
            text = fs.read(src)
        except OSError:
            text = ""
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.chmod(dst, mode)


def materialize_fs(fs: SimFs, dest_dir: str) -> int:
    """Copy everything below ``/sys`` of ``fs`` into ``dest_dir/sys``, and the ``/proc`` files vgpuvirt reads
    (``/proc/cmdline``, ``/proc/driver/...``); return the number of entries below ``/sys``."""
    count = 0
    stack = ["/sys"]
    os.makedirs(os.path.join(dest_dir, "sys"), exist_ok=True)
    while stack:
        d = stack.pop()
        for name in sorted(fs.listdir(d)):
            count += 1
            _copy(fs, f"{d}/{name}", dest_dir + f"{d}/{name}", stack)
    os.makedirs(os.path.join(dest_dir, "proc"), exist_ok=True)
    for path in _PROC:
        try:
            fs.stat(path)
        except OSError:
            continue
        _copy(fs, path, dest_dir + path, stack)
    while stack:
        d = stack.pop()
        for name in sorted(fs.listdir(d)):
            _copy(fs, f"{d}/{name}", dest_dir + f"{d}/{name}", stack)
    return count


def materialize(profile: Profile | str, dest_dir: str) -> int:
    """Materialize a profile (object, shipped name or file path) in its initial state. A tree that cannot be
    written whole (a full disk, a read-only file system) is removed again (``dest_dir/sys``, and ``dest_dir``
    if this call made it) and the cause is a one-line HostError."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    made_dir = not os.path.lexists(dest_dir)
    made_sys = not os.path.lexists(os.path.join(dest_dir, "sys"))
    try:
        return materialize_fs(SimFs(SimModel(prof)), dest_dir)
    except OSError as exc:
        if made_sys:
            shutil.rmtree(os.path.join(dest_dir, "sys"), ignore_errors=True)
        if made_dir:
            with contextlib.suppress(OSError):
                os.rmdir(dest_dir)
        raise HostError("local", f"cannot write the simulated tree of {prof.name} to {dest_dir}: "
                                 f"{exc.strerror or exc} (nothing of it was left)") from None
