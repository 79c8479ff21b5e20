"""``vgpuvirt mig`` on simulated hosts: show, dry-run, a change with its per-item status, bad input in one line."""

from __future__ import annotations

import json

import pytest

from vgpuvirt.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_show_lists_mode_profiles_and_instances(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "show")
    assert rc == 0 and out.splitlines()[0] == "GPU 0 0000:31:00.0 NVIDIA A30: MIG Enabled"
    assert "  profile 2g.12gb      id  5  free 1/2  placements {0,2}:2" in out
    assert "  GI  4 1g.6gb       at 1:1  compute instances: none" in out
    rc, out, _ = run(capsys, "--host", "sim:a100-sriov", "--json", "mig", "show", "0000:65:00.0")
    doc = json.loads(out)
    assert rc == 0 and [g["mig_mode"] for g in doc["gpus"]] == [{"current": "Disabled", "pending": "Disabled"}]


def test_create_and_destroy(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "create", "0", "2g.12gb:2", "-C", "--dry-run")
    assert rc == 0 and out == "would run: nvidia-smi mig -i 0 -cgi 2g.12gb:2 -C   # GPU 0: create GPU instance(s) " \
                              "2g.12gb with compute instances\n"
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "create", "0", "2g.12gb", "-C")
    assert rc == 0 and out.startswith("ok: GPU 0: create GPU instance(s) 2g.12gb with compute instances: "
                                      "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 2g.12gb")
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "create", "0", "4g.24gb")
    assert rc == 1 and "Insufficient Resources" in out
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "destroy", "0")
    assert rc == 0 and out.count("ok: GPU 0: destroy GPU instance(s)") == 2


def test_mode_change_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:a100-sriov", "mig", "enable", "1")
    assert rc == 0 and out == "ok: GPU 1: MIG mode on: Enabled MIG Mode for GPU 00000000:65:00.0\n"
    rc, out, _ = run(capsys, "--host", "sim:a100-sriov", "mig", "disable", "0")
    assert rc == 1 and out == ("failed: GPU 0: MIG mode off: Unable to disable MIG Mode for GPU 00000000:17:00.0: "
                               "In use by another client\n")              # GPU instances exist
    for argv, word in ((["create", "0", "1g.10gb;reboot"], "MIG profile"), (["create", "1", "1g.10gb"], "MIG mode"),
                       (["destroy", "0", "--gi", "9"], "--gi"), (["show", "7"], "GPU"),
                       (["create", "0", "1g.10gb:x"], "PROFILE[:START]")):
        rc, out, err = run(capsys, "--host", "sim:a100-sriov", "mig", *argv)
        assert rc == 2 and out == "" and len(err.splitlines()) == 1 and word in err, (argv, err)
