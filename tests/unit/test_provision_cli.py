"""vgpuvirt plan / provision / teardown on the embedded default (sim host, libvirt test driver)."""

from __future__ import annotations

import json

import pytest

from vgpuvirt.cli import main

pytest.importorskip("libvirt")


def test_plan_json_is_a_dry_run(capsys):
    assert main(["--json", "--host", "sim:t4x2", "plan", "--connect", "test:///default", "--count", "3",
                 "--gpu", "fb>=2G,series=Q", "--prefix", "cliplan"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["action"] for s in out["plan"]["steps"]].count("create-mdev") == 3
    assert {a["type"] for a in out["plan"]["assignments"]} == {"nvidia-231"}
    assert "applied" not in out
    import libvirt
    names = {d.name() for d in libvirt.open("test:///default").listAllDomains()}
    assert not any(n.startswith("cliplan") for n in names)


def test_provision_table_explain_and_teardown(capsys):
    import libvirt
    # test:///default keeps its state only while a connection is open: hold one across both commands.
    keep = libvirt.open("test:///default")
    args = ["--host", "sim:t4x2", "provision", "--connect", "test:///default", "--count", "2", "--prefix", "clip",
            "--gpu", "GRID T4-2Q", "--explain"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "provisioned VMs" in out and "clip-001" in out and "created" in out
    assert "chosen" in out and "eligible" in out
    assert {"clip-001", "clip-002"} <= {d.name() for d in keep.listAllDomains()}
    # The sim host lives in this process only; the domains live in test:///default, shared per process.
    assert main(["--json", "--host", "sim:t4x2", "teardown", "--connect", "test:///default",
                 "--pattern", "clip-*"]) == 0
    td = json.loads(capsys.readouterr().out)
    assert sum("undefined" in r for r in td["removed"]) == 2
    assert not any(d.name().startswith("clip-") for d in keep.listAllDomains())
    keep.close()


def test_several_hosts_and_bad_input(capsys):
    assert main(["--json", "plan", "--host", "sim:t4x2", "--host", "sim:l40s-vgpu17", "--count", "20",
                 "--gpu", "fb>=2G,series=Q", "--policy", "spread", "--prefix", "multi"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {a["host"] for a in out["plan"]["assignments"]} == {"sim:t4x2", "sim:l40s-vgpu17"}
    assert main(["--host", "sim:t4x2", "plan", "--gpu", "fb>=lots"]) == 2
    assert "invalid" in capsys.readouterr().err
    assert main(["--host", "sim:t4x2", "plan", "--count", "99", "--gpu", "nvidia-231"]) == 1
    assert "no GPU can serve" in capsys.readouterr().err
