"""`vgpuvirt sim umount`, `sim reboot` and `--pid-file` touch only their own (issue 27): a mount point that is
not a vgpuvirt simulator mount is refused (checked in /proc/self/mountinfo), a pid is signalled only if it is
the simulator serving that mount, a huge pid is a one-line error, and a pid file is never written through a
link nor in a directory others can write. Other processes here are ``sleep`` children made for the purpose;
the foreign mount is a tmpfs in a private mount namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.sim import fuse

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def _pid_file(tmp_path: Path, text: str) -> Path:
    pf = tmp_path / "sim.pid"
    pf.write_text(text)
    return pf


def test_umount_refuses_a_mount_that_is_not_a_simulator() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    script = ('d=$(mktemp -d) && mount -t tmpfs -o size=16k victim-tmpfs "$d" && touch "$d/keep" && '
              '"$@" sim umount "$d"; echo "rc=$?"; test -e "$d/keep" && echo still-mounted; umount "$d"; rmdir "$d"')
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", sys.executable,
                        "-m", "vgpuvirt"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "still-mounted" in r.stdout and "rc=0" not in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "not a vgpuvirt simulator mount (tmpfs from victim-tmpfs)" in r.stderr


def test_umount_does_not_signal_a_process_that_is_not_the_mounts_server(tmp_path: Path, sleeper, capsys) -> None:
    pf = _pid_file(tmp_path, f"{sleeper.pid}\n")
    (tmp_path / "mnt").mkdir()
    assert main(["sim", "umount", str(tmp_path / "mnt"), "--pid-file", str(pf)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pid {sleeper.pid} is another process" in err
    assert sleeper.poll() is None and pf.exists()


def test_reboot_does_not_signal_a_process_that_is_not_the_mounts_server(tmp_path: Path, sleeper, capsys) -> None:
    mnt = tmp_path / "mnt"
    (mnt / "proc/sys/kernel/random").mkdir(parents=True)
    (mnt / "proc/sys/kernel/random/boot_id").write_text("b\n")
    pf = _pid_file(tmp_path, f"{sleeper.pid}\n")
    assert main(["sim", "reboot", str(mnt), "--pid-file", str(pf)]) == 2
    assert "another process" in capsys.readouterr().err
    assert sleeper.poll() is None


@pytest.mark.parametrize("text", ["99999999999999999999\n", "4194304\n", "0\n", "-1\n", "12 34\n", "\u0663\n",
                                  "1" * 100])
def test_a_pid_file_that_holds_no_pid_is_one_line(tmp_path: Path, text: str, capsys) -> None:
    pf = _pid_file(tmp_path, text)
    (tmp_path / "mnt").mkdir()
    assert main(["sim", "umount", str(tmp_path / "mnt"), "--pid-file", str(pf)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pid-file" in err and "Traceback" not in err
    assert pf.exists()


def test_a_pid_file_that_is_a_link_or_a_fifo_is_refused(tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim"
    victim.write_text("1\n")
    (tmp_path / "link.pid").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo.pid")
    (tmp_path / "mnt").mkdir()
    for name in ("link.pid", "fifo.pid"):
        assert main(["sim", "umount", str(tmp_path / "mnt"), "--pid-file", str(tmp_path / name)]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert victim.read_text() == "1\n"


def test_the_pid_file_is_written_without_following_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    link = tmp_path / "sim.pid"
    link.symlink_to(victim)
    fuse.write_pid_file(str(link), 4242)
    assert victim.read_text() == "root's own\n"
    assert not link.is_symlink() and link.read_text() == "4242\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.pid", "victim"]      # no temporary left


def test_a_pid_file_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)                                  # as /tmp
    with pytest.raises(InvalidSpec, match="only root can write"):
        fuse.write_pid_file(str(shared / "sim.pid"), 4242)
    assert not (shared / "sim.pid").exists()


def test_mountinfo_is_read_with_its_escapes_and_the_top_mount_wins() -> None:
    info = ("36 25 0:32 / /srv/my\\040sim rw,relatime shared:1 - tmpfs tmpfs rw\n"
            "37 36 0:33 / /srv/my\\040sim rw,nosuid - fuse.vgpuvirt-sim vgpuvirt-sim:t4x2 rw,user_id=0\n"
            "38 25 0:34 / /other rw - ext4 /dev/sda1 rw\n")
    assert fuse.mount_of("/srv/my sim", info) == ("fuse.vgpuvirt-sim", "vgpuvirt-sim:t4x2")
    assert fuse.mount_of("/other", info) == ("ext4", "/dev/sda1")
    assert fuse.mount_of("/nowhere", info) is None
