"""A live FUSE mount of a simulated host (mfusepy), with the same semantics as SimHost.

The mount point holds ``sys/``: point ``--sysfs-root`` (LocalHost, SSHHost) at the mount point, or
bind ``MOUNT/sys`` over ``/sys`` in a mount namespace for tools such as mdevctl. The filesystem is
one process, so every user of the mount sees one shared state. Needs root and /dev/fuse.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import time
from typing import Any

from vgpuvirt.errors import HostError, InvalidSpec, MissingDependency
from vgpuvirt.sim.fs import SimFs
from vgpuvirt.sim.fs_etc import MODPROBE_DIR, STATE_DIR
from vgpuvirt.sim.model import SimModel
from vgpuvirt.sim.profiles import Profile, load_profile

try:  # the optional extra [fuse]
    import mfusepy
    _Operations: Any = mfusepy.Operations
except ImportError:  # pragma: no cover - exercised only without the extra
    mfusepy = None
    _Operations = object

_EPOCH = 1_700_000_000 * 10**9
#: How long the kernel keeps a looked-up name (seconds); see mount() for why this is safe.
ENTRY_TIMEOUT_S = 60.0


class SimFuse(_Operations):  # type: ignore[misc]
    """mfusepy operations mapped onto :class:`SimFs`; sysfs open-time checks included."""

    use_ns = True

    def __init__(self, fs: SimFs) -> None:
        self.fs = fs
        self.reboot_requested = False
        self.staged: dict[str, str] = {}         # files being written under a temporary name (replace_file)

    def request_reboot(self, *_: object) -> None:
        """SIGHUP (``vgpuvirt sim reboot``): only a flag, because a signal handler may run in the middle of
        an operation; the next operation reboots the model before it looks at anything."""
        self.reboot_requested = True

    def _tick(self) -> None:
        if self.reboot_requested:
            self.reboot_requested = False
            self.fs.model.reboot()

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        self._tick()
        kind, mode = ("f", 0o600) if path in self.staged else self.fs.stat(path, follow=False)
        if kind == "l":
            st_mode, size, nlink = stat.S_IFLNK | 0o777, len(self.fs.readlink(path)), 1
        elif kind == "d":
            st_mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
        else:
            st_mode, size, nlink = stat.S_IFREG | mode, 4096, 1   # sysfs reports 4096 for attributes
        return {"st_mode": st_mode, "st_nlink": nlink, "st_size": size, "st_uid": 0, "st_gid": 0,
                "st_atime": _EPOCH, "st_mtime": _EPOCH, "st_ctime": _EPOCH}

    def opendir(self, path: str) -> int:
        self._tick()
        # The kernel may hold a cached dentry of a directory that is gone (entries are cached, see
        # mount()); opening it must fail as it would on sysfs, not list an empty directory.
        kind, _ = self.fs.stat(path, follow=True)
        if kind != "d":
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        return 0

    def readdir(self, path: str, fh: Any) -> list[str]:
        self._tick()
        return [".", "..", *self.fs.listdir(path)]

    def readlink(self, path: str) -> str:
        self._tick()
        return self.fs.readlink(path)

    def open(self, path: str, flags: int) -> int:
        self._tick()
        if path in self.staged:
            return 0
        acc = flags & os.O_ACCMODE
        self.fs.check_open(path, read=acc in (os.O_RDONLY, os.O_RDWR), write=acc in (os.O_WRONLY, os.O_RDWR))
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        self._tick()
        return self.fs.read(path).encode("utf-8")[offset:offset + size]

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        self._tick()
        if path in self.staged:
            text = self.staged[path]
            self.staged[path] = text[:offset] + data.decode("utf-8", "surrogateescape") + text[offset + len(data):]
            return len(data)
        self.fs.write(path, data.decode("utf-8", "surrogateescape"))
        return len(data)

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        # The shell's '>' truncates first; sysfs ignores that. Only attributes that take writes allow it.
        if path in self.staged:
            self.staged[path] = self.staged[path][:length]
            return 0
        self.fs.check_open(path, read=False, write=True)
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        # Only the agent's replace_file in /etc/modprobe.d and vgpuvirt's state directory creates a file: a
        # temporary name beside the target, written, then renamed over it (the rename is what the model sees).
        self._tick()
        if path.rpartition("/")[0] not in (MODPROBE_DIR, STATE_DIR) or path in self.staged:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        self.staged[path] = ""
        return 0

    def rename(self, old: str, new: str) -> int:
        self._tick()
        if old not in self.staged:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        self.fs.replace_file(new, self.staged.pop(old), 0o644)
        return 0

    def unlink(self, path: str) -> int:
        self._tick()
        if self.staged.pop(path, None) is None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_namemax": 255}


def _require() -> None:
    if mfusepy is None:
        raise MissingDependency("mfusepy", "fuse", "the FUSE simulator mount")


def mount(profile: Profile | str, mountpoint: str, *, foreground: bool = True) -> None:
    """Mount a simulated host on ``mountpoint`` and serve it until unmounted (blocks)."""
    _require()
    prof = load_profile(profile) if isinstance(profile, str) else profile
    fs = SimFs(SimModel(prof))
    ops = SimFuse(fs)
    signal.signal(signal.SIGHUP, ops.request_reboot)
    # A created mdev must appear, and a removed one vanish, at once:
    # * negative_timeout=0: a failed lookup is never cached, so a new name is looked up (and found) at once;
    # * attr_timeout=0: every stat of a cached entry asks us (GETATTR), and a gone one answers ENOENT;
    #   open/opendir/readlink of a cached entry also reach us and fail with ENOENT (see opendir());
    # * entry_timeout>0: names found stay cached, so a path walk does not ask us once per component:
    #   with 0, reading a `large` inventory made ~340,000 lookups, each resolved from the root.
    # Symlink bodies are not cached by the kernel (no FUSE_CAP_CACHE_SYMLINKS): a `driver` link
    # changes its target on rebind.
    mfusepy.FUSE(ops, mountpoint, foreground=foreground, nothreads=True, direct_io=True,
                 allow_other=True, entry_timeout=ENTRY_TIMEOUT_S, attr_timeout=0, negative_timeout=0,
                 fsname=f"vgpuvirt-sim:{prof.name}", subtype="vgpuvirt-sim")


def _mounted(mountpoint: str) -> bool:
    return os.path.ismount(mountpoint) and os.path.isdir(os.path.join(mountpoint, "sys", "bus"))


def start(profile: str, mountpoint: str, *, pid_file: str | None = None, timeout: float = 30.0) -> int:
    """Mount in a background process (a new session); wait until the mount answers; return its pid."""
    _require()
    if not os.path.isdir(mountpoint):
        raise HostError("local", f"mount point {mountpoint} is not a directory")
    load_profile(profile)   # refuse a bad profile here, with its message, not in the child
    proc = subprocess.Popen([sys.executable, "-m", "vgpuvirt.sim.fuse", profile, mountpoint],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while not _mounted(mountpoint):
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode("utf-8", "replace").strip()
            raise HostError("local", f"FUSE mount of {profile} on {mountpoint} failed: {err[-500:] or 'exited'}")
        if time.monotonic() > deadline:
            proc.kill()
            raise HostError("local", f"FUSE mount of {profile} on {mountpoint} did not appear in {timeout} s")
        time.sleep(0.02)
    if proc.stderr:
        proc.stderr.close()
    if pid_file:
        with open(pid_file, "w", encoding="ascii") as fh:
            fh.write(f"{proc.pid}\n")
    return proc.pid


def stop(mountpoint: str, *, pid_file: str | None = None, timeout: float = 10.0) -> None:
    """Unmount (fusermount3 -u, else umount) and wait for the serving process to end."""
    if os.path.ismount(mountpoint):
        for argv in (["fusermount3", "-u", mountpoint], ["umount", mountpoint]):
            try:
                if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
                    break
            except FileNotFoundError:
                continue
        else:
            raise HostError("local", f"cannot unmount {mountpoint}")
    if pid_file and os.path.exists(pid_file):
        try:
            with open(pid_file, encoding="ascii") as fh:
                pid = int(fh.read().strip() or "0")
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidSpec("--pid-file", pid_file, "a file holding the pid `sim mount --background` wrote") from exc
        deadline = time.monotonic() + timeout
        while pid > 0 and time.monotonic() < deadline:
            try:
                # Our own child (started by start() in this process) must be reaped, or it stays a zombie.
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                pass
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        else:
            if pid > 0:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        os.unlink(pid_file)


BOOT_ID = "proc/sys/kernel/random/boot_id"


def reboot(mountpoint: str, *, pid_file: str, timeout: float = 10.0) -> str:
    """Reboot the simulated host a background mount serves (SIGHUP to its server); wait until its
    ``proc/sys/kernel/random/boot_id`` changes and return the new one."""
    try:
        with open(pid_file, encoding="ascii") as fh:
            pid = int(fh.read().strip() or "0")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidSpec("--pid-file", pid_file, "a file holding the pid `sim mount --background` wrote") from exc
    path = os.path.join(mountpoint, BOOT_ID)
    try:
        with open(path, encoding="ascii") as fh:
            before = fh.read().strip()
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise HostError("local", f"no simulated host mounted on {mountpoint} (pid {pid}): {exc.strerror}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, encoding="ascii") as fh:      # the read itself lets the server act on the signal
            now = fh.read().strip()
        if now != before:
            return now
        time.sleep(0.02)
    raise HostError("local", f"the simulated host on {mountpoint} did not reboot within {timeout} s")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m vgpuvirt.sim.fuse PROFILE MOUNTPOINT", file=sys.stderr)
        return 2
    mount(args[0], args[1], foreground=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
