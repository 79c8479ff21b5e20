"""Reboot and the real mdevctl: a defined (persistent, `start: auto`) mdev stays defined across a simulated
reboot, is not running after it (the simulator starts nothing), and `mdevctl start` -- the boot step mdevctl's
own udev rule would run -- brings it back through the kernel paths; a device that was only started is gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.sim import fuse

pytestmark = pytest.mark.integration

NS_SCRIPT = 'mount --bind "$1/sys" /sys && mount --bind "$2" /etc/mdevctl.d && shift 2 && exec mdevctl "$@"'
PARENT = "0000:3b:00.0"
KEPT = "b0a0b0a0-0000-4000-8000-00000000a001"
TRANSIENT = "b0a0b0a0-0000-4000-8000-00000000a002"


def mdevctl(mount: str, etc: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", NS_SCRIPT, "sh", mount, etc,
                           *args], capture_output=True, text=True, check=False, timeout=60)


def test_defined_mdevs_survive_a_reboot_as_definitions_only(testbed: Any) -> None:
    require_part("mdevctl", shutil.which("mdevctl") is not None and shutil.which("unshare") is not None,
                 "apt-get install mdevctl (util-linux for unshare)")
    etc = tempfile.mkdtemp(prefix="mdevctl-etc-reboot-")
    os.makedirs(os.path.join(etc, "scripts.d", "callouts"))
    os.makedirs(os.path.join(etc, "scripts.d", "notifiers"))
    try:
        with sim_mount(testbed.mnt_dir, "t4x2") as mnt:
            r = mdevctl(mnt, etc, "define", "--uuid", KEPT, "--parent", PARENT, "--type", "nvidia-231", "--auto")
            assert r.returncode == 0, r.stderr
            assert mdevctl(mnt, etc, "start", "--uuid", KEPT).returncode == 0
            r = mdevctl(mnt, etc, "start", "--uuid", TRANSIENT, "--parent", PARENT, "--type", "nvidia-231")
            assert r.returncode == 0, r.stderr
            assert set(os.listdir(f"{mnt}/sys/bus/mdev/devices")) == {KEPT, TRANSIENT}
            fuse.reboot(mnt, pid_file=mnt + ".pid")
            assert os.listdir(f"{mnt}/sys/bus/mdev/devices") == []           # nothing runs after the boot
            defined = mdevctl(mnt, etc, "list", "--defined").stdout
            assert KEPT in defined and "auto" in defined and TRANSIENT not in defined
            assert mdevctl(mnt, etc, "list").stdout.strip() == ""             # none active
            assert mdevctl(mnt, etc, "start", "--uuid", KEPT).returncode == 0  # the boot step
            assert os.listdir(f"{mnt}/sys/bus/mdev/devices") == [KEPT]
    finally:
        shutil.rmtree(etc)
