"""NVIDIA vGPU 17+ (vendor-specific VFIO): current_vgpu_type on VFs, against every simulator profile."""

from __future__ import annotations

import errno

import pytest
from lifecycle_doubles import Wrapped

from vgpuvirt.errors import AlreadyExists, DeviceNotFound, NoCapacity
from vgpuvirt.model import PciAddress
from vgpuvirt.services.vgpu.vendor import VendorVgpuService
from vgpuvirt.sim import SimHost, list_profiles

L40S_PF = "0000:3d:00.0"
Q24, Q12, Q48 = 1155, 1153, 1156


def sim(profile: str = "l40s-vgpu17") -> Wrapped:
    return Wrapped(SimHost.from_profile(profile))


@pytest.mark.parametrize("profile", list_profiles())
def test_assign_release_and_idempotence_on_every_profile(profile: str) -> None:
    host = sim(profile)
    svc = VendorVgpuService(host)
    vfs = svc.vfs()
    free = [v for v in vfs if v.free and v.creatable_types]
    if not free:
        # no vGPU 17+ VF here: asking for one is a clear refusal and nothing is written
        with pytest.raises((NoCapacity, DeviceNotFound)):
            svc.assign(Q24)
        assert "apply" not in host.kinds()
        return
    v = free[0]
    type_id = v.creatable_types[0].id
    host.calls.clear()
    ch = svc.assign(type_id, pf=v.physfn)
    assert ch.changed and host.kinds() == ["read", "apply"]
    assert ch.data["vf"] == str(v.address)
    state = {x.address: x.current_type for x in svc.vfs()}
    assert state[v.address] == type_id
    # the same VF with the same type again: unchanged, nothing written
    host.calls.clear()
    assert not svc.assign(type_id, vf=v.address).changed and host.kinds() == ["read"]
    # every op touched only the VF's nvidia/current_vgpu_type: never the PF, never a driver file
    assert all(op.path == f"/sys/bus/pci/devices/{v.address}/nvidia/current_vgpu_type" for op in ch.ops)
    r1, r2 = svc.release(v.address), svc.release(v.address)
    assert r1.changed and not r2.changed
    assert [(o.op, o.state, o.value) for o in r1.ops] == [("write", None, "0"), ("wait", "equals", "0")]
    assert {x.address: x.current_type for x in svc.vfs()}[v.address] == 0


def test_the_pf_is_never_given_a_type() -> None:
    host = sim()
    with pytest.raises(DeviceNotFound, match="PF"):
        VendorVgpuService(host).assign(Q24, vf=L40S_PF)
    assert "apply" not in host.kinds()


def test_type_not_creatable_on_the_vf_is_refused_before_writing() -> None:
    host = sim()
    svc = VendorVgpuService(host)
    svc.assign(Q24, vf="0000:3d:00.4")
    # equal-size mode: with a 24 GB vGPU on the 48 GB L40S, a free VF offers 24 GB types only
    nxt = svc.vfs(L40S_PF)[1]
    assert {c.id for c in nxt.creatable_types} <= {1155, 1165}
    host.calls.clear()
    with pytest.raises(NoCapacity, match="not creatable on this VF"):
        svc.assign(Q12, vf=nxt.address)
    assert host.kinds() == ["read"]
    with pytest.raises(NoCapacity, match="no free VF"):
        svc.assign(Q48, pf=L40S_PF)
    # the second 24 GB slot is still there, then the GPU is full
    assert svc.assign(Q24, pf=L40S_PF).changed
    with pytest.raises(NoCapacity):
        svc.assign(Q24, pf=L40S_PF)


def test_a_vf_with_another_type_is_already_exists() -> None:
    svc = VendorVgpuService(sim())
    svc.assign(Q24, vf="0000:3d:00.4")
    with pytest.raises(AlreadyExists, match="already carries vGPU type 1155"):
        svc.assign(1165, vf="0000:3d:00.4")


def test_a_lost_race_for_a_free_vf_moves_on_to_the_next() -> None:
    host = sim()
    rival = VendorVgpuService(host.inner)
    host.before_apply = lambda ops: rival.assign(Q24, vf="0000:3d:00.4")
    ch = VendorVgpuService(host).assign(Q24, pf=L40S_PF)
    assert ch.changed and ch.data["vf"] != "0000:3d:00.4"
    got = {str(v.address): v.current_type for v in VendorVgpuService(host).vfs(L40S_PF) if v.current_type}
    assert got == {"0000:3d:00.4": Q24, ch.data["vf"]: Q24}


def test_rm_refusal_eio_is_no_capacity() -> None:
    host = sim()
    host.fail["/nvidia/current_vgpu_type"] = errno.EIO
    with pytest.raises(NoCapacity, match="EIO"):
        VendorVgpuService(host).assign(Q24, vf="0000:3d:00.4")


def test_release_that_lost_a_race_is_unchanged() -> None:
    host = sim()
    svc = VendorVgpuService(host)
    svc.assign(Q24, vf="0000:3d:00.4")
    host.before_apply = lambda ops: VendorVgpuService(host.inner).release("0000:3d:00.4")
    ch = svc.release("0000:3d:00.4")
    assert not ch.changed and ch.message == "already released"


def test_release_refuses_a_vf_a_domain_uses() -> None:
    from lifecycle_doubles import domain_xml

    from vgpuvirt.errors import DeviceBusy
    svc = VendorVgpuService(sim())
    svc.assign(Q24, vf="0000:3d:00.4")
    with pytest.raises(DeviceBusy):
        svc.release("0000:3d:00.4", domains=[("vm", domain_xml("vm", pci=["0000:3d:00.4"]))])


def test_dry_run_changes_nothing() -> None:
    host = sim()
    svc = VendorVgpuService(host)
    ch = svc.assign(Q24, pf=L40S_PF, dry_run=True)
    assert ch.dry_run and ch.changed and [o.op for o in ch.ops] == ["wait", "write", "wait"]
    assert ch.ops[0].timeout == 0 and ch.ops[0].value == "0", "the free-VF re-check under the lock"
    assert all(v.current_type == 0 for v in svc.vfs(L40S_PF))
    assert PciAddress.parse(ch.data["physfn"]) == PciAddress.parse(L40S_PF)
