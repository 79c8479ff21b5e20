"""Confinement over real sshd: the remote agent neither writes nor reads through links out of its sysfs root.

The same planted tree as tests/unit/test_agent_confinement.py (vgpuvirt.testing.escapes), reached through
the testbed's loopback sshd, with the resident agent (the default) and with one exec per call.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from conftest import Testbed  # type: ignore[import-not-found]

from vgpuvirt.host import Op
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.testing.escapes import DEV, DIR_TYPE, LEAF_TYPE, MARK, OUT_CLASS, OUT_DEV, Planted, plant_escapes

pytestmark = pytest.mark.integration

UUID = "9b7c6b2e-1f44-4c86-9d5a-2a8b3a3f7c11"


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return plant_escapes(tmp_path)


@pytest.fixture(params=[True, False], ids=["resident", "exec"])
def host(request: pytest.FixtureRequest, testbed: Testbed, planted: Planted, tmp_path: Path) -> SSHHost:
    h: SSHHost = testbed.ssh(sysfs_root=str(planted.root), lock_path=str(tmp_path / "state" / "lock"),
                             resident=request.param)
    return h


@pytest.mark.parametrize(("path", "says"), [
    (f"{LEAF_TYPE}/create", "symbolic link"),
    (f"{DIR_TYPE}/create", "outside the sysfs root"),
    (f"{OUT_DEV}/remove", "outside the sysfs root"),
    (f"{OUT_CLASS}/0000:3b:00.0/vendor", "outside the sysfs root"),
])
def test_a_write_through_a_link_out_of_the_root_is_refused_over_ssh(host: SSHHost, planted: Planted, path: str,
                                                                  says: str) -> None:
    before = planted.outside_files()
    res = host.apply([Op.write(path, UUID)])
    assert not res.ok
    assert res[0].errno in (errno.EXDEV, errno.ELOOP)
    assert says in (res[0].error or "") and path in (res[0].error or ""), res[0].error
    assert planted.outside_files() == before


def test_links_inside_the_root_still_work_over_ssh(host: SSHHost, planted: Planted) -> None:
    assert host.read([f"{DEV}/vendor"]).text(f"{DEV}/vendor") == "0x10de"
    assert host.apply([Op.write(f"{DEV}/mdev_supported_types/nvidia-0/create", UUID)]).ok


def test_reads_do_not_follow_links_out_of_the_root_over_ssh(host: SSHHost) -> None:
    snap = host.read(["/sys/bus/pci/devices/*/vendor", f"{DEV}/mdev_supported_types/*/name",
                      f"{DEV}/mdev_supported_types/*/create", f"{OUT_CLASS}/*/vendor", f"{DIR_TYPE}/name"])
    assert not any(e.text == MARK for e in snap.values()), snap.to_wire()
    assert snap[f"{LEAF_TYPE}/create"].kind == "link"
    assert snap[f"{OUT_DEV}/vendor"].errno == errno.EXDEV
    assert snap[f"{DIR_TYPE}/name"].errno == errno.EXDEV
    assert snap[OUT_CLASS].errno == errno.EXDEV


def test_checks_do_not_look_out_of_the_root_over_ssh(host: SSHHost) -> None:
    res = host.apply([Op.check_int(f"{DIR_TYPE}/available_instances", 1)])
    assert res[0].errno == errno.EXDEV and "outside the sysfs root" in (res[0].error or "")
