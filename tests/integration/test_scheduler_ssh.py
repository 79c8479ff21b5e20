"""The scheduler's registry-key path through the real agent over a real sshd: a materialized simulated tree
as the host's root, no NVML library for it (so NVML's calls are unavailable and ``set`` writes RmPVMRL into
/etc/modprobe.d, pending), one round trip per phase; the file is replaced atomically, never through a link,
and never outside the root."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt import sim
from vgpuvirt.change.scheduler import apply_schedulers
from vgpuvirt.errors import ProvisioningError
from vgpuvirt.services.scheduler.model import SchedulerSetting as S
from vgpuvirt.services.scheduler.service import plan_schedulers, read_schedulers

pytestmark = pytest.mark.integration
GPU0, GPU1 = "0000:3b:00.0", "0000:d8:00.0"


@pytest.fixture
def tree() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="sched-t4x2-", dir=base) as d:
        sim.materialize("t4x2", d)
        (Path(d) / "etc/modprobe.d").mkdir(parents=True)
        (Path(d) / "etc/modprobe.d/blacklist-nouveau.conf").write_text("blacklist nouveau\n")
        yield Path(d)


def test_registry_path_over_ssh(testbed: Any, tree: Path) -> None:
    host = testbed.ssh(sysfs_root=str(tree))
    try:
        before = host.round_trips
        g0, g1 = read_schedulers(host, [GPU0, GPU1])
        assert host.round_trips - before == 1
        assert not g0.nvml and g0.nvml_error                          # no NVML for this root
        assert g0.current == g0.pending == S(policy="best-effort") and g0.current_source == "module parameters"

        plan = plan_schedulers(host, {GPU0: S(policy="fixed-share", timeslice_us=3000)})
        assert [c.via for c in plan.changes] == ["registry"]
        before = host.round_trips
        apply_schedulers(host, plan)
        assert host.round_trips - before == 1
        conf = tree / "etc/modprobe.d/vgpuvirt-scheduler.conf"
        assert 'NVreg_RegistryDwordsPerDevice="pci=0000:3b:00.0;RmPVMRL=0x30011"' in conf.read_text()
        assert stat.S_IMODE(conf.stat().st_mode) == 0o644
        g0, g1 = read_schedulers(host, [GPU0, GPU1])
        assert g0.pending == S(policy="fixed-share", timeslice_us=3000) and g0.differs
        assert g0.current == S(policy="best-effort") and g1.pending == S(policy="best-effort")

        # a second change replaces the file whole, keeping the first GPU's entry; no temporary file is left
        apply_schedulers(host, plan_schedulers(host, {GPU1: S(policy="equal-share")}))
        assert "pci=0000:3b:00.0;RmPVMRL=0x30011;pci=0000:d8:00.0;RmPVMRL=0x01" in conf.read_text()
        assert sorted(p.name for p in conf.parent.iterdir()) == ["blacklist-nouveau.conf", "vgpuvirt-scheduler.conf"]
    finally:
        host.close()


def test_a_link_at_the_file_name_is_replaced_not_followed(testbed: Any, tree: Path) -> None:
    victim = tree / "victim.txt"
    victim.write_text("untouched\n")
    conf = tree / "etc/modprobe.d/vgpuvirt-scheduler.conf"
    conf.symlink_to(victim)
    host = testbed.ssh(sysfs_root=str(tree))
    try:
        apply_schedulers(host, plan_schedulers(host, {GPU0: S(policy="equal-share")}))
    finally:
        host.close()
    assert victim.read_text() == "untouched\n"
    assert not conf.is_symlink() and "RmPVMRL=0x01" in conf.read_text()


def test_a_directory_leading_out_of_the_root_is_refused(testbed: Any, tree: Path) -> None:
    outside = Path(tempfile.mkdtemp(prefix="sched-outside-"))
    try:
        d = tree / "etc/modprobe.d"
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
        d.symlink_to(outside)
        host = testbed.ssh(sysfs_root=str(tree))
        try:
            with pytest.raises(ProvisioningError, match=r"outside the sysfs root .*refused"):
                apply_schedulers(host, plan_schedulers(host, {GPU0: S(policy="equal-share")}))
        finally:
            host.close()
        assert list(outside.iterdir()) == []
    finally:
        for p in outside.iterdir():
            p.unlink()
        outside.rmdir()
