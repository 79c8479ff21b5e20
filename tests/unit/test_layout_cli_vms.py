"""``layout plan`` and ``layout assert`` read the defined VMs (``--connect``; issue 28 items 2 and 8): plan names
the VMs whose devices a step would take (only apply refused before), and ``--connect none`` reads no libvirt."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.libvirt_conn import LibvirtConnection

pytest.importorskip("libvirt")
LAYOUT = 'version: v1\nconfigs:\n  pt:\n    - devices: ["0000:01:00.0"]\n      mode: passthrough\n'


@pytest.fixture
def gamer() -> Iterator[str]:
    """A domain on the test driver that uses the desktop profile's GPU 0000:01:00.0 through a PCI hostdev."""
    name = "w28g" + uuid.uuid4().hex[:6]
    conn = LibvirtConnection("test:///default")
    conn.define(f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>"
                "<devices><hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' "
                "bus='0x01' slot='0x00' function='0x0'/></source></hostdev></devices></domain>")
    try:
        yield name
    finally:
        conn.undefine(name)
        conn.close()


def test_layout_plan_names_the_vms_a_step_takes_devices_from(gamer: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pt.yaml"
    f.write_text(LAYOUT)
    assert main(["--host", "sim:desktop", "layout", "plan", str(f), "--connect", "test:///default"]) == 0
    out = capsys.readouterr().out
    assert f"  ! takes 0000:01:00.0 from VM {gamer}: apply refuses unless --drain shutdown" in out, out
    assert main(["--host", "sim:desktop", "layout", "plan", str(f), "--json"]) == 0      # default: test:///default
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["takes_from_vms"] == {gamer: ["0000:01:00.0"]}
    assert main(["--host", "sim:desktop", "layout", "plan", str(f), "--connect", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["takes_from_vms"] == {}


def test_layout_assert_fails_when_a_defined_vm_names_a_missing_vgpu(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t4.yaml"
    f.write_text("version: v1\nconfigs:\n  one:\n    - devices: ['0000:3b:00.0']\n      mode: vgpu\n"
                 "      vgpu-devices: {T4-2Q: 1}\n")
    name, u = "w28m" + uuid.uuid4().hex[:6], str(uuid.uuid4())
    conn = LibvirtConnection("test:///default")
    conn.define(f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>"
                "<metadata><vgpuvirt:provision xmlns:vgpuvirt='https://vgpuvirt.dev/xmlns/provision/1' host='sim:t4x2'>"
                f"<vgpuvirt:gpu kind='mdev' uuid='{u}' parent='0000:3b:00.0' type='nvidia-231'/>"
                "</vgpuvirt:provision></metadata>"
                f"<devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/>"
                "</source></hostdev></devices></domain>")
    line = f"VM {name} names vGPU {u} (T4-2Q on 0000:3b:00.0), which is not on the host"
    try:
        assert main(["--host", "sim:t4x2", "layout", "assert", str(f), "--connect", "none"]) == 1
        assert line not in capsys.readouterr().out
        assert main(["--host", "sim:t4x2", "layout", "assert", str(f)]) == 1
        assert line in capsys.readouterr().out
        assert main(["--host", "sim:t4x2", "layout", "plan", str(f)]) == 0
        assert f"create mdev {u} (T4-2Q) on 0000:3b:00.0 for VM {name}" in capsys.readouterr().out
    finally:
        conn.undefine(name)
        conn.close()
