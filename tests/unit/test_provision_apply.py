"""plan/apply/rollback/teardown end to end on SimHost + libvirt's test driver, with faults injected
at each step: vGPU creation, define, start, and the connection cut mid-batch. After each failure
the host holds exactly what it held before (foreign devices and domains included), and a rerun
converges without duplicates."""

from __future__ import annotations

import uuid

import pytest
from host_state import CutSimHost
from provision_fixtures import drop_test_domains

from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.errors import LibvirtError, ProvisioningError, TransportError
from vgpuvirt.host.base import Op
from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan, provision, teardown
from vgpuvirt.provision.plan import mdev_uuid_for
from vgpuvirt.provision.run import gather
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.xml import Domain
from vgpuvirt.xml.provenance import Provenance

libvirt = pytest.importorskip("libvirt")

Q2 = VgpuRequest(type="nvidia-231")
FOREIGN_UUID = "0badc0de-0000-4000-8000-000000000001"


class FaultyConn(LibvirtConnection):
    """The real test driver, with one lifecycle call made to fail the way libvirt fails."""

    fail: tuple[str, str] | None = None    # (method, domain name)

    def _boom(self, method: str, name: str) -> None:
        if self.fail == (method, name):
            raise LibvirtError(f"{method} failed: injected", domain=name, code=1, uri=self.uri)

    def define(self, xml: str, *, name: str | None = None) -> str:
        from lxml import etree
        self._boom("define", etree.fromstring(xml.encode()).findtext("name"))
        return super().define(xml, name=name)

    def start(self, name: str) -> None:
        self._boom("start", name)
        super().start(name)

    def undefine(self, name: str, *, remove_storage: bool = False) -> list[str]:
        self._boom("undefine", name)
        return super().undefine(name, remove_storage=remove_storage)


@pytest.fixture
def conn():
    c = FaultyConn("test:///default", retry=no_retry)
    yield c
    drop_test_domains(c)


def _prefix() -> str:
    return "p" + uuid.uuid4().hex[:6]


def _state(host, conn) -> tuple[set[str], set[str], dict[str, bool]]:
    inv = inventory(host)
    return ({str(m.uuid) for m in inv.mdevs}, {str(v.address) for v in inv.vendor_vgpu if v.current_type},
            {d.name: d.active for d in conn.domains()})


