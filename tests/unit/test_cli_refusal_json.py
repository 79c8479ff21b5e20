"""Refusals carry numbers (issue 28 item 8): with ``--json`` a refusal prints an error object on stdout (what
fits, where, why) as well as the one line on stderr, and ``NoCapacity`` has the counts."""

from __future__ import annotations

import json

import pytest

from vgpuvirt.cli import main
from vgpuvirt.errors import NoCapacity
from vgpuvirt.provision import VgpuRequest, VmRequest, plan
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost

pytest.importorskip("libvirt")


def test_no_capacity_counts_the_vms_that_fit() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    with pytest.raises(NoCapacity) as info:
        plan([inv], VmRequest.pool("w28c", 40, gpu=VgpuRequest(type="nvidia-231"), options={"virtio_nics": []}))
    assert (info.value.fit, info.value.wanted) == (16, 40)
    assert "(16 of 40 VMs fit)" in str(info.value)
    assert info.value.to_dict()["fit"] == 16


def test_json_refusal_prints_an_error_object_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--count", "40", "--gpu", "nvidia-231",
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["error"] == "no-capacity"
    assert (doc["fit"], doc["wanted"], doc["host"]) == (16, 40, "sim:t4x2")
    assert "(16 of 40 VMs fit)" in doc["message"]
    assert err.count("\n") == 1 and err.startswith("vgpuvirt: error: ")


def test_other_refusals_give_an_object_too(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--gpu", "nvidia-999", "--json"])
    out, err = capsys.readouterr()
    assert rc != 0 and err.count("\n") == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["message"] and doc["error"]
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--gpu", "nvidia-999"])
    assert capsys.readouterr().out == ""                 # without --json stdout stays empty
