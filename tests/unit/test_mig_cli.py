"""``vgpuvirt mig`` on simulated hosts: show, dry-run, a change in the runner's one report format (a failure with
what the rollback did), bad input in one line."""

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
    assert rc == 0 and out == ("would: create GPU instances 2g.12gb on 0000:31:00.0\n"
                               "  exec nvidia-smi mig -i 00000000:31:00.0 -cgi 2g.12gb:2 -C\n")
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "create", "0", "2g.12gb", "-C")
    assert rc == 0 and out == "done: sim:a30-mig: create GPU instances 2g.12gb on 0000:31:00.0\n"
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "mig", "create", "0", "4g.24gb")
    assert rc == 1 and out.startswith("failed: ") and "Insufficient Resources" in out
    rc, out, _ = run(capsys, "--host", "sim:a30-mig", "--json", "mig", "destroy", "0")
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] and [d.split(": ")[1] for d in doc["done"]] == [   # each run: a fresh sim host
        "destroy GPU instance 3 (1g.6gb) on 0000:31:00.0", "destroy GPU instance 4 (1g.6gb) on 0000:31:00.0"]
    assert doc["round_trips"] == {"sim:a30-mig": 1}


def test_mode_change_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:a100-sriov", "mig", "enable", "1")
    assert rc == 0 and out == "done: sim:a100-sriov: turn MIG mode on on 0000:65:00.0\n"
    rc, out, _ = run(capsys, "--host", "sim:a100-sriov", "mig", "disable", "0")
    assert rc == 1 and out == ("failed: sim:a100-sriov: 0000:17:00.0: GPU 0: MIG mode off failed (exit 19): Unable to "
                               "disable MIG Mode for GPU 00000000:17:00.0: In use by another client\n")  # GIs exist
    for argv, word in ((["create", "0", "1g.10gb;reboot"], "MIG profile"), (["create", "1", "1g.10gb"], "MIG mode"),
                       (["destroy", "0", "--gi", "9"], "--gi"), (["show", "7"], "GPU"),
                       (["create", "0", "1g.10gb:x"], "PROFILE[:START]")):
        rc, out, err = run(capsys, "--host", "sim:a100-sriov", "mig", *argv)
        assert rc == 2 and out == "" and len(err.splitlines()) == 1 and word in err, (argv, err)


def test_enable_on_a_busy_gpu_reports_the_change_pending_a_reset(capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile("a100-sriov")
    host.model.gpus["0000:65:00.0"].processes = 1           # a process holds the GPU: no reset now
    from unittest.mock import patch
    with patch("vgpuvirt.cli.context.Context.host", return_value=host):
        rc, out, _ = run(capsys, "--host", "sim:a100-sriov", "--json", "mig", "enable", "1")
    doc = json.loads(out)
    assert rc == 0 and doc["done"] == ["sim:a100-sriov: turn MIG mode on on 0000:65:00.0"]
    assert doc["pending_reset"] == ["sim:a100-sriov: MIG mode of GPU 1 0000:65:00.0 is Enabled after a GPU reset or "
                                    "reboot (now Disabled)"]


def test_a_failed_last_step_is_rolled_back_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """`mig destroy` of both GPU instances; nvidia-smi refuses the last: the first is made again, as it was."""
    from unittest.mock import patch

    from host_state import diff, fail_last, host_state

    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile("a30-mig")
    start = host_state(host)
    with patch("vgpuvirt.cli.context.Context.host", return_value=host), \
            fail_last(host, lambda op: op.op == "exec" and "-dgi" in op.argv):
        rc, out, _ = run(capsys, "--host", "sim:a30-mig", "--json", "mig", "destroy", "0")
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"] and "injected failure" in doc["error"]
    assert doc["completed"] == ["sim:a30-mig: destroy GPU instance 3 (1g.6gb) on 0000:31:00.0"]
    assert doc["rollback"] == ["sim:a30-mig: created GPU instance 1g.6gb on 0000:31:00.0 at placement 0 again"]
    assert diff(start, host_state(host)) == []
