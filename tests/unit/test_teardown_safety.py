"""Teardown against forged ownership and a failing removal, on SimHost + libvirt's test driver.

* Metadata copied from domain A into domain B does not make A's vGPUs B's: teardown of B removes
  nothing of A's, says which domain holds it, and A keeps running with its vGPU.
* A vGPU that another domain (live or persistent XML) uses is left, and named.
* A removal that fails (EBUSY) leaves the domain defined, so the rerun finds the device again and
  finishes; nothing leaks (gc finds no orphan).
"""

from __future__ import annotations

import errno
import uuid

import pytest
from lxml import etree

from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
from vgpuvirt.model import MdevUuid
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown
from vgpuvirt.provision.plan import mdev_uuid_for
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.vgpu.gc import find_orphans
from vgpuvirt.sim import SimHost
from vgpuvirt.sim.host import SimFsWithTools
from vgpuvirt.xml.refs import domain_device_refs

pytest.importorskip("libvirt")

Q2 = VgpuRequest(type="nvidia-231")


@pytest.fixture
def conn():
    c = LibvirtConnection("test:///default", retry=no_retry)
    yield c
    for name in c.xml_views():
        if name != "test":
            c.destroy(name)
            c.undefine(name)
    c.close()


def _name() -> str:
    return "t" + uuid.uuid4().hex[:6]


def _copy_as(conn: LibvirtConnection, src: str, name: str) -> None:
    """Define ``name`` as a copy of ``src``'s persistent XML: its metadata and its hostdevs."""
    root = etree.fromstring(conn.xml(src, inactive=True).encode())
    root.find("name").text = name
    root.remove(root.find("uuid"))
    conn.define(etree.tostring(root).decode())


def _vgpus(host: SimHost) -> tuple[set[str], set[str]]:
    inv = inventory(host)
    return {str(m.uuid) for m in inv.mdevs}, {str(v.address) for v in inv.vendor_vgpu if v.current_type}


def _orphans(host: SimHost, conn: LibvirtConnection) -> list[object]:
    return list(find_orphans(host, list(conn.domain_xml_pairs())))


@pytest.mark.parametrize(("profile", "gpu"), [("t4x2", Q2), ("l40s-vgpu17", VgpuRequest())])
def test_copied_metadata_does_not_make_a_vgpu_yours(conn, profile, gpu):
    host = SimHost.from_profile(profile)
    a, b = _name(), _name()
    provision(host, conn, [VmRequest(a, gpus=(gpu,))])
    held = _vgpus(host)
    assert len(held[0]) + len(held[1]) == 1
    _copy_as(conn, a, b)
    td = teardown(host, conn, [b])
    assert not td.ok and all(a in f for f in td.failed) and len(td.failed) == 1, td.failed
    assert _vgpus(host) == held                                  # nothing of A's removed
    refs = domain_device_refs(conn.xml(a))                       # A runs, still with its vGPU
    assert conn.is_active(a) and {str(u) for u in refs.mdevs} | {str(p) for p in refs.pci} >= held[0] | held[1]
    # tearing A down still works: its device is its own
    if conn.exists(b):
        conn.undefine(b)
    assert teardown(host, conn, [a]).ok and _vgpus(host) == (set(), set())


def test_copied_metadata_of_a_stopped_domain_removes_nothing(conn):
    host = SimHost.from_profile("t4x2")
    a, b = _name(), _name()
    provision(host, conn, [VmRequest(a, gpus=(Q2,))])
    conn.destroy(a)                                  # A is defined, not running: only its persistent XML
    mine = str(mdev_uuid_for(a, 0))
    _copy_as(conn, a, b)
    td = teardown(host, conn, [b])
    assert any("not one vgpuvirt derives" in f and a in f for f in td.failed), td.failed
    assert mine in _vgpus(host)[0] and conn.exists(a)
    assert not conn.exists(b)                        # B itself is gone: the device was never B's


def test_a_vgpu_another_domain_uses_is_left_and_the_rerun_finishes(conn):
    host = SimHost.from_profile("t4x2")
    b, c = _name(), _name()
    provision(host, conn, [VmRequest(b, gpus=(Q2,))])
    mine = str(mdev_uuid_for(b, 0))
    # C uses B's vGPU in its persistent XML only (defined, not running)
    _copy_as(conn, b, c)
    td = teardown(host, conn, [b])
    assert any(c in f and mine in f for f in td.failed), td.failed
    assert mine in _vgpus(host)[0]
    assert conn.exists(b) and not conn.is_active(b)              # kept so that a rerun can finish
    conn.undefine(c)
    again = teardown(host, conn, [b])
    assert again.ok, again.failed
    assert _vgpus(host)[0] == set() and not conn.exists(b) and _orphans(host, conn) == []


