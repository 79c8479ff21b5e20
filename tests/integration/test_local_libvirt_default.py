"""On the local host, the verbs that remove devices read this machine's libvirt by default (issue 16: without
--connect, a dry run of `sriov disable` would remove a VF that a defined VM uses)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import vgpuvirt.cli.targets as targets
from vgpuvirt.cli import main
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.sim import materialize

PF, VF_BUS, VF_FN = "0000:17:00.0", "0x17", "0x4"       # a100-sriov: 20 VFs enabled, 0000:17:00.4 is virtfn0


@pytest.fixture
def tree(tmp_path: Path) -> str:
    materialize("a100-sriov", str(tmp_path / "t"))
    return str(tmp_path / "t")


@pytest.fixture
def vm_on_the_vf(testbed: Any) -> Iterator[str]:
    name = f"w16cli-{uuid.uuid4().hex[:8]}"
    xml = (f"<domain type='kvm'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
           "<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>"
           "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
           f"<address domain='0x0000' bus='{VF_BUS}' slot='0x00' function='{VF_FN}'/></source></hostdev>"
           "</devices></domain>")
    with LibvirtConnection(testbed.libvirt_uri) as conn:
        conn.raw.defineXML(xml)
        try:
            yield name
        finally:
            conn.undefine(name)


def test_sriov_disable_dry_run_on_the_local_host_respects_a_defined_vm(
        tree: str, vm_on_the_vf: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--sysfs-root", tree, "sriov", "disable", PF, "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 1 and vm_on_the_vf in err and "--force" in err and "would" not in out, (out, err)
    # --domain-xml given: that is what the user asked to respect, the local libvirt is not read
    empty = Path(tree).parent / "none.xml"
    empty.write_text("<domain type='kvm'><name>other</name><devices/></domain>")
    rc = main(["--sysfs-root", tree, "sriov", "disable", PF, "--dry-run", "--domain-xml", str(empty)])
    out, _ = capsys.readouterr()
    assert rc == 0 and "would change" in out


def test_an_unreachable_local_libvirt_is_said_on_stderr(tree: str, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(targets, "LOCAL_URI", f"qemu+unix:///system?socket={tmp_path}/no-such-sock")
    rc = main(["--sysfs-root", tree, "sriov", "disable", PF, "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 0 and "would change" in out
    assert "note: local libvirt" in err and "not reachable" in err and err.count("\n") == 1, err
    rc = main(["--sysfs-root", tree, "gc"])               # gc cannot guess: every vGPU would look orphaned
    _, err = capsys.readouterr()
    assert rc == 2 and "--connect" in err