def _foreign(host, conn) -> str:
    """A foreign mdev (same size as ours, on GPU0) and a foreign domain that must survive everything."""
    res = host.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create",
                               FOREIGN_UUID)])
    assert res.ok
    name = "foreign-" + uuid.uuid4().hex[:6]
    conn.define(f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os></domain>")
    return name


@pytest.mark.parametrize("profile", ["t4x2", "a100-sriov", "l40s-vgpu17", "gvtg", "mixed", "large"])
def test_provision_rerun_teardown_on_every_vgpu_profile(profile, conn):
    host = SimHost.from_profile(profile)
    vms = VmRequest.pool(_prefix(), 3, gpu=VgpuRequest())
    before = _state(host, conn)
    r = provision(host, conn, vms)
    assert r.applied is not None and r.applied.round_trips[host.name] == 1   # one batch for all vGPUs
    after = _state(host, conn)
    assert len(after[0] - before[0]) + len(after[1] - before[1]) == 3
    assert all(after[2][v.name] for v in vms)
    again = provision(host, conn, vms)
    assert again.plan.empty and again.applied is not None and again.applied.done == []
    assert _state(host, conn) == after                                        # nothing duplicated
    td = teardown(host, conn, [v.name for v in vms])
    assert td.ok, td.failed
    assert _state(host, conn) == before


@pytest.mark.parametrize(("profile", "gpu", "template", "kind"), [
    ("desktop", VgpuRequest(mode="passthrough"), "gaming", "whole"),
    ("mxgpu", VgpuRequest(mode="vf"), "vdi", "vf"),
    ("a100-sriov", VgpuRequest(mig_backed=True), "compute", "mdev"),
])
def test_passthrough_vf_and_mig_profiles(profile, gpu, template, kind, conn):
    host = SimHost.from_profile(profile)
    vms = VmRequest.pool(_prefix(), 1, gpu=gpu, template=template)
    before = _state(host, conn)
    r = provision(host, conn, vms)
    xml = conn.xml(vms[0].name)
    a = r.plan.assignments[0]
    assert a.kind == kind
    # The device is a <hostdev> of the domain (not only in the provenance metadata), and it is the one placed:
    # the PCI function itself for a whole GPU or a VF (with the GPU's other functions for a whole GPU), the
    # vGPU's mdev (and no PCI hostdev) for an mdev.
    devs = Domain.from_xml(xml).gpu_devices()
    if kind == "mdev":
        assert (devs.mdev_uuids, devs.pci_addresses) == ([mdev_uuid_for(vms[0].name, 0)], [])
    else:
        assert devs.mdev_uuids == [] and devs.pci_addresses[0] == a.slot
        assert set(devs.pci_addresses) == {a.slot, *a.functions}
    # The provenance names the device by its kind: what `vgpuvirt vm`, detach and a rerun read back.
    prov = Provenance.read(xml)
    assert prov is not None
    if kind == "mdev":
        assert [(e["kind"], e["uuid"]) for e in prov.gpus] == [("mdev", str(mdev_uuid_for(vms[0].name, 0)))]
    else:
        assert [dict(e) for e in prov.gpus] == [{"kind": kind, "address": str(a.slot)}]
    assert teardown(host, conn, [v.name for v in vms]).ok
    assert _state(host, conn) == before


def test_vgpu_creation_failure_rolls_back_exactly_what_was_created(conn):
    host = SimHost.from_profile("t4x2")
    foreign = _foreign(host, conn)
    vms = VmRequest.pool(_prefix(), 6, gpu=Q2)
    invs, doms = gather({host.name: host}, {host.name: conn})
    p = plan(invs, vms, domains=doms)
    assert {str(s.parent) for s in p.steps if isinstance(s, CreateMdev)} == {"0000:3b:00.0"}
    # Between plan and apply someone else takes 4 of the GPU's remaining 7 2Q instances.
    taken = [str(uuid.uuid4()) for _ in range(4)]
    assert host.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create", u)
                       for u in taken]).ok
    before = _state(host, conn)
    with pytest.raises(ProvisioningError) as ei:
        apply(p, host, conn)
    err = ei.value
    assert "no free instance" in str(err.cause)
    assert len([c for c in err.completed if "create vGPU" in c]) == 3
    assert len([r for r in err.rollback if "removed vGPU" in r]) == 3
    assert _state(host, conn) == before                     # foreign mdevs and domain untouched
    assert FOREIGN_UUID in before[0] and foreign in before[2]
    # Rerun with the capacity back: converges onto both GPUs.
    host.apply([Op.write(f"/sys/bus/mdev/devices/{u}/remove", "1") for u in taken])
    r = provision(host, conn, vms)
    assert r.applied is not None and len(r.plan.assignments) == 6
    mdevs, _, doms_now = _state(host, conn)
    assert FOREIGN_UUID in mdevs and foreign in doms_now
    assert {str(mdev_uuid_for(v.name, 0)) for v in vms} <= mdevs and len(mdevs) == 7


@pytest.mark.parametrize("method", ["define", "start"])
def test_define_or_start_failure_rolls_back_and_rerun_converges(method, conn):
    host = SimHost.from_profile("t4x2")
    foreign = _foreign(host, conn)
    vms = VmRequest.pool(_prefix(), 4, gpu=Q2)
    before = _state(host, conn)
    conn.fail = (method, vms[2].name)
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, vms)
    err = ei.value
    assert isinstance(err.cause, LibvirtError) and err.cause.domain == vms[2].name
    assert any("removed vGPU" in r for r in err.rollback)
    assert any("undefined domain" in r for r in err.rollback)
    if method == "start":
        assert any("destroyed domain" in r for r in err.rollback)
    assert _state(host, conn) == before
    conn.fail = None
    provision(host, conn, vms)
    mdevs, _, doms = _state(host, conn)
    assert FOREIGN_UUID in mdevs and foreign in doms and len(mdevs) == 5
    assert all(doms[v.name] for v in vms)


