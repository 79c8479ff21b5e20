"""A materialized tree reads exactly like the live simulator; the CLI drives both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.host.local import LocalHost
from vgpuvirt.sim import SimHost, materialize

PATTERNS = ["/sys/bus/pci/devices/*", "/sys/bus/pci/devices/*/*", "/sys/bus/pci/devices/*/nvidia/*",
            "/sys/class/mdev_bus/*", "/sys/class/mdev_bus/*/mdev_supported_types/*/*",
            "/sys/kernel/iommu_groups/*/devices/*", "/sys/devices/system/node/node*/cpulist",
            "/sys/bus/mdev/devices/*"]


@pytest.mark.parametrize("profile", ["t4x2", "l40s-vgpu17", "gvtg", "desktop", "a100-sriov"])
def test_materialized_tree_reads_like_the_simulator(tmp_path: Path, profile: str) -> None:
    n = materialize(profile, str(tmp_path))
    assert n > 50
    live = SimHost.from_profile(profile).read(PATTERNS)
    static = LocalHost(str(tmp_path), lock_path=str(tmp_path / "lock")).read(PATTERNS)
    # write-only attributes: the simulator refuses the read (EACCES), root reads the empty file
    wo = {p for p, e in live.items() if e.kind == "error"}
    assert set(live) == set(static)
    for p in set(live) - wo:
        assert live[p] == static[p], p
    assert all(static[p].text == "" for p in wo)
    assert os.stat(tmp_path / "sys/bus/pci/drivers_probe").st_mode & 0o777 == 0o200


def test_cli_sim_list_show_materialize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "sim", "list"]) == 0
    names = [r["name"] for r in json.loads(capsys.readouterr().out)]
    assert "t4x2" in names and "large" in names
    assert main(["--json", "sim", "show", "a100-sriov"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["gpus"][0]["mig_enabled"] is True and info["mdev_parents"] == 40
    assert main(["--json", "sim", "materialize", "t4x2", str(tmp_path / "t")]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] > 50
    assert (tmp_path / "t/sys/class/mdev_bus/0000:3b:00.0").is_symlink()
    assert main(["sim", "materialize", "t4x2", str(tmp_path / "t")]) == 2     # not empty: refused
    assert "expected an empty or absent directory" in capsys.readouterr().err
    assert main(["sim", "show", "nonesuch"]) == 2
    assert "no such profile" in capsys.readouterr().err


def test_sim_host_from_the_cli_host_option(capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.hosts import open_host
    host = open_host("sim:gvtg")
    assert isinstance(host, SimHost) and host.name == "sim:gvtg"
