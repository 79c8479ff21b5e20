"""vm suspend / resume (libvirt managed save, on libvirt's test driver) with vGPUs on a simulated host: the
vGPUs stay reserved while the VM is saved, and a resume creates again those the host lost."""

from __future__ import annotations

import uuid as _uuid
from collections.abc import Iterator

import pytest

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.provision.mobility.checks import Side
from vgpuvirt.provision.mobility.suspend import resume, suspend
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.sim import SimHost
from vgpuvirt.xml.provenance import Provenance

pytest.importorskip("libvirt")
T4 = PciAddress.parse("0000:3b:00.0")
T4_2Q = MdevTypeId.parse("nvidia-231")


@pytest.fixture
def side() -> Iterator[Side]:
    conn = LibvirtConnection("test:///default")
    yield Side(SimHost.from_profile("t4x2", name="gpu1"), conn)
    conn.close()


def _vm(side: Side, *, record: bool = True) -> tuple[str, MdevUuid]:
    from lxml import etree
    vm = f"sus-{_uuid.uuid4().hex[:8]}"
    u = mdev_uuid_for(vm, 0)
    assert all(o.ok for o in apply_items(side.host, [CreateMdev(side.name, vm, u, T4, T4_2Q).item(5.0)]))
    meta = ""
    if record:
        prov = Provenance.of(side.name, [{"kind": "mdev", "uuid": str(u), "parent": str(T4), "type": str(T4_2Q)}])
        meta = f"<metadata>{etree.tostring(prov.to_element(), encoding='unicode')}</metadata>"
    side.conn.define(f"<domain type='test'><name>{vm}</name>{meta}<memory unit='MiB'>256</memory><os><type>hvm</type>"
                     f"</os><devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
                     f"<address uuid='{u}'/></source></hostdev></devices></domain>")
    side.conn.start(vm)
    return vm, u


def _gone(side: Side, vm: str) -> None:
    side.conn.destroy(vm)
    dom = side.conn.raw.lookupByName(vm)
    if dom.hasManagedSaveImage(0):
        dom.managedSaveRemove(0)      # the test driver's undefine takes no MANAGED_SAVE flag
    side.conn.undefine(vm)


def _mdevs(side: Side) -> set[str]:
    return {str(k) for k in side.host.model.mdevs}   # type: ignore[attr-defined]


def test_suspend_keeps_the_vgpu_and_resume_finds_it(side: Side) -> None:
    vm, u = _vm(side)
    try:
        r = suspend(side, vm)
        assert r.kept == [str(u)]
        assert not side.conn.is_active(vm) and side.conn.has_managed_save(vm) and str(u) in _mdevs(side)
        back = resume(side, vm)
        assert back.kept == [str(u)] and back.recreated == []
        assert side.conn.is_active(vm) and not side.conn.has_managed_save(vm)
    finally:
        _gone(side, vm)


def test_resume_creates_again_a_vgpu_the_host_lost(side: Side) -> None:
    vm, u = _vm(side)
    try:
        suspend(side, vm)
        side.host.reboot()                    # type: ignore[attr-defined]  # mdevs not persisted: gone
        assert str(u) not in _mdevs(side)
        back = resume(side, vm)
        assert back.recreated == [str(u)] and str(u) in _mdevs(side) and side.conn.is_active(vm)
    finally:
        _gone(side, vm)


def test_resume_without_a_record_of_a_lost_vgpu_is_refused_and_changes_nothing(side: Side) -> None:
    vm, u = _vm(side, record=False)
    try:
        suspend(side, vm)
        side.host.reboot()                    # type: ignore[attr-defined]
        with pytest.raises(InvalidSpec, match=f"its vGPU {u} to exist"):
            resume(side, vm)
        assert side.conn.has_managed_save(vm) and not side.conn.is_active(vm) and not _mdevs(side)
    finally:
        _gone(side, vm)


def test_only_a_running_vm_is_suspended_and_only_a_saved_one_resumed(side: Side) -> None:
    vm, _ = _vm(side)
    try:
        with pytest.raises(InvalidSpec, match="a suspended VM"):
            resume(side, vm)
        side.conn.destroy(vm)
        with pytest.raises(InvalidSpec, match="a running VM"):
            suspend(side, vm)
    finally:
        _gone(side, vm)
