"""The simulated vGPU manager package: installed by a file in the simulated package database, loaded by the next
reboot (as a real host loads a new vGPU manager only once the old module is gone); the inventory and NVML's
migration answers report the loaded version."""

from __future__ import annotations

import pytest

from vgpuvirt.host.base import Op
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.sim.fs_etc import DRIVER_FILE, check_driver_version


def test_an_installed_driver_loads_at_the_next_reboot_and_stays() -> None:
    h = SimHost.from_profile("t4x2")
    assert inventory(h, use_nvml=False).nvidia_driver_version == "550.90.05"
    (r,) = h.apply([Op.replace_file(DRIVER_FILE, "550.127.05\n")])
    assert r.ok
    assert h.read([DRIVER_FILE]).text(DRIVER_FILE) == "550.127.05"
    assert inventory(h, use_nvml=False).nvidia_driver_version == "550.90.05"     # not loaded yet
    h.reboot()
    assert inventory(h, use_nvml=False).nvidia_driver_version == "550.127.05"
    h.reboot()
    assert h.model.driver_version == "550.127.05"                                  # the package stays installed


@pytest.mark.parametrize("text", ["", "x", "1; rm -rf /", "550", "550.90.05.1.2", "550.90.05\nmore"])
def test_a_version_that_is_none_is_refused_and_changes_nothing(text: str) -> None:
    h = SimHost.from_profile("t4x2")
    with pytest.raises(ValueError, match="not a driver version"):
        check_driver_version(text)
    (r,) = h.apply([Op.replace_file(DRIVER_FILE, text)])
    assert not r.ok and r.errno == 22
    h.reboot()
    assert h.model.installed_driver is None and h.model.driver_version == "550.90.05"
