"""scripts/testbed.sh asks libvirtd over its socket (issue 16): `status` does not call a live pid a working
libvirtd, and `start` never launches a second libvirtd over the sockets of one that runs. Read-only for the
shared testbed: `status` only asks, and `start` runs against a scratch state dir and a libvirt URI nobody
answers on, so it must stop at the guard, before launching anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "testbed.sh"


def script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def libvirtds() -> list[str]:
    return subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True).stdout.split()


def test_status_says_libvirtd_answers_on_its_socket(testbed: Any) -> None:
    res = script("status")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"answers on {testbed.libvirt_uri}" in res.stdout
    assert script("libvirt-state").stdout.strip() in ("ours", "foreign")


def test_status_fails_when_a_live_libvirtd_does_not_answer(testbed: Any, tmp_path: Path) -> None:
    res = script("status", VGPUVIRT_LIBVIRT_URI=f"qemu+unix:///system?socket={tmp_path}/no-sock")
    assert res.returncode == 1
    assert "does NOT answer" in res.stdout, res.stdout


def test_start_never_launches_a_second_libvirtd_over_live_sockets(testbed: Any, tmp_path: Path) -> None:
    # the testbed's own libvirtd must answer (pgrep alone also counts migration hosts' daemons): were it dead,
    # this `start` would find no libvirtd and launch one on the system sockets with a scratch pid file
    assert script("libvirt-state").stdout.strip() in ("ours", "foreign"), "the testbed's libvirtd answers"
    before = libvirtds()
    res = script("start", VGPUVIRT_SBX=str(tmp_path / "sbx"), VGPUVIRT_SSH_PORT="2299", VGPUVIRT_LIBVIRT_WAIT="1",
                 VGPUVIRT_LIBVIRT_URI=f"qemu+unix:///system?socket={tmp_path}/no-sock")
    assert res.returncode == 5, res.stderr
    assert "not starting a second one" in res.stderr
    assert libvirtds() == before
    assert not (tmp_path / "sbx" / "run" / "libvirtd.pid").exists()


def test_a_stale_pid_file_is_not_taken_for_another_hosts_daemon(testbed: Any, tmp_path: Path) -> None:
    # Seen here: migration host m6's pid files outlived it, their pids went to m1's virtlogd and libvirtd, and
    # `alive` (which matched the program's name) called m6's daemons running: mig-up then waited 60 s per host
    # for a libvirtd it never started. A scratch state dir whose m1 pid file names the testbed's own libvirtd.
    (tmp_path / "sbx" / "mig" / "m1").mkdir(parents=True)
    (tmp_path / "sbx" / "run").mkdir()
    (tmp_path / "sbx" / "mig" / "m1" / "libvirtd.pid").write_text(libvirtds()[0] + "\n")
    res = script("status", VGPUVIRT_SBX=str(tmp_path / "sbx"))
    assert "migration host m1 libvirtd: stopped" in res.stdout, res.stdout
