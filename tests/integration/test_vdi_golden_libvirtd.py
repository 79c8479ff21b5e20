"""VDI disks and the pre-flight on the real libvirtd (qemu:///system): a pool of linked clones of a golden image
made with qemu-img boots (examples/vdi_golden_pool.py), a failed run deletes the clones it made, and a VM whose
network is missing is refused in the plan. The VMs have no host devices (no VFIO in this kernel)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.errors import LibvirtError, PreflightFailed, ProvisioningError
from vgpuvirt.host.local import LocalHost
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VmRequest, apply, plan, provision
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.provision.run import gather
from vgpuvirt.xml.storage import StoragePool

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vdi_golden_pool.py"
NO_NIC: dict[str, object] = {"virtio_nics": [], "hyperv": False, "disable_arch_capabilities": True}


@pytest.fixture
def conn(testbed: Any) -> Iterator[LibvirtConnection]:
    require_part("qemu-img", shutil.which("qemu-img") is not None, "apt-get install qemu-utils")
    c = LibvirtConnection(testbed.libvirt_uri)
    try:
        assert c.driver
    except LibvirtError as exc:
        require_part("libvirtd", False, f"cannot connect to {testbed.libvirt_uri}: {exc}")
    yield c
    c.close()


def _tag() -> str:
    return "vgpuvirt-it-vdi-" + uuid.uuid4().hex[:6]


# `slow`: 4.5-5.5 s, mostly QEMU starting the clones
@pytest.mark.slow
def test_golden_pool_example_boots_linked_clones(conn: LibvirtConnection, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("vdi_golden_pool", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tag = _tag()
    rc = mod.main(["--connect", conn.uri, "--pool", tag, "--prefix", tag, "--count", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for i in (1, 2):
        line = next(x for x in out.splitlines() if x.startswith(f"{tag}-00{i}: "))
        assert line.startswith(f"{tag}-00{i}: running, disk chain /")
        assert f"/{tag}-00{i}.qcow2 -> /" in line and line.endswith("golden.qcow2")
        assert f"volume {tag}-00{i}.qcow2 is qcow2 backed by /" in line
    assert "torn down: 2 desktops, 2 overlays deleted; golden image kept: True" in out
    assert not conn.pool_exists(tag) and not [d for d in conn.domains() if d.name.startswith(tag)]


def test_a_failed_run_deletes_the_clones_it_made(conn: LibvirtConnection, tmp_path: Path) -> None:
    tag = _tag()
    conn.define_pool(StoragePool(tag, target=str(tmp_path)))
    squatter = None
    try:
        golden = str(tmp_path / "golden.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", golden, "16M"], check=True)
        host = LocalHost()
        vms = VmRequest.pool(tag, 2, gpu=(), memory_mib=128, vcpus=1, start=False, disk=ClonedDisk(tag, golden),
                             options=NO_NIC)
        facts: dict[str, Any] = {}
        invs, doms = gather({host.name: host}, {host.name: conn}, facts)
        p = plan(invs, vms, domains=doms, libvirt=facts)
        squatter = vms[1].name      # another client takes the name: the second define fails after both clones
        conn.define(f"<domain type='kvm'><name>{squatter}</name><uuid>{uuid.uuid4()}</uuid>"
                    "<memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>")
        with pytest.raises(ProvisioningError) as ei:
            apply(p, host, conn)
        assert sum("deleted disk" in line for line in ei.value.rollback) == 2, ei.value.rollback
        assert sorted(os.listdir(tmp_path)) == ["golden.qcow2"]          # the clones' files are gone, not the golden
        assert not conn.exists(vms[0].name) and conn.exists(squatter)
    finally:
        if squatter is not None:
            conn.undefine(squatter)
        conn.remove_pool(tag)


def test_preflight_refuses_a_missing_network_on_libvirtd(conn: LibvirtConnection) -> None:
    facts = conn.facts()
    assert facts.firmware is not None and "efi" in facts.firmware.firmwares   # what the templates' firmware needs
    net = _tag()
    vm = VmRequest(net, gpus=(), memory_mib=128, vcpus=1, options={"virtio_nics": [{"kind": "network", "source": net}]})
    with pytest.raises(PreflightFailed, match=f"libvirt network '{net}' does not exist"):
        provision(LocalHost(), conn, [vm])
    assert not conn.exists(vm.name)
