"""A live FUSE mount of a simulated host (mfusepy), with the same semantics as SimHost.

The mount point holds ``sys/``: point ``--sysfs-root`` (LocalHost, SSHHost) at the mount point, or
bind ``MOUNT/sys`` over ``/sys`` in a mount namespace for tools such as mdevctl. The filesystem is
one process, so every user of the mount sees one shared state. Needs root and /dev/fuse.
"""

from __future__ import annotations

import contextlib
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
from vgpuvirt.sim.fs_etc import MODPROBE_DIR, PACKAGE_DIR, STATE_DIR
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
        if path.rpartition("/")[0] not in (MODPROBE_DIR, STATE_DIR, PACKAGE_DIR) or path in self.staged:
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


#: the file system type and source prefix of our mounts in /proc/self/mountinfo (see mount(): subtype, fsname)
FSTYPE = "fuse.vgpuvirt-sim"
SOURCE_PREFIX = "vgpuvirt-sim:"
#: above the kernel's largest pid_max (2**22): not a pid
PID_MAX = 1 << 22
_PID_FILE_MAX = 64


def _unescape(field: str) -> str:
    """A mountinfo field: the kernel writes space, tab, newline and backslash as \\ooo octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1:i + 4]) == 3 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_of(mountpoint: str, mountinfo: str | None = None) -> tuple[str, str] | None:
    """(file system type, source) of what is mounted on ``mountpoint`` (the top of the stack), from
    ``/proc/self/mountinfo``; None when nothing is mounted there."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            mountinfo = fh.read()
    target = os.path.realpath(mountpoint)
    found = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split(" ")
        if _unescape(fields[4]) == target and len(after) >= 2:
            found = (after[0], _unescape(after[1]))      # a later line is mounted over an earlier one
    return found


def _ours(mountpoint: str) -> bool:
    m = mount_of(mountpoint)
    return m is not None and m[0] == FSTYPE and m[1].startswith(SOURCE_PREFIX)


def _check_pid_dir(pid_file: str) -> str:
    """The pid file's absolute path, after checking its directory is one only root (or we) can write: a pid file
    in ``/tmp`` could be replaced by anyone between our write and its reader."""
    path = os.path.abspath(pid_file)
    try:
        st = os.stat(os.path.dirname(path))
    except OSError as exc:
        raise InvalidSpec("--pid-file", pid_file, f"a file in an existing directory ({exc.strerror})") from None
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise InvalidSpec("--pid-file", pid_file, "a file in a directory only root can write (not /tmp: "
                                                  "another user could plant a link or a pid there)")
    return path


def write_pid_file(pid_file: str, pid: int) -> None:
    """Write ``pid`` without following links: a new file (O_EXCL | O_NOFOLLOW) renamed over the name, so a link
    planted there is replaced, never written through."""
    path = _check_pid_dir(pid_file)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{pid}\n".encode("ascii"))
    finally:
        os.close(fd)
    os.rename(tmp, path)


