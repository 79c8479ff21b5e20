"""The live FUSE simulator through the real sshd: shell writes and reads behave as on a real host."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]

from vgpuvirt.host.base import Op
from vgpuvirt.host.local import LocalHost

pytestmark = pytest.mark.integration


GPU0 = "0000:3b:00.0"
TYPES = f"/sys/class/mdev_bus/{GPU0}/mdev_supported_types"
UUID = "a1b2c3d4-0000-4000-8000-000000000001"
# Fixed script (bash: its echo reports the errno text, dash says "I/O error" for any failure);
# the paths and the UUID travel as argv ($1, $2), never spliced into it.
ECHO_TO = 'echo "$1" > "$2"'


@pytest.fixture
def mount(testbed: Any) -> Iterator[str]:
    with sim_mount(testbed.mnt_dir, "t4x2") as d:
        yield d


def test_echo_uuid_to_create_over_ssh(testbed: Any, mount: str) -> None:
    host = testbed.ssh(sysfs_root=mount)
    try:
        cat = host.run(["cat", f"{mount}{TYPES}/nvidia-231/available_instances"])
        assert cat.exit_code == 0 and cat.stdout == "8\n"
        r = host.run(["bash", "-c", ECHO_TO, "bash", UUID, f"{mount}{TYPES}/nvidia-231/create"])
        assert r.exit_code == 0, r.stderr
        assert host.run(["cat", f"{mount}{TYPES}/nvidia-231/available_instances"]).stdout == "7\n"
        assert host.run(["cat", f"{mount}{TYPES}/nvidia-232/available_instances"]).stdout == "0\n"
        ls = host.run(["ls", f"{mount}/sys/bus/mdev/devices"])
        assert ls.stdout.split() == [UUID]
        real = host.run(["readlink", "-f", f"{mount}/sys/bus/mdev/devices/{UUID}/mdev_type"])
        want = f"{mount}/sys/devices/pci0000:3a/0000:3a:00.0/{GPU0}/mdev_supported_types/nvidia-231"
        assert real.stdout.strip() == want
        dup = host.run(["bash", "-c", ECHO_TO, "bash", UUID, f"{mount}{TYPES}/nvidia-231/create"])
        assert dup.exit_code != 0 and "File exists" in dup.stderr
        bad = host.run(["bash", "-c", ECHO_TO, "bash", "not-a-uuid", f"{mount}{TYPES}/nvidia-231/create"])
        assert bad.exit_code != 0 and "Invalid argument" in bad.stderr
        ro = host.run(["cat", f"{mount}{TYPES}/nvidia-231/create"])
        assert ro.exit_code != 0 and "Permission denied" in ro.stderr
        gone = host.run(["bash", "-c", ECHO_TO, "bash", "1", f"{mount}/sys/bus/mdev/devices/{UUID}/remove"])
        assert gone.exit_code == 0, gone.stderr
        assert host.run(["cat", f"{mount}{TYPES}/nvidia-222/available_instances"]).stdout == "16\n"
    finally:
        host.close()


def test_batched_apply_over_ssh_reports_kernel_errnos(testbed: Any, mount: str) -> None:
    host = testbed.ssh(sysfs_root=mount)
    try:
        res = host.apply([Op.check_int(f"{TYPES}/nvidia-231/available_instances", 1),
                          Op.write(f"{TYPES}/nvidia-231/create", UUID),
                          Op.write(f"{TYPES}/nvidia-231/create", UUID),
                          Op.write(f"{TYPES}/nvidia-231/create", "zz"),
                          Op.write(f"/sys/bus/mdev/devices/{UUID}/remove", "maybe")],
                         on_error="continue", lock=False, reads_after=[f"{TYPES}/*/available_instances"])
        assert [r.ok for r in res] == [True, True, False, False, False]
        assert [r.errno for r in res][2:] == [errno.EEXIST, errno.EINVAL, errno.EINVAL]
        assert res.after.int(f"{TYPES}/nvidia-231/available_instances") == 7
        snap = host.read([f"{TYPES}/nvidia-231/create", "/sys/bus/mdev/devices/*"])
        assert snap[f"{TYPES}/nvidia-231/create"].errno == errno.EACCES
        assert host.round_trips == 2
    finally:
        host.close()


def test_one_state_for_every_process_using_the_mount(testbed: Any, mount: str, tmp_path: Any) -> None:
    local = LocalHost(mount, lock_path=str(tmp_path / "lock"))
    assert local.apply([Op.write(f"{TYPES}/nvidia-233/create", UUID)]).ok
    host = testbed.ssh(sysfs_root=mount)
    try:
        snap = host.read([f"{TYPES}/*/available_instances", "/sys/bus/mdev/devices/*"])
        assert snap.int(f"{TYPES}/nvidia-233/available_instances") == 1
        assert snap.has(f"/sys/bus/mdev/devices/{UUID}")
    finally:
        host.close()