def test_rollback_undoes_in_reverse_order(conn):
    host = SimHost.from_profile("t4x2")
    vms = VmRequest.pool(_prefix(), 3, gpu=Q2)
    conn.fail = ("start", vms[2].name)
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, vms)
    conn.fail = None
    undone = [r.split(": ", 1)[1] for r in ei.value.rollback if "domain" in r]
    # all defined, then vms[0] and vms[1] started: the last step done is undone first
    names = [v.name for v in vms]
    assert undone == [f"destroyed domain {names[1]}", f"destroyed domain {names[0]}",
                      f"undefined domain {names[2]}", f"undefined domain {names[1]}", f"undefined domain {names[0]}"]
    assert any("removed vGPU" in r for r in ei.value.rollback)


def test_foreign_domain_with_our_name_is_refused_and_survives(conn):
    host = SimHost.from_profile("t4x2")
    name = _prefix() + "-001"
    conn.define(f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os></domain>")
    before = _state(host, conn)
    from vgpuvirt.errors import AlreadyExists
    with pytest.raises(AlreadyExists):
        provision(host, conn, [VmRequest(name, gpus=(Q2,))])
    assert _state(host, conn) == before
    td = teardown(host, conn, [name])
    assert "not created by vgpuvirt" in td.skipped[0] and conn.exists(name)


@pytest.mark.parametrize("after_running", [True, False])
def test_connection_cut_mid_batch(after_running, conn):
    host = CutSimHost.from_profile("t4x2")
    foreign = _foreign(host, conn)
    host.cut_at, host.cut_after_running, host._writes = 1, after_running, 0
    vms = VmRequest.pool(_prefix(), 5, gpu=Q2)
    before = _state(host, conn)
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, vms)
    assert isinstance(ei.value.cause, TransportError)
    assert all("outcome unknown" in c for c in ei.value.completed)
    # The rollback re-read the host: whatever the lost batch created is gone again, nothing else.
    assert _state(host, conn) == before
    if after_running:
        assert sum("removed vGPU" in r for r in ei.value.rollback) == 5
    else:
        assert sum("had not happened" in r for r in ei.value.rollback) == 5
    provision(host, conn, vms)
    mdevs, _, doms = _state(host, conn)
    assert FOREIGN_UUID in mdevs and foreign in doms and len(mdevs) == 6


def test_cut_with_rollback_impossible_then_rerun_adopts_the_lost_devices(conn):
    host = CutSimHost.from_profile("t4x2")
    host.cut_at, host.stay_down = 1, True
    vms = VmRequest.pool(_prefix(), 3, gpu=Q2)
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, vms)
    # The host stayed unreachable, so the rollback could not even look: it says so.
    assert all("FAILED" in r for r in ei.value.rollback) and len(ei.value.rollback) == 3
    host.down = False
    left = _state(host, conn)[0]
    assert {str(mdev_uuid_for(v.name, 0)) for v in vms} == left
    # The rerun adopts the devices the lost batch made (same UUIDs) instead of creating more.
    r = provision(host, conn, vms)
    assert not [s for s in r.plan.steps if isinstance(s, CreateMdev)]
    assert sum("adopted" in k.what for k in r.plan.kept) == 3
    assert _state(host, conn)[0] == left
    assert all(conn.is_active(v.name) for v in vms)


