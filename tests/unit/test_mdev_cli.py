"""The lifecycle subcommands (mdev, sriov, iommu, gc) on simulated hosts: output contracts and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lifecycle_doubles import domain_xml

from vgpuvirt.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_mdev_create_dry_run_json_is_only_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:t4x2", "mdev", "create", "--parent", "0000:d8:00.0",
                     "--type", "nvidia-231", "--uuid", "11111111-2222-4333-8444-555555555555", "--dry-run", "--json")
    data = json.loads(out)
    assert rc == 0 and data["changed"] and data["dry_run"] and data["action"] == "mdev.create"
    assert data["ops"][2] == ("write '11111111-2222-4333-8444-555555555555' > "
                              "/sys/class/mdev_bus/0000:d8:00.0/mdev_supported_types/nvidia-231/create")


def test_bad_input_at_the_cli_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--host", "sim:t4x2", "mdev", "create", "--parent", "0000:d8:00.0;reboot",
                       "--type", "nvidia-231")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "invalid PCI address" in err


def test_persistent_without_mdevctl_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "--host", "sim:t4x2", "mdev", "create", "--parent", "0000:d8:00.0", "--type",
                     "nvidia-231", "--persist", "persistent")
    assert rc == 1 and "mdevctl" in err and "Traceback" not in err


def test_iommu_check_exit_status_follows_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:desktop", "iommu", "check", "0000:01:00.0", "--json")
    assert rc == 0 and json.loads(out)["assignable"]
    rc, out, _ = run(capsys, "--host", "sim:desktop", "--json", "iommu", "check", "0000:02:00.0")
    rep = json.loads(out)
    assert rc == 1 and not rep["assignable"] and rep["reasons"]


def test_iommu_prepare_writes_a_record_release_accepts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rec = tmp_path / "rec.json"
    rc, out, _ = run(capsys, "--host", "sim:desktop", "iommu", "prepare", "0000:01:00.0", "--record", str(rec),
                     "--json")
    assert rc == 0 and json.loads(out)["record"]["bindings"][0]["original_driver"] == "nvidia"
    assert json.loads(rec.read_text())["bindings"][1]["original_driver"] == "snd_hda_intel"
    # a fresh simulated host is already on the original drivers: release is a no-op
    rc, out, _ = run(capsys, "--host", "sim:desktop", "iommu", "release", "--record", str(rec), "--json")
    assert rc == 0 and json.loads(out)["changed"] is False


def test_sriov_and_gc(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = run(capsys, "--host", "sim:desktop", "sriov", "enable", "0000:05:00.0", "-n", "3", "--dry-run")
    assert rc == 0 and "would change" in out and "sriov_numvfs" in out
    rc, out, _ = run(capsys, "--host", "sim:l40s-vgpu17", "--json", "sriov", "show", "0000:3d:00.0")
    assert rc == 0 and json.loads(out)[0]["sriov_numvfs"] == 16
    rc, _, err = run(capsys, "--host", "sim:mixed", "gc")
    assert rc == 2 and "--connect" in err
    dom = tmp_path / "vm1.xml"
    dom.write_text(domain_xml("vm1"))
    rc, out, _ = run(capsys, "--host", "sim:mixed", "--json", "gc", "--domain-xml", str(dom))
    assert rc == 0 and json.loads(out)["dry_run"] is True


def test_an_empty_listing_says_so_on_stderr_and_keeps_stdout_empty(capsys: pytest.CaptureFixture[str]) -> None:
    # the real H100 (a guest, no SR-IOV, no mdev) printed nothing at all for both
    rc, out, err = run(capsys, "--host", "sim:h100-sxm5", "sriov", "show")
    assert (rc, out) == (0, "") and "no SR-IOV physical function on this host" in err
    rc, out, err = run(capsys, "--host", "sim:h100-sxm5", "mdev", "list", "--defined")
    assert (rc, out) == (0, "") and err == "no mediated device, active or defined\n"
    rc, out, err = run(capsys, "--host", "sim:h100-sxm5", "--json", "mdev", "list")
    assert (rc, json.loads(out), err) == (0, [], "")
    rc, out, err = run(capsys, "--host", "sim:a10-sriov", "sriov", "show")     # a host with a PF: no note
    assert rc == 0 and "VFs" in out and err == ""
