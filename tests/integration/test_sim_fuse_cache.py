"""The FUSE mount caches looked-up names (entry_timeout > 0); a change must still show at once.

Every check runs right after the change, while the kernel still holds the dentries of the names it
looked up before it: a removed mdev must vanish for stat, lstat, listdir, open, readlink and a batched
read (locally and through sshd), a created one must appear, and a rebound driver's link must point at
the new driver.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]

from vgpuvirt.host.base import Op
from vgpuvirt.host.local import LocalHost

pytestmark = pytest.mark.integration

GPU0 = "0000:3b:00.0"
GPU0_DIR = f"/sys/devices/pci0000:3a/0000:3a:00.0/{GPU0}"
TYPES = f"/sys/class/mdev_bus/{GPU0}/mdev_supported_types"
UUID = "c0ffee00-0000-4000-8000-000000000042"
LINK = f"/sys/bus/mdev/devices/{UUID}"
MDEV_DIR = f"{GPU0_DIR}/{UUID}"
PATHS = [LINK, MDEV_DIR, f"{MDEV_DIR}/uevent", f"{MDEV_DIR}/mdev_type", f"{LINK}/mdev_type", f"{LINK}/uevent"]


@pytest.fixture
def mount(testbed: Any) -> Iterator[str]:
    with sim_mount(testbed.mnt_dir, "t4x2") as d:
        yield d


def _errno_of(fn: Any, *args: Any) -> int | None:
    try:
        fn(*args)
    except OSError as exc:
        return exc.errno
    return None


def _touch_all(mnt: str) -> None:
    """Look up (and so cache) every name of the mdev, through the link and through its real directory."""
    assert os.path.islink(mnt + LINK)
    assert os.readlink(mnt + f"{LINK}/mdev_type") == "../mdev_supported_types/nvidia-231"
    for p in (MDEV_DIR, f"{LINK}"):
        assert "remove" in os.listdir(mnt + p)
        with open(mnt + f"{p}/uevent", encoding="ascii") as fh:
            assert "MDEV_TYPE=nvidia-231" in fh.read()
        os.stat(mnt + f"{p}/mdev_type")


def test_removed_mdev_vanishes_at_once_for_every_call(mount: str, tmp_path: Any) -> None:
    host = LocalHost(mount, lock_path=str(tmp_path / "lock"))
    assert host.apply([Op.write(f"{TYPES}/nvidia-231/create", UUID)]).ok
    _touch_all(mount)
    before = host.read(PATHS)
    assert set(before) == set(PATHS)

    assert host.apply([Op.write(f"{LINK}/remove", "1")]).ok
    assert not os.path.lexists(mount + LINK)
    for p in PATHS:
        assert _errno_of(os.stat, mount + p) == errno.ENOENT, p
        assert _errno_of(os.lstat, mount + p) == errno.ENOENT, p
        assert _errno_of(os.open, mount + p, os.O_RDONLY) == errno.ENOENT, p
    assert _errno_of(os.readlink, mount + LINK) == errno.ENOENT
    assert _errno_of(os.listdir, mount + MDEV_DIR) == errno.ENOENT
    assert UUID not in os.listdir(mount + "/sys/bus/mdev/devices")
    assert UUID not in os.listdir(mount + GPU0_DIR)
    # The agent's read: every path absent (not an error entry), and the globbed view agrees.
    after = host.read([*PATHS, "/sys/bus/mdev/devices/*", f"{GPU0_DIR}/*/uevent",
                       f"{TYPES}/nvidia-231/available_instances"])
    assert [p for p in after if UUID in p] == []
    assert after.int(f"{TYPES}/nvidia-231/available_instances") == 8

    # Created again, on another type: the cached names now lead to the new mdev.
    assert host.apply([Op.write(f"{TYPES}/nvidia-222/create", UUID)]).ok
    assert os.readlink(mount + f"{LINK}/mdev_type") == "../mdev_supported_types/nvidia-222"
    with open(mount + f"{MDEV_DIR}/uevent", encoding="ascii") as fh:
        assert "MDEV_TYPE=nvidia-222" in fh.read()
    again = host.read(PATHS)
    assert set(again) == set(PATHS) and again[f"{LINK}/mdev_type"].target == "../mdev_supported_types/nvidia-222"


def test_rebound_driver_link_follows_at_once(mount: str, tmp_path: Any) -> None:
    host = LocalHost(mount, lock_path=str(tmp_path / "lock"))
    drv = f"/sys/bus/pci/devices/{GPU0}/driver"
    assert os.readlink(mount + drv).endswith("/drivers/nvidia")
    assert os.path.isdir(mount + f"{drv}/")
    res = host.apply([Op.write(f"/sys/bus/pci/devices/{GPU0}/driver_override", "vfio-pci"),
                      Op.write("/sys/bus/pci/drivers/nvidia/unbind", GPU0)])
    assert res.ok
    assert _errno_of(os.readlink, mount + drv) == errno.ENOENT
    assert _errno_of(os.stat, mount + f"{drv}/unbind") == errno.ENOENT
    assert drv not in host.read([drv, f"/sys/bus/pci/devices/{GPU0}/driver/*"])
    assert host.apply([Op.write("/sys/bus/pci/drivers_probe", GPU0)]).ok
    assert os.readlink(mount + drv).endswith("/drivers/vfio-pci")
    assert GPU0 in os.listdir(mount + f"{drv}/")
    assert host.read([drv])[drv].target is not None
    assert str(host.read([drv])[drv].target).endswith("/drivers/vfio-pci")


def test_create_and_remove_seen_at_once_through_sshd(testbed: Any, mount: str) -> None:
    host = testbed.ssh(sysfs_root=mount)
    try:
        assert host.apply([Op.write(f"{TYPES}/nvidia-231/create", UUID)]).ok
        assert host.run(["cat", f"{mount}{LINK}/uevent"]).stdout.endswith("MDEV_TYPE=nvidia-231\n")
        assert host.run(["stat", "-c", "%F", f"{mount}{LINK}"]).stdout.strip() == "symbolic link"
        assert host.run(["ls", f"{mount}{MDEV_DIR}"]).exit_code == 0
        assert set(host.read(PATHS)) == set(PATHS)
        assert host.apply([Op.write(f"{LINK}/remove", "1")]).ok
        for p in PATHS:
            assert host.run(["stat", f"{mount}{p}"]).exit_code != 0, p
            assert host.run(["cat", f"{mount}{p}"]).exit_code != 0, p
        assert host.run(["readlink", f"{mount}{LINK}"]).exit_code != 0
        ls = host.run(["ls", f"{mount}{MDEV_DIR}"])
        assert ls.exit_code != 0 and "No such file or directory" in ls.stderr
        assert UUID not in host.run(["ls", f"{mount}/sys/bus/mdev/devices"]).stdout
        snap = host.read([*PATHS, "/sys/bus/mdev/devices/*"])
        assert [p for p in snap if UUID in p] == []
        assert host.apply([Op.write(f"{TYPES}/nvidia-231/create", UUID)]).ok
        assert host.run(["cat", f"{mount}{MDEV_DIR}/uevent"]).exit_code == 0
        assert set(host.read(PATHS)) == set(PATHS)
    finally:
        host.close()