def test_several_hosts_in_parallel_with_one_connection_each(conn):
    hosts = [SimHost.from_profile("t4x2", name=f"sim:t4x2-{i}") for i in range(4)]
    conns = {h.name: FaultyConn("test:///default", retry=no_retry) for h in hosts}
    vms = VmRequest.pool(_prefix(), 40, gpu=Q2)
    try:
        r = provision(hosts, conns, vms, policy="spread")
        assert r.applied is not None
        assert {a.host for a in r.plan.assignments} == {h.name for h in hosts}
        assert all(n == 1 for n in r.applied.round_trips.values())
        td = teardown(hosts, conns, [v.name for v in vms])
        assert td.ok and sum("removed vGPU" in x for x in td.removed) == 40
    finally:
        for c in conns.values():
            c.close()


def test_failure_on_one_host_rolls_back_all_hosts(conn):
    hosts = [SimHost.from_profile("t4x2", name=f"sim:t4x2-{i}") for i in range(2)]
    vms = VmRequest.pool(_prefix(), 4, gpu=Q2)
    conn.fail = ("define", vms[1].name)
    befores = [_state(h, conn) for h in hosts]
    with pytest.raises(ProvisioningError):
        provision(hosts, conn, vms, policy="spread")
    assert [_state(h, conn) for h in hosts] == befores


def test_dry_run_plan_changes_nothing_and_prints_a_diff(conn):
    host = SimHost.from_profile("t4x2")
    vms = VmRequest.pool(_prefix(), 2, gpu=Q2)
    before = _state(host, conn)
    r = provision(host, conn, vms, dry_run=True)
    assert r.applied is None and _state(host, conn) == before
    text = r.plan.format()
    assert text.count("+ create vGPU nvidia-231") == 2 and "+ define domain" in text and "+ start domain" in text
    provision(host, conn, vms[:1])
    text = provision(host, conn, vms, dry_run=True).plan.format()
    assert "= domain " + vms[0].name in text and text.count("+ create vGPU") == 1


def test_teardown_keeps_disks_and_is_rerunnable(conn, tmp_path):
    host = SimHost.from_profile("t4x2")
    disk = tmp_path / "d.qcow2"
    disk.write_bytes(b"x")
    vms = [VmRequest(_prefix(), gpus=(Q2,), disk=str(disk))]
    provision(host, conn, vms)
    assert teardown(host, conn, [vms[0].name]).ok
    assert disk.exists()
    again = teardown(host, conn, [vms[0].name])
    assert again.ok and again.removed == [] and "not found" in again.skipped[0]


def test_a_cut_during_rollback_reports_what_the_host_did_undo(conn):
    """Issue 27: the undo batch ran but its answer was lost; the rollback re-reads the host and reports the
    vGPUs it did remove as removed, not as "FAILED to undo" (2 of 2 were wrongly reported before)."""
    host = CutSimHost.from_profile("t4x2")
    vms = VmRequest.pool(_prefix(), 2, gpu=Q2)
    before = _state(host, conn)
    host.cut_at, host._writes = 2, 0          # write batch 1 creates the vGPUs; batch 2 is the rollback's undo
    conn.fail = ("define", vms[1].name)
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, vms)
    conn.fail = None
    removed = [r for r in ei.value.rollback if "removed vGPU" in r]
    assert len(removed) == 2 and all("the answer was lost; a re-read shows it done" in r for r in removed)
    assert not [r for r in ei.value.rollback if "FAILED" in r]
    assert _state(host, conn) == before


def test_a_cut_during_rollback_with_the_host_gone_says_failed(conn):
    host = CutSimHost.from_profile("t4x2")
    vms = VmRequest.pool(_prefix(), 2, gpu=Q2)
    host.cut_at, host._writes, host.cut_after_running, host.stay_down = 2, 0, False, True
    conn.fail = ("define", vms[1].name)
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, vms)
    conn.fail = None
    assert sum("FAILED to undo" in r for r in ei.value.rollback) == 2     # it could not look: it says so