def read_pid_file(pid_file: str) -> int | None:
    """The pid in a pid file (None when the file is gone); one-line errors for a link, a non-file, a huge or
    malformed content."""
    want = "a file holding the pid `sim mount --background` wrote"
    try:
        fd = os.open(pid_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidSpec("--pid-file", pid_file, f"{want} ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidSpec("--pid-file", pid_file, f"{want} (not a regular file)")
        raw = os.read(fd, _PID_FILE_MAX + 1)
    finally:
        os.close(fd)
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > _PID_FILE_MAX or not text.isdigit() or not 0 < int(text) < PID_MAX:
        raise InvalidSpec("--pid-file", pid_file, want)
    return int(text)


def _server_of(pid: int, mountpoint: str) -> bool | None:
    """Whether ``pid`` is the simulator serving ``mountpoint`` (its command line is ours, for that mount);
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except FileNotFoundError:
        return None
    except OSError:
        return False
    if argv and argv[-1] == b"":
        argv.pop()
    words = [a.decode("utf-8", "surrogateescape") for a in argv]
    return (len(words) >= 4 and words[-4:-2] == ["-m", "vgpuvirt.sim.fuse"]
            and os.path.realpath(words[-1]) == os.path.realpath(mountpoint))


def _our_server(pid_file: str, mountpoint: str) -> int | None:
    """The pid the file names if it is this mount's simulator; None if that process is gone; refused (one
    line, nothing signalled) when it is another process."""
    pid = read_pid_file(pid_file)
    if pid is None:
        return None
    mine = _server_of(pid, mountpoint)
    if mine is False:
        raise InvalidSpec("--pid-file", pid_file, f"the pid of the simulator serving {mountpoint} (pid {pid} "
                                                  "is another process: not signalled)")
    return pid if mine else None


def start(profile: str, mountpoint: str, *, pid_file: str | None = None, timeout: float = 30.0) -> int:
    """Mount in a background process (a new session); wait until the mount answers; return its pid."""
    _require()
    if not os.path.isdir(mountpoint):
        raise HostError("local", f"mount point {mountpoint} is not a directory")
    load_profile(profile)   # refuse a bad profile here, with its message, not in the child
    if pid_file:
        _check_pid_dir(pid_file)    # before mounting: a refused pid file leaves no mount behind
    proc = subprocess.Popen([sys.executable, "-m", "vgpuvirt.sim.fuse", profile, os.path.abspath(mountpoint)],
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
        write_pid_file(pid_file, proc.pid)
    return proc.pid


def stop(mountpoint: str, *, pid_file: str | None = None, timeout: float = 10.0) -> None:
    """Unmount a simulator mount (fusermount3 -u, else umount) and wait for its server to end.

    Only our own: a mount point that holds anything but a vgpuvirt simulator (``/proc/self/mountinfo``: type
    :data:`FSTYPE`, source ``vgpuvirt-sim:PROFILE``) is refused, and the pid file's process is waited for (and
    signalled) only if it is the simulator serving this mount point."""
    pid = _our_server(pid_file, mountpoint) if pid_file else None     # checked before anything is done
    if os.path.ismount(mountpoint):
        if not _ours(mountpoint):
            kind = mount_of(mountpoint)
            raise HostError("local", f"{mountpoint} is not a vgpuvirt simulator mount ({kind[0] if kind else '?'} "
                                     f"from {kind[1] if kind else '?'}): refusing to unmount it")
        for argv in (["fusermount3", "-u", mountpoint], ["umount", mountpoint]):
            try:
                if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
                    break
            except FileNotFoundError:
                continue
        else:
            raise HostError("local", f"cannot unmount {mountpoint}")
    if pid_file and os.path.lexists(pid_file):
        deadline = time.monotonic() + timeout
        while pid is not None and time.monotonic() < deadline:
            try:
                # Our own child (started by start() in this process) must be reaped, or it stays a zombie.
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                pass
            if not _server_of(pid, mountpoint):
                break                    # gone (or its pid already reused by another process: left alone)
            time.sleep(0.02)
        else:
            if pid is not None and _server_of(pid, mountpoint):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        os.unlink(pid_file)


BOOT_ID = "proc/sys/kernel/random/boot_id"


def reboot(mountpoint: str, *, pid_file: str, timeout: float = 10.0) -> str:
    """Reboot the simulated host a background mount serves (SIGHUP to its server); wait until its
    ``proc/sys/kernel/random/boot_id`` changes and return the new one."""
    if read_pid_file(pid_file) is None:
        raise InvalidSpec("--pid-file", pid_file, "a file holding the pid `sim mount --background` wrote")
    pid = _our_server(pid_file, mountpoint)
    if pid is None:
        raise HostError("local", f"no simulated host mounted on {mountpoint} (the server {pid_file} names is gone)")
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
