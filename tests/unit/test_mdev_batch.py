"""Batch operations of the device services (``create_many``/``remove_many``, ``assign_many``/
``release_many``): one read and one locked batch for many devices, the single-item checks made
for every item, per-item status, and the provisioning layer using the same ops."""

from __future__ import annotations

import errno

import pytest
from lifecycle_doubles import RecordingHost, Wrapped, domain_xml, mdev_types

from vgpuvirt.change.mdev_service import MdevService, MdevSpec
from vgpuvirt.errors import (
    AlreadyExists,
    DeviceBusy,
    InvalidSpec,
    NoCapacity,
    ProvisioningError,
    WriteFailed,
)
from vgpuvirt.model import MdevUuid
from vgpuvirt.services.vgpu.vendor import AssignSpec, VendorVgpuService
from vgpuvirt.sim import SimHost

GPU0, GPU1 = "0000:3b:00.0", "0000:d8:00.0"
L40S_PF = "0000:3d:00.0"
Q24 = 1155
U = [f"11111111-2222-4333-8444-00000000000{i}" for i in range(6)]


def sim(profile: str = "t4x2") -> Wrapped:
    return Wrapped(SimHost.from_profile(profile))


def active(host: Wrapped) -> set[str]:
    return {str(r.uuid) for r in MdevService(host.inner).list()}


def test_create_many_is_one_read_and_one_batch_then_idempotent() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    specs = [MdevSpec.of(GPU0, "nvidia-231", U[0]), MdevSpec.of(GPU1, "nvidia-231", U[1]),
             MdevSpec.of(GPU1, "nvidia-231", U[2])]
    res = svc.create_many(specs)
    assert host.kinds() == ["read", "apply"]
    assert [r.ok and r.unwrap().changed for r in res] == [True, True, True]
    assert active(host) == set(U[:3])
    assert {(r.unwrap().data["parent"], r.target) for r in res} == {(GPU0, U[0]), (GPU1, U[1]), (GPU1, U[2])}
    host.calls.clear()
    again = svc.create_many(specs)
    assert host.kinds() == ["read"] and not any(r.unwrap().changed for r in again)


def test_capacity_is_prechecked_for_the_whole_batch_before_anything_is_written() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    before = mdev_types(host)
    host.calls.clear()
    # a T4 offers 2 of T4-8Q (nvidia-233): 3 in one batch are refused up front, even the first two
    with pytest.raises(NoCapacity, match="3 asked, 2 available"):
        svc.create_many([MdevSpec.of(GPU1, "nvidia-233", u) for u in U[:3]])
    assert host.kinds() == ["read"] and mdev_types(host) == before


def test_mdevctl_checks_apply_to_every_item() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    svc.create(GPU0, "nvidia-231", U[0])
    host.calls.clear()
    with pytest.raises(AlreadyExists, match="different parent"):
        svc.create_many([MdevSpec.of(GPU1, "nvidia-231", U[1]), MdevSpec.of(GPU1, "nvidia-231", U[0])])
    assert "apply" not in host.kinds() and active(host) == {U[0]}


def test_a_uuid_twice_in_one_batch_is_refused_before_reaching_the_host() -> None:
    rec = RecordingHost()
    with pytest.raises(InvalidSpec, match="once per batch"):
        MdevService(rec).create_many([MdevSpec.of(GPU0, "nvidia-231", U[0]), MdevSpec.of(GPU1, "nvidia-231", U[0])])
    with pytest.raises(InvalidSpec):
        VendorVgpuService(rec).assign_many([AssignSpec.of(Q24, vf="0000:3d:00.4")] * 2)
    with pytest.raises(InvalidSpec):
        VendorVgpuService(rec).release_many(["0000:3d:00.4", "0000:3d:00.4"])
    assert rec.calls == []


def test_a_race_lost_under_the_lock_is_that_items_error_and_stops_the_rest() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    rival = MdevService(host.inner, mdevctl=None)
    # our read sees GPU1's one T4-16Q free; a rival takes it between our read and our batch
    host.before_apply = lambda ops: rival.create(GPU1, "nvidia-234", U[5])
    res = svc.create_many([MdevSpec.of(GPU0, "nvidia-231", U[0]), MdevSpec.of(GPU1, "nvidia-234", U[1]),
                           MdevSpec.of(GPU0, "nvidia-231", U[2])])
    assert res[0].ok and res[0].unwrap().changed
    assert isinstance(res[1].error, NoCapacity) and "concurrent" in str(res[1].error) and not res[1].skipped
    assert res[2].skipped and not res[2].ok
    with pytest.raises(NoCapacity):
        res[1].unwrap()
    assert active(host) == {U[0], U[5]}


def test_remove_many_one_batch_with_absent_and_vanished_items() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    svc.create_many([MdevSpec.of(GPU0, "nvidia-231", u) for u in U[:3]])
    host.calls.clear()
    host.before_apply = lambda ops: MdevService(host.inner, mdevctl=None).remove(U[1])
    res = svc.remove_many([U[0], U[1], U[2], U[3]])
    assert host.kinds() == ["read", "apply"]
    assert [(r.unwrap().changed, r.unwrap().message) for r in res] == [
        (True, "removed"), (False, "already gone"), (True, "removed"), (False, "already absent")]
    assert active(host) == set()