def test_a_failure_in_the_last_host_step_leaves_the_host_as_before(conn):
    """The batch's last vGPU cannot be made (someone took the GPU's last instance after the plan): the seven
    made before it are removed, nothing was defined."""
    host = SimHost.from_profile("t4x2")
    vms = VmRequest.pool(_prefix(), 8, gpu=Q2)                  # binpack: all eight on GPU0 (a T4 holds 8 x 2Q)
    invs, doms = gather({host.name: host}, {host.name: conn})
    p = plan(invs, vms, domains=doms)
    creates = [s for s in p.steps if isinstance(s, CreateMdev)]
    assert len(creates) == 8 and {str(s.parent) for s in creates} == {"0000:3b:00.0"}
    assert next(s for s in p.steps if not isinstance(s, CreateMdev)).kind == "define"   # host steps first
    assert host.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create",
                                FOREIGN_UUID)]).ok
    before = _state(host, conn)
    with pytest.raises(ProvisioningError) as ei:
        apply(p, host, conn)
    err = ei.value
    assert str(creates[-1].uuid) in str(err.cause) or "no free instance" in str(err.cause)
    assert [c.split(": ", 1)[1] for c in err.completed] == [s.describe() for s in creates[:7]]
    assert sorted(r.split(": ", 1)[1] for r in err.rollback) == sorted(f"removed vGPU {s.uuid}" for s in creates[:7])
    assert _state(host, conn) == before


def test_a_failure_in_the_last_domain_step_leaves_the_host_as_before(conn):
    """The last step of a plan is the last VM's start: everything before it is undone, in reverse."""
    host = SimHost.from_profile("t4x2")
    foreign = _foreign(host, conn)
    vms = VmRequest.pool(_prefix(), 3, gpu=Q2)
    before = _state(host, conn)
    invs, doms = gather({host.name: host}, {host.name: conn})
    p = plan(invs, vms, domains=doms)
    assert (p.steps[-1].kind, p.steps[-1].vm) == ("start", vms[-1].name)
    conn.fail = ("start", vms[-1].name)
    with pytest.raises(ProvisioningError) as ei:
        apply(p, host, conn)
    err = ei.value
    assert len(err.completed) == len(p.steps) - 1
    assert len(err.rollback) == len(p.steps) - 1 and not any("FAILED" in r for r in err.rollback)
    assert _state(host, conn) == before and foreign in before[2]


def test_a_failure_in_the_last_step_of_teardown_is_reported_precisely(conn):
    """Teardown's last step is the last VM's undefine: it fails; the report names every step that ran (both
    VMs destroyed, both vGPUs removed, the first VM undefined) and the one that did not, and the host holds
    exactly that. Teardown puts nothing back: a rerun finishes."""
    host = SimHost.from_profile("t4x2")
    vms = VmRequest.pool(_prefix(), 2, gpu=Q2)
    a, b = (v.name for v in vms)
    provision(host, conn, vms)
    ua, ub = (str(mdev_uuid_for(n, 0)) for n in (a, b))
    conn.fail = ("undefine", b)
    r = teardown(host, conn, [a, b])
    h = host.name
    assert sorted(r.removed) == sorted([f"{h}: destroyed {a}", f"{h}: destroyed {b}", f"{h}: removed vGPU {ua}",
                                        f"{h}: removed vGPU {ub}", f"{h}: undefined {a}"])
    (failed,) = r.failed
    assert failed.startswith(f"{h}: {b}: ") and "undefine failed: injected" in failed
    assert sorted(d.split(": ", 1)[1] for d in r.report.done) == sorted([
        f"destroy domain {a}", f"destroy domain {b}", f"remove {ua}, made by vgpuvirt for {a}",
        f"remove {ub}, made by vgpuvirt for {b}", f"undefine domain {a}"])
    out = r.to_dict()
    assert out["failed"] == [failed] and out["done"] == r.report.done
    assert out["round_trips"] == {h: 1}                 # the one removal batch
    mdevs, _, doms = _state(host, conn)
    assert ua not in mdevs and ub not in mdevs and a not in doms and doms[b] is False
    conn.fail = None
    again = teardown(host, conn, [a, b])
    assert again.ok and again.removed == [f"{h}: undefined {b}"]
    assert b not in _state(host, conn)[2]
