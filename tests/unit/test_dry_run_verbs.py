"""Every mutating verb takes ``--dry-run`` as docs/lifecycle.md says (issue 28 item 8): ``vm
start|shutdown|reboot|destroy`` and ``layout apply`` said "unrecognized arguments"; here they report and change
nothing. (``attach``/``detach --dry-run`` need hot-plug: tests/integration/test_vm_hotplug_libvirtd.py.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.libvirt_conn import LibvirtConnection

pytest.importorskip("libvirt")


def test_vm_actions_dry_run_change_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    name = "w28d" + uuid.uuid4().hex[:6]
    conn = LibvirtConnection("test:///default")
    conn.define(f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>"
                "</domain>")
    uri = ["--connect", "test:///default"]
    try:
        assert main(["--host", "sim:t4x2", "vm", "start", name, "--dry-run", *uri]) == 0
        assert capsys.readouterr().out == f"{name}: would start\n"
        assert not conn.is_active(name)
        conn.start(name)
        assert main(["--host", "sim:t4x2", "--json", "vm", "destroy", name, "--dry-run", *uri]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["dry_run"] is True and doc["vms"] == [{"vm": name, "action": "destroy", "changed": True,
                                                          "result": "would power off"}]
        assert conn.is_active(name)
        for action in ("shutdown", "reboot"):
            assert main(["--host", "sim:t4x2", "vm", action, name, "--dry-run", *uri]) == 0
        assert conn.is_active(name)
    finally:
        conn.destroy(name)
        conn.undefine(name)
        conn.close()


def test_layout_apply_dry_run_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t4.yaml"
    f.write_text("version: v1\nconfigs:\n  t4: [{devices: all, mode: vgpu, vgpu-devices: {T4-2Q: 2}}]\n")
    assert main(["--host", "sim:t4x2", "layout", "apply", str(f), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 step(s), 2 GPU(s) change" in out and out.count("+ create mdev") == 4