def test_a_vgpu_in_another_running_domains_live_xml_only_is_left(conn):
    host = SimHost.from_profile("t4x2")
    b, c = _name(), _name()
    provision(host, conn, [VmRequest(b, gpus=(Q2,))])
    mine = str(mdev_uuid_for(b, 0))
    _copy_as(conn, b, c)
    conn.destroy(b)
    conn.start(c)
    # C's persistent config drops the vGPU; its running instance still holds it (live XML only)
    root = etree.fromstring(conn.xml(c, inactive=True).encode())
    for hd in root.findall("devices/hostdev"):
        hd.getparent().remove(hd)
    conn.define(etree.tostring(root).decode())
    assert MdevUuid.parse(mine) in domain_device_refs(conn.xml(c)).mdevs
    assert MdevUuid.parse(mine) not in domain_device_refs(conn.xml(c, inactive=True)).mdevs
    td = teardown(host, conn, [b])
    assert any(c in f and mine in f for f in td.failed), td.failed
    assert mine in _vgpus(host)[0] and conn.exists(b)


class BusyOnceFs(SimFsWithTools):
    """The first write to an mdev's ``remove`` fails with EBUSY (a VM still holding it)."""

    busy = 1

    def write(self, path: str, value: str) -> None:
        if path.endswith("/remove") and "/mdev/devices/" in path and self.busy:
            self.busy -= 1
            raise OSError(errno.EBUSY, "Device or resource busy")
        super().write(path, value)


def test_ebusy_on_removal_leaves_what_the_rerun_needs(conn):
    host = SimHost.from_profile("t4x2")
    host.fs = BusyOnceFs(host.model)
    vms = VmRequest.pool(_name(), 2, gpu=Q2)
    provision(host, conn, vms)
    td = teardown(host, conn, [v.name for v in vms])
    assert not td.ok and len(td.failed) == 1 and "busy" in td.failed[0].lower(), td.failed
    left = _vgpus(host)[0]
    assert len(left) == 1
    (stuck,) = [v.name for v in vms if str(mdev_uuid_for(v.name, 0)) in left]
    assert conn.exists(stuck) and not conn.is_active(stuck)      # destroyed, still defined
    assert [v.name for v in vms if conn.exists(v.name)] == [stuck]
    again = teardown(host, conn, [v.name for v in vms])
    assert again.ok, again.failed
    assert any(str(MdevUuid.parse(next(iter(left)))) in r for r in again.removed)
    assert _vgpus(host)[0] == set() and not conn.exists(stuck)
    assert _orphans(host, conn) == []                            # nothing leaked


def test_dry_run_reports_the_refusal_and_changes_nothing(conn):
    host = SimHost.from_profile("t4x2")
    a, b = _name(), _name()
    provision(host, conn, [VmRequest(a, gpus=(Q2,))])
    _copy_as(conn, a, b)
    before = (_vgpus(host), sorted(conn.xml_views()))
    td = teardown(host, conn, [b], dry_run=True)
    assert any(a in f for f in td.failed) and not any("would remove vGPU" in r for r in td.removed)
    assert (_vgpus(host), sorted(conn.xml_views())) == before


def test_a_vgpu_in_another_running_domains_persistent_xml_only_is_left(conn):
    host = SimHost.from_profile("t4x2")
    b, c = _name(), _name()
    provision(host, conn, [VmRequest(b, gpus=(Q2,))])
    mine = MdevUuid.parse(str(mdev_uuid_for(b, 0)))
    with_vgpu = etree.fromstring(conn.xml(b, inactive=True).encode())
    with_vgpu.find("name").text = c
    with_vgpu.remove(with_vgpu.find("uuid"))
    without = etree.fromstring(etree.tostring(with_vgpu))
    for hd in without.findall("devices/hostdev"):
        hd.getparent().remove(hd)
    conn.define(etree.tostring(without).decode())
    conn.start(c)
    uid = etree.SubElement(with_vgpu, "uuid")
    uid.text = etree.fromstring(conn.xml(c).encode()).findtext("uuid")
    conn.define(etree.tostring(with_vgpu).decode())   # a config-only attach: next boot, C takes B's vGPU
    assert mine not in domain_device_refs(conn.xml(c)).mdevs
    assert mine in domain_device_refs(conn.xml(c, inactive=True)).mdevs
    td = teardown(host, conn, [b])
    assert any(c in f and str(mine) in f for f in td.failed), td.failed
    assert str(mine) in _vgpus(host)[0] and conn.exists(b)


def test_volumes_that_cannot_be_listed_are_named_in_what_was_skipped(conn, monkeypatch):
    # teardown still removes the VM and its vGPU, and says it could not tell which disks it kept
    from vgpuvirt.errors import LibvirtError
    host, name = SimHost.from_profile("t4x2"), _name()
    provision(host, conn, [VmRequest(name, gpus=(Q2,), start=False)])

    def unreadable(vm: str) -> list[str]:
        raise LibvirtError("storage pool refresh failed: injected", domain=vm, code=1, uri=conn.uri)

    monkeypatch.setattr(conn, "storage_volumes", unreadable)
    res = teardown(host, conn, [name])
    assert any(f"undefined {name}" in r for r in res.removed)
    noted = [s for s in res.skipped if "could not list the volumes" in s]
    assert len(noted) == 1 and noted[0].startswith(f"{host.name}: could not list the volumes of {name}: ")
    assert noted[0].endswith("storage pool refresh failed: injected")
    assert _vgpus(host) == (set(), set())
