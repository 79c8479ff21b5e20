"""`vgpuvirt sim reboot` on a live FUSE mount: seen through the real sshd, the mdev created before is gone, the
VFs are gone, and /proc/sys/kernel/random/boot_id changed."""

from __future__ import annotations

from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]

from vgpuvirt.cli import main

pytestmark = pytest.mark.integration

VF = "0000:17:00.4"
UUID = "73269d0f-b2c9-438d-8f28-f9e4bc6c6990"


def test_reboot_a_mounted_host(testbed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with sim_mount(testbed.mnt_dir, "a100-sriov") as mnt:
        host = testbed.ssh(sysfs_root=mnt)
        try:
            create = f"{mnt}/sys/bus/pci/devices/{VF}/mdev_supported_types/nvidia-700/create"
            assert host.run(["bash", "-c", 'echo "$1" > "$2"', "bash", UUID, create]).exit_code == 0
            assert host.run(["ls", f"{mnt}/sys/bus/mdev/devices"]).stdout == f"{UUID}\n"
            before = host.run(["cat", f"{mnt}/proc/sys/kernel/random/boot_id"]).stdout
            assert main(["sim", "reboot", mnt, "--pid-file", mnt + ".pid"]) == 0
            assert "rebooted the simulated host" in capsys.readouterr().out
            assert host.run(["cat", f"{mnt}/proc/sys/kernel/random/boot_id"]).stdout != before
            assert host.run(["ls", f"{mnt}/sys/bus/mdev/devices"]).stdout == ""
            numvfs = host.run(["cat", f"{mnt}/sys/bus/pci/devices/0000:17:00.0/sriov_numvfs"]).stdout
            assert numvfs == "0\n"
            assert host.run(["test", "-e", f"{mnt}/sys/bus/pci/devices/{VF}"]).exit_code == 1
        finally:
            host.close()
    assert main(["sim", "reboot", "/nonexistent", "--pid-file", "/nonexistent.pid"]) == 2


def test_install_driver_then_reboot_loads_the_new_vgpu_manager(testbed: Any, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    """A simulated package change: written on disk at once, reported by the driver only after the reboot."""
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt:
        host = testbed.ssh(sysfs_root=mnt)
        try:
            def loaded() -> str:
                return host.run(["cat", f"{mnt}/sys/module/nvidia/version"]).stdout.strip()

            assert loaded() == "550.90.05"
            assert main(["sim", "install-driver", mnt, "550.127.05"]) == 0
            assert "loads at the next `sim reboot`" in capsys.readouterr().out
            assert host.run(["cat", f"{mnt}/var/lib/vgpuvirt-sim/driver_version"]).stdout == "550.127.05\n"
            assert loaded() == "550.90.05"                       # the running driver is the old one until then
            assert main(["sim", "reboot", mnt, "--pid-file", mnt + ".pid"]) == 0
            assert loaded() == "550.127.05"
            assert "550.127.05" in host.run(["cat", f"{mnt}/proc/driver/nvidia/version"]).stdout
            # a version that is not one is refused, on the CLI and by the simulated host itself
            assert main(["sim", "install-driver", mnt, "1; reboot"]) == 2
            bad = host.run(["bash", "-c", 'echo x > "$1.new" && mv "$1.new" "$1"', "bash",
                            f"{mnt}/var/lib/vgpuvirt-sim/driver_version"])
            assert bad.exit_code != 0
            assert host.run(["cat", f"{mnt}/var/lib/vgpuvirt-sim/driver_version"]).stdout == "550.127.05\n"
        finally:
            host.close()