def test_remove_many_refuses_a_device_a_domain_uses_before_writing() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    svc.create_many([MdevSpec.of(GPU0, "nvidia-231", u) for u in U[:2]])
    host.calls.clear()
    with pytest.raises(DeviceBusy, match="vm1"):
        svc.remove_many(U[:2], domains=[("vm1", domain_xml("vm1", mdevs=[U[1]]))])
    assert host.kinds() == ["read"] and active(host) == set(U[:2])


def test_remove_many_keeps_going_after_one_failure() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    svc.create_many([MdevSpec.of(GPU0, "nvidia-231", u) for u in U[:2]])
    host.calls.clear()
    inner_apply = host.inner.apply

    def fail_first(ops, **kw):       # the kernel refuses the first remove with EIO; the second still runs
        from vgpuvirt.host.base import BatchResult, OpResult
        assert [o.op for o in ops[:2]] == ["write", "wait"]
        first = OpResult(ops[0], False, errno=errno.EIO, error="injected")
        rest = inner_apply(list(ops[2:]), **kw).results
        return BatchResult((first, OpResult(ops[1], False, skipped=True), *rest))

    host.inner.apply = fail_first
    res = svc.remove_many(U[:2])
    assert isinstance(res[0].error, WriteFailed) and "EIO" in str(res[0].error)
    assert res[1].ok and res[1].unwrap().changed
    host.inner.apply = inner_apply
    assert active(host) == {U[0]}


def test_assign_many_picks_distinct_vfs_in_one_round_and_reports_each() -> None:
    host = sim("l40s-vgpu17")
    svc = VendorVgpuService(host)
    res = svc.assign_many([AssignSpec.of(Q24, pf=L40S_PF) for _ in range(3)])
    assert host.kinds() == ["read", "apply"]
    # a 48 GB L40S holds two 24 GB vGPUs: the third VF's write is refused by the driver (EIO)
    assert [r.ok for r in res] == [True, True, False]
    assert isinstance(res[2].error, NoCapacity) and "EIO" in str(res[2].error)
    vfs = [r.unwrap().data["vf"] for r in res[:2]]
    assert len(set(vfs)) == 2
    got = {str(v.address): v.current_type for v in svc.vfs(L40S_PF) if v.current_type}
    assert got == dict.fromkeys(vfs, Q24)


def test_assign_many_retries_only_the_item_that_lost_its_vf() -> None:
    host = sim("l40s-vgpu17")
    first = VendorVgpuService(host.inner).vfs(L40S_PF)[0].address
    rival = VendorVgpuService(host.inner)
    host.before_apply = lambda ops: rival.assign(Q24, vf=first)
    res = VendorVgpuService(host).assign_many([AssignSpec.of(Q24, pf=L40S_PF)])
    assert host.kinds() == ["read", "apply", "read", "apply"]
    assert res[0].ok and res[0].unwrap().data["vf"] != str(first)


def test_release_many_one_batch_and_a_concurrent_release_is_unchanged() -> None:
    host = sim("l40s-vgpu17")
    svc = VendorVgpuService(host)
    vfs = [r.target for r in svc.assign_many([AssignSpec.of(Q24, pf=L40S_PF) for _ in range(2)])]
    host.calls.clear()
    host.before_apply = lambda ops: VendorVgpuService(host.inner).release(vfs[0])
    res = svc.release_many(vfs)
    assert host.kinds() == ["read", "apply"]
    assert [(r.unwrap().changed, r.unwrap().message) for r in res] == [(False, "already released"),
                                                                        (True, "released")]
    assert all(v.current_type == 0 for v in svc.vfs(L40S_PF))


def test_single_item_methods_are_the_batch_of_one() -> None:
    host = sim()
    svc = MdevService(host, mdevctl=None)
    one = svc.create(GPU0, "nvidia-231", U[0], dry_run=True)
    many = svc.create_many([MdevSpec.of(GPU0, "nvidia-231", U[0])], dry_run=True)[0].unwrap()
    assert one == many and one.ops and "apply" not in host.kinds()


def test_provision_maps_a_vf_write_error_like_the_service_does() -> None:
    """provision's device batch uses the services' ops and errno mapping: the RM refusing a vGPU
    type (EIO) is NoCapacity there too, and nothing is left behind."""
    pytest.importorskip("libvirt")
    from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
    from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan
    from vgpuvirt.services.inventory.read import inventory

    host = sim("l40s-vgpu17")
    vms = VmRequest.pool("b" + MdevUuid.generate().value[:6], 2, gpu=VgpuRequest())
    p = plan({host.name: inventory(host.inner)}, vms)
    assert "set-vf-type" in {s.kind for s in p.steps}
    host.fail["/nvidia/current_vgpu_type"] = errno.EIO
    conn = LibvirtConnection("test:///default", retry=no_retry)
    try:
        with pytest.raises(ProvisioningError) as ei:
            apply(p, {host.name: host}, conn)
        assert not any(conn.exists(v.name) for v in vms)
    finally:
        conn.close()
    assert isinstance(ei.value.cause, NoCapacity) and "EIO" in str(ei.value.cause)
    assert all(v.current_type == 0 for v in VendorVgpuService(host.inner).vfs())
