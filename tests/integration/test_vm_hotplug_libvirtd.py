"""Issue 16 on the real libvirtd (qemu driver): ``vgpuvirt attach`` / ``detach`` of a vGPU (simulated host,
real libvirt: defined VMs take hostdevs into their persistent definition without VFIO), and ``vgpuvirt vm``
starting, listing and powering off a VM without host devices (this kernel has no VFIO to start one with)."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.cli import main
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost

pytestmark = pytest.mark.integration
# One prefix per process: the testbed's libvirtd is shared by xdist workers and other sessions (a fixed name
# let two runs start, destroy and undefine each other's VMs).
PREFIX = f"w16vm-it-{uuid.uuid4().hex[:8]}-"
# The testbed's libvirtd has no network: the plan's pre-flight refuses the templates' network 'default'.
NO_NIC: dict[str, object] = {"virtio_nics": []}


@pytest.fixture
def conn(testbed: Any) -> Iterator[Any]:
    try:
        import libvirt  # noqa: F401

        from vgpuvirt.libvirt_conn import LibvirtConnection
    except ImportError:
        require_part("libvirt-python", False, "pip install 'vgpuvirt[libvirt]'")
        raise
    from vgpuvirt.errors import LibvirtError
    c = LibvirtConnection(testbed.libvirt_uri)
    try:
        c.domains()
    except LibvirtError as exc:
        require_part("libvirtd", False, f"cannot connect to {testbed.libvirt_uri}: {exc}")
        raise
    yield c
    for d in c.domains():
        if d.name.startswith(PREFIX):
            c.destroy(d.name)
            c.undefine(d.name)
    c.close()


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimHost:
    """One simulated host for every CLI call of a test (a sim host lives in its process, per open)."""
    h = SimHost.from_profile("t4x2")
    monkeypatch.setattr("vgpuvirt.cli.targets.open_host", lambda *a, **kw: h)
    return h


def test_attach_then_detach_a_vgpu_through_the_cli(conn, sim, capsys):
    name = PREFIX + "hp"
    provision(sim, conn, [VmRequest(name, gpus=(VgpuRequest.parse("nvidia-231"),), start=False, memory_mib=256,
                                    vcpus=1, options=NO_NIC)])
    uri = ["--connect", conn.uri]
    # --dry-run (issue 28): places it and says what it would make; nothing is made or attached
    before = ({str(m.uuid) for m in inventory(sim).mdevs}, conn.xml(name, inactive=True))
    assert main(["--json", "--host", "sim:t4x2", "attach", name, "--gpu", "GRID T4-2Q", "--dry-run", *uri]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["type"] == "nvidia-231" and dry["created"] and "dry run" in dry["notes"][-1]
    assert ({str(m.uuid) for m in inventory(sim).mdevs}, conn.xml(name, inactive=True)) == before
    assert main(["--json", "--host", "sim:t4x2", "attach", name, "--gpu", "GRID T4-2Q", *uri]) == 0
    att = json.loads(capsys.readouterr().out)
    (dev,) = att["devices"]
    uuid = dev.split()[-1]
    assert att["type"] == "nvidia-231" and att["created"]
    assert uuid in {str(m.uuid) for m in inventory(sim).mdevs}
    persistent = conn.xml(name, inactive=True)
    assert uuid in persistent and re.search(rf'vgpuvirt:gpu[^>]*uuid="{uuid}"', persistent)
    # Two GPUs now: detach without DEVICE is refused with the list, and nothing changes.
    assert main(["--host", "sim:t4x2", "detach", name, *uri]) == 2
    assert "DEVICE" in capsys.readouterr().err
    assert main(["--json", "--host", "sim:t4x2", "vm", "list", name, *uri]) == 0
    (vm,) = json.loads(capsys.readouterr().out)["vms"]
    assert {(g["device"], g["type"], g["type_name"]) for g in vm["gpus"]} >= {(uuid, "nvidia-231", "GRID T4-2Q")}
    assert main(["--json", "--host", "sim:t4x2", "detach", name, uuid, "--dry-run", *uri]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == []
    assert uuid in {str(m.uuid) for m in inventory(sim).mdevs} and uuid in conn.xml(name, inactive=True)
    assert main(["--json", "--host", "sim:t4x2", "detach", name, uuid, *uri]) == 0
    det = json.loads(capsys.readouterr().out)
    assert det["removed"] == [f"removed vGPU {uuid}"] and not det["left"]
    assert uuid not in {str(m.uuid) for m in inventory(sim).mdevs}
    persistent = conn.xml(name, inactive=True)
    assert uuid not in persistent
    # The VM's own vGPU is still recorded, so teardown still removes it.
    r = teardown(sim, conn, [name])
    assert r.ok and not inventory(sim).mdevs and not conn.exists(name)


def test_detach_leaves_a_vgpu_that_vgpuvirt_did_not_make_for_the_vm(conn, sim, capsys):
    from vgpuvirt.change.mdev_service import MdevService
    from vgpuvirt.model import MdevUuid
    from vgpuvirt.xml import MdevHostdev

    name = PREFIX + "foreign"
    provision(sim, conn, [VmRequest(name, gpus=(VgpuRequest.parse("nvidia-231"),), start=False, memory_mib=256,
                                    vcpus=1, options=NO_NIC)])
    other = MdevUuid.parse("5a0c1e2d-0000-4000-8000-00000000f00d")
    MdevService(sim).create("0000:3b:00.0", "nvidia-231", other)
    conn.attach(name, MdevHostdev(other), config=True)
    assert main(["--json", "--host", "sim:t4x2", "detach", name, str(other), "--connect", conn.uri]) == 0
    det = json.loads(capsys.readouterr().out)
    assert not det["removed"] and "not made by vgpuvirt" in det["left"][0]
    assert other in {m.uuid for m in inventory(sim).mdevs}          # not vgpuvirt's: left on the host
    assert str(other) not in conn.xml(name, inactive=True)          # but detached as asked
    teardown(sim, conn, [name])
    MdevService(sim).remove(other)


# `slow`: 3.7-5.6 s, mostly QEMU starting and stopping
@pytest.mark.slow
def test_vm_start_list_destroy_on_libvirtd(conn, capsys):
    from vgpuvirt.xml import DomainOptions, VirtioNic, build_domain

    name = PREFIX + "life"
    dom = build_domain("compute", name=name, memory_mib=128, vcpus=1,
                       options=DomainOptions(disable_arch_capabilities=True, virtio_nics=(VirtioNic("user"),)))
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):  # TCG: no host CPU to pass through
        dom.root.set("type", "qemu")
        cpu = dom.child("cpu")
        if cpu is not None:
            dom.root.remove(cpu)
    conn.define(dom.to_xml())
    uri = ["--connect", conn.uri]
    assert main(["--host", "local", "vm", "start", name, *uri]) == 0
    assert conn.is_active(name)
    capsys.readouterr()
    assert main(["--json", "--host", "local", "vm", "list", PREFIX + "*", *uri]) == 0
    (vm,) = json.loads(capsys.readouterr().out)["vms"]
    assert vm == {"name": name, "host": "local", "state": "running", "persistent": True, "vgpuvirt": False,
                  "gpus": [], "devices": [], "missing": []}
    # (no ACPI shutdown here: with no OS, this nested KVM soon pauses the guest on an emulation error)
    assert main(["--host", "local", "vm", "destroy", name, *uri]) == 0
    assert not conn.is_active(name)
    assert main(["--host", "local", "vm", "start", name, *uri]) == 0 and conn.is_active(name)
    assert main(["--host", "local", "vm", "destroy", name, *uri]) == 0


def test_attach_a_whole_gpu_with_its_audio_and_detach_it(conn, monkeypatch, capsys):
    from vgpuvirt.xml import Domain, DomainOptions, VirtioNic, build_domain

    h = SimHost.from_profile("desktop")
    monkeypatch.setattr("vgpuvirt.cli.targets.open_host", lambda *a, **kw: h)
    name = PREFIX + "pt"
    conn.define(build_domain("gaming", name=name, memory_mib=256, vcpus=1,
                             options=DomainOptions(virtio_nics=(VirtioNic("user"),))).to_xml())
    uri = ["--connect", conn.uri]
    assert main(["--host", "sim:desktop", "attach", name, "--gpu", "passthrough", "--config", *uri]) == 0
    out = capsys.readouterr().out
    assert "PCI hostdev 0000:01:00.0, PCI hostdev 0000:01:00.1" in out     # the audio function goes along
    assert [str(a) for a in Domain.from_xml(conn.xml(name, inactive=True)).gpu_devices().pci_addresses] == [
        "0000:01:00.0", "0000:01:00.1"]
    assert main(["--host", "sim:desktop", "detach", name, "0000:02:00.0", *uri]) == 2   # not the VM's: refused
    assert "0000:02:00.0" in capsys.readouterr().err
    # libvirt refusing the second function: the first is attached again (both or neither).
    from vgpuvirt.errors import LibvirtError, ProvisioningError
    from vgpuvirt.provision.hotplug import detach_gpu
    real, calls = conn.detach, []

    def second_fails(vm: str, dev: Any, **kw: Any) -> None:
        calls.append(dev)
        if len(calls) == 2:
            raise LibvirtError("detach device failed: injected", domain=vm, code=1, uri=conn.uri)
        real(vm, dev, **kw)

    monkeypatch.setattr(conn, "detach", second_fails)
    with pytest.raises(ProvisioningError, match="injected") as ei:
        detach_gpu(h, conn, name, config=True)
    assert ei.value.rollback == [f"{h.name}: attached PCI hostdev 0000:01:00.0 to {name} again"]
    assert len(Domain.from_xml(conn.xml(name, inactive=True)).gpu_devices().pci_addresses) == 2
    monkeypatch.setattr(conn, "detach", real)
    assert main(["--host", "sim:desktop", "detach", name, *uri]) == 0        # its only GPU, both functions
    assert not Domain.from_xml(conn.xml(name, inactive=True)).gpu_devices().pci_addresses


# `slow`: 4.8 s, mostly QEMU starting
@pytest.mark.slow
def test_an_attach_libvirt_refuses_removes_the_vgpu_on_libvirtd(conn, sim):
    from vgpuvirt.errors import ProvisioningError
    from vgpuvirt.provision.hotplug import attach_gpu

    name = PREFIX + "live"
    provision(sim, conn, [VmRequest(name, gpus=(VgpuRequest.parse("nvidia-231"),), start=False, memory_mib=256,
                                    vcpus=1, options=NO_NIC)])
    before = {m.uuid for m in inventory(sim).mdevs}
    with pytest.raises(ProvisioningError, match="not running") as ei:       # --live on a VM that is shut off
        attach_gpu(sim, conn, name, VgpuRequest.parse("nvidia-231"), live=True, config=False)
    assert any(r.startswith(f"{sim.name}: removed vGPU") for r in ei.value.rollback)
    assert {m.uuid for m in inventory(sim).mdevs} == before
    teardown(sim, conn, [name])


def test_a_vgpu17_vf_type_is_set_on_attach_and_reset_on_detach(conn, monkeypatch, capsys):
    h = SimHost.from_profile("l40s-vgpu17")
    monkeypatch.setattr("vgpuvirt.cli.targets.open_host", lambda *a, **kw: h)
    name = PREFIX + "vf17"
    provision(h, conn, [VmRequest(name, gpus=(VgpuRequest.parse("L40S-8Q"),), start=False, memory_mib=256,
                                  vcpus=1, options=NO_NIC)])
    exchanges: list[object] = []
    real = h._exchange

    def counted(request: dict[str, Any], **kw: Any) -> dict[str, Any]:
        exchanges.append(request)
        return real(request, **kw)

    monkeypatch.setattr(h, "_exchange", counted)
    assert main(["--json", "--host", "sim:l40s-vgpu17", "attach", name, "--gpu", "L40S-8Q",
                 "--connect", conn.uri]) == 0
    att = json.loads(capsys.readouterr().out)
    assert len(exchanges) == 2                   # one read of the host, one batch, whatever its size
    monkeypatch.setattr(h, "_exchange", real)
    vf = att["devices"][0].split()[-1]
    assert att["type_name"] == "NVIDIA L40S-8Q" and not att["notes"]
    typed = {str(v.address): v.current_type for v in inventory(h).vendor_vgpu}
    assert typed[vf] != 0 and sum(1 for t in typed.values() if t) == 2
    assert main(["--json", "--host", "sim:l40s-vgpu17", "detach", name, vf, "--connect", conn.uri]) == 0
    det = json.loads(capsys.readouterr().out)
    assert det["removed"] == [f"reset VF {vf}"], json.dumps(det)
    typed = {str(v.address): v.current_type for v in inventory(h).vendor_vgpu}
    assert typed[vf] == 0 and sum(1 for t in typed.values() if t) == 1      # the VM's first vGPU stays
    assert teardown(h, conn, [name]).ok
    assert not any(v.current_type for v in inventory(h).vendor_vgpu)


def test_detach_keeps_a_vgpu_another_domain_holds_and_its_record(conn, sim, capsys):
    from vgpuvirt.xml import Domain, MdevHostdev

    a, b = PREFIX + "own-a", PREFIX + "own-b"
    provision(sim, conn, [VmRequest(n, gpus=(VgpuRequest.parse("nvidia-231"),), start=False, memory_mib=256,
                                    vcpus=1, options=NO_NIC) for n in (a, b)])
    (uuid,) = Domain.from_xml(conn.xml(a)).gpu_devices().mdev_uuids
    conn.attach(b, MdevHostdev(uuid), config=True)               # b's definition names a's vGPU too
    assert main(["--json", "--host", "sim:t4x2", "detach", a, "--connect", conn.uri]) == 0
    det = json.loads(capsys.readouterr().out)
    assert not det["removed"] and f"used by domain {b}" in det["left"][0]
    assert uuid in {m.uuid for m in inventory(sim).mdevs}
    assert f'uuid="{uuid}"' in conn.xml(a, inactive=True)         # still a's to remove once b lets go
    conn.detach(b, MdevHostdev(uuid), config=True)
    r = teardown(sim, conn, [a, b])
    assert r.ok and not inventory(sim).mdevs


def _picture(host: SimHost, conn: Any, name: str) -> tuple[object, ...]:
    """What a failed hot-plug must leave as it was: the host's devices as sysfs shows them (inventory: mdevs,
    each type's free instances, VF types), the VM's persistent and live XML, and libvirt's domains named after
    it (the libvirtd is shared: other workers' tests define and undefine their own domains meanwhile)."""
    return (inventory(host).to_dict(), conn.xml(name, inactive=True), conn.xml(name),
            sorted((d.name, d.active) for d in conn.domains() if d.name.startswith(name)))


def _refuse_metadata(conn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vgpuvirt.errors import LibvirtError

    def refused(vm: str, *a: Any, **kw: Any) -> None:
        raise LibvirtError("set metadata failed: injected", domain=vm, code=1, uri=conn.uri)

    monkeypatch.setattr(conn, "set_metadata", refused)


def test_a_failure_in_the_last_step_of_attach_leaves_host_and_vm_as_before(conn, sim, monkeypatch):
    """attach = make the vGPU, attach it, record it: the record (the last step) failing undoes the other two."""
    from vgpuvirt.errors import ProvisioningError
    from vgpuvirt.provision.hotplug import attach_gpu

    name = PREFIX + "att-last"
    provision(sim, conn, [VmRequest(name, gpus=(VgpuRequest.parse("nvidia-231"),), start=False, memory_mib=256,
                                    vcpus=1, options=NO_NIC)])
    before = _picture(sim, conn, name)
    _refuse_metadata(conn, monkeypatch)
    with pytest.raises(ProvisioningError, match="injected") as ei:
        attach_gpu(sim, conn, name, VgpuRequest.parse("nvidia-231"), config=True)
    err = ei.value
    assert [c.split(": ", 1)[1].split()[0] for c in err.completed] == ["create", "attach"]
    assert [r.split(": ", 1)[1].split()[0] for r in err.rollback] == ["detached", "removed"]
    assert all("FAILED" not in r for r in err.rollback)
    assert _picture(sim, conn, name) == before
    teardown(sim, conn, [name])


def test_a_failure_in_the_last_step_of_detach_leaves_host_and_vm_as_before(conn, sim, monkeypatch):
    """detach = detach the vGPU, remove it, drop its record: the record failing makes the vGPU again (same
    UUID, parent and type) and attaches it again."""
    from vgpuvirt.errors import ProvisioningError
    from vgpuvirt.provision.hotplug import detach_gpu
    from vgpuvirt.xml import Domain

    name = PREFIX + "det-last"
    provision(sim, conn, [VmRequest(name, gpus=(VgpuRequest.parse("nvidia-231"),), start=False, memory_mib=256,
                                    vcpus=1, options=NO_NIC)])
    (u,) = Domain.from_xml(conn.xml(name, inactive=True)).gpu_devices().mdev_uuids
    before = _picture(sim, conn, name)
    _refuse_metadata(conn, monkeypatch)
    with pytest.raises(ProvisioningError, match="injected") as ei:
        detach_gpu(sim, conn, name, config=True)
    err = ei.value
    assert [c.split(": ", 1)[1] for c in err.completed] == [f"detach mdev {u} from {name}",
                                                             f"remove {u}, made by vgpuvirt for {name}"]
    assert err.rollback[0].startswith(f"{sim.name}: made again: create vGPU nvidia-231 {u}")
    assert err.rollback[1:] == [f"{sim.name}: attached mdev {u} to {name} again"]
    assert _picture(sim, conn, name) == before
    monkeypatch.undo()
    assert teardown(sim, conn, [name]).ok and not inventory(sim).mdevs


def test_a_cut_after_removing_an_unrecorded_vgpu_makes_it_again(conn, monkeypatch):
    """A VM vgpuvirt did not make holds a vGPU with a UUID derived from its name (no metadata): detach reads
    its parent and type from the host, so when the link drops after the removal ran, the rollback makes the
    same vGPU again and attaches it again."""
    from vgpuvirt.change.mdev_service import MdevService
    from vgpuvirt.errors import ProvisioningError, TransportError
    from vgpuvirt.provision.hotplug import detach_gpu
    from vgpuvirt.provision.plan import mdev_uuid_for
    from vgpuvirt.xml import DomainOptions, MdevHostdev, VirtioNic, build_domain

    h = SimHost.from_profile("t4x2")
    name = PREFIX + "cut"
    conn.define(build_domain("vdi", name=name, memory_mib=256, vcpus=1,
                             options=DomainOptions(virtio_nics=(VirtioNic("user"),))).to_xml())
    u = mdev_uuid_for(name, 0)
    MdevService(h).create("0000:3b:00.0", "nvidia-232", u)
    conn.attach(name, MdevHostdev(u), config=True)
    before = _picture(h, conn, name)
    real, cut = h._exchange, []

    def cut_after_the_write(request: dict[str, Any], **kw: Any) -> dict[str, Any]:
        out = real(request, **kw)
        if not cut and any(o.get("op") == "write" for o in request.get("ops") or ()):
            cut.append(request)
            raise TransportError(h.name, "connection lost: simulated cut")
        return out

    monkeypatch.setattr(h, "_exchange", cut_after_the_write)
    with pytest.raises(ProvisioningError, match="simulated cut") as ei:
        detach_gpu(h, conn, name, config=True)
    assert ei.value.rollback == [f"{h.name}: made again: create vGPU nvidia-232 {u} on 0000:3b:00.0 (for {name})",
                                 f"{h.name}: attached mdev {u} to {name} again"]
    assert _picture(h, conn, name) == before
    monkeypatch.undo()
    MdevService(h).remove(u)
