"""Confinement: nothing the agent reads or writes resolves outside the host's sysfs root.

The tree (vgpuvirt.testing.escapes) has links leading out of the root at every level; links that stay
inside it (as real sysfs is full of) keep working. The same checks run over real sshd in
tests/integration/test_confinement_ssh.py.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vgpuvirt.host import LocalHost, Op
from vgpuvirt.testing.escapes import DEV, DIR_TYPE, LEAF_TYPE, MARK, OUT_CLASS, OUT_DEV, Planted, plant_escapes

UUID = "9b7c6b2e-1f44-4c86-9d5a-2a8b3a3f7c11"


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return plant_escapes(tmp_path)


@pytest.fixture
def host(planted: Planted, tmp_path: Path) -> LocalHost:
    return LocalHost(str(planted.root), lock_path=str(tmp_path / "state" / "lock"))


def test_links_inside_the_root_still_work(host: LocalHost, planted: Planted) -> None:
    snap = host.read([f"{DEV}/vendor", f"{DEV}/mdev_supported_types/*/name"])
    assert snap.text(f"{DEV}/vendor") == "0x10de"            # through /sys/bus/pci/devices/X -> ../../../devices/...
    assert snap.text(f"{DEV}/mdev_supported_types/nvidia-0/name") == "GRID nvidia-0"
    assert host.apply([Op.write(f"{DEV}/mdev_supported_types/nvidia-0/create", UUID)]).ok
    assert (planted.root / f"sys/devices/pci0000:00/{DEV.rsplit('/', 1)[1]}/mdev_supported_types/nvidia-0/create"
            ).read_text() == UUID


def test_a_root_that_is_itself_a_link_still_works(planted: Planted, tmp_path: Path) -> None:
    link = tmp_path / "rootlink"
    link.symlink_to(planted.root)
    h = LocalHost(str(link), lock_path=str(tmp_path / "state" / "lock"))
    assert h.read([f"{DEV}/vendor"]).text(f"{DEV}/vendor") == "0x10de"
    assert h.apply([Op.write(f"{DEV}/mdev_supported_types/nvidia-0/create", UUID)]).ok


@pytest.mark.parametrize(("path", "says"), [
    (f"{LEAF_TYPE}/create", "symbolic link"),            # the final component is a link out
    (f"{DIR_TYPE}/create", "outside the sysfs root"),      # a directory component is a link out
    (f"{OUT_DEV}/remove", "outside the sysfs root"),       # a device directory
    (f"{OUT_CLASS}/0000:3b:00.0/vendor", "outside the sysfs root"),   # high up, absolute target
])
def test_a_write_through_a_link_out_of_the_root_is_refused(host: LocalHost, planted: Planted, path: str,
                                                         says: str) -> None:
    before = planted.outside_files()
    res = host.apply([Op.write(path, UUID)])
    assert not res.ok
    assert res[0].errno in (errno.EXDEV, errno.ELOOP)
    assert says in (res[0].error or ""), res[0].error
    assert path in (res[0].error or "")
    assert planted.outside_files() == before


def test_a_write_through_a_final_link_inside_the_root_is_refused_too(host: LocalHost, planted: Planted) -> None:
    inside = planted.root / f"sys/devices/pci0000:00/{DEV.rsplit('/', 1)[1]}/mdev_supported_types/nvidia-0"
    (inside / "alias").symlink_to("create")
    res = host.apply([Op.write(f"{DEV}/mdev_supported_types/nvidia-0/alias", UUID)])
    assert res[0].errno == errno.ELOOP and "symbolic link" in (res[0].error or "")
    assert (inside / "create").read_text() == ""


def test_reads_do_not_follow_links_out_of_the_root(host: LocalHost, planted: Planted) -> None:
    snap = host.read(["/sys/bus/pci/devices/*/vendor", f"{DEV}/mdev_supported_types/*/name",
                      f"{DEV}/mdev_supported_types/*/create", f"{OUT_CLASS}/*/vendor", f"{DIR_TYPE}/name"])
    assert not any(e.text == MARK for e in snap.values()), snap.to_wire()
    assert snap.text(f"{DEV}/vendor") == "0x10de"
    assert snap[f"{LEAF_TYPE}/create"].kind == "link"      # a final link is reported, never opened
    assert snap[f"{OUT_DEV}/vendor"].errno == errno.EXDEV
    assert snap[f"{DIR_TYPE}/name"].errno == errno.EXDEV
    assert snap[OUT_CLASS].errno == errno.EXDEV            # the listing of a directory out of the root


@pytest.mark.parametrize("op", [
    Op.check_int(f"{DIR_TYPE}/available_instances", 1),
    Op.wait(f"{OUT_DEV}/vendor", "equals", MARK.strip(), timeout=0.05),
    Op.check_absent(f"{DIR_TYPE}/create"),
])
def test_checks_and_waits_do_not_look_out_of_the_root(host: LocalHost, op: Op) -> None:
    res = host.apply([op])
    assert not res.ok
    assert res[0].errno == errno.EXDEV and "outside the sysfs root" in (res[0].error or "")


def test_check_int_does_not_follow_a_final_link_out(host: LocalHost, planted: Planted) -> None:
    (planted.outside / "four").write_text("4\n")
    inside = planted.root / f"sys/devices/pci0000:00/{DEV.rsplit('/', 1)[1]}/mdev_supported_types/nvidia-0"
    (inside / "available_instances").unlink()
    os.symlink(planted.outside / "four", inside / "available_instances")
    res = host.apply([Op.check_int(f"{DEV}/mdev_supported_types/nvidia-0/available_instances", 1)])
    assert not res.ok and res[0].value is None


def test_a_directory_swapped_for_a_link_during_the_batch_is_caught_at_the_write(host: LocalHost,
                                                                                planted: Planted) -> None:
    # The check_int resolves the type directory; an exec of the same batch then swaps it for a link out of
    # the root (as a racing attacker would): the write opens the directory and sees where it really is.
    typedir = planted.root / f"sys/devices/pci0000:00/{DEV.rsplit('/', 1)[1]}/mdev_supported_types/nvidia-0"
    swap = f"mv '{typedir}' '{typedir}.old' && ln -s '{planted.outside / 'type'}' '{typedir}'"
    before = planted.outside_files()
    res = host.apply([Op.check_int(f"{DEV}/mdev_supported_types/nvidia-0/available_instances", 1),
                      Op.exec(["sh", "-c", swap]),
                      Op.write(f"{DEV}/mdev_supported_types/nvidia-0/create", UUID)])
    assert [r.ok for r in res] == [True, True, False]
    assert res[2].errno == errno.EXDEV and "outside the sysfs root" in (res[2].error or "")
    assert planted.outside_files() == before
