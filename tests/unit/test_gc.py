"""Garbage collection of vGPUs no domain references (dry run by default)."""

from __future__ import annotations

import pytest
from lifecycle_doubles import Wrapped, domain_xml

from vgpuvirt.change.mdev_service import MdevService
from vgpuvirt.services.vgpu import gc
from vgpuvirt.services.vgpu.vendor import VendorVgpuService
from vgpuvirt.sim import SimHost, list_profiles

U1 = "11111111-2222-4333-8444-555555555551"
U2 = "11111111-2222-4333-8444-555555555552"


def test_orphan_mdevs_and_vf_types_are_listed_then_removed_only_when_asked() -> None:
    host = Wrapped(SimHost.from_profile("mixed"))
    mdev = MdevService(host)
    snap = host.read(["/sys/class/mdev_bus/*/mdev_supported_types/*/available_instances"])
    free = [p.split("/") for p in snap if (snap.int(p) or 0) > 0]
    mdev.create(free[0][4], free[0][6], U1)
    mdev.create(free[0][4], free[0][6], U2)
    vendor = VendorVgpuService(host)
    used_vf = vendor.assign(vendor.vfs()[0].creatable_types[0].id, pf=vendor.vfs()[0].physfn).data["vf"]
    free_vfs = [v for v in vendor.vfs() if v.free and v.creatable_types]
    orphan_vf = vendor.assign(free_vfs[0].creatable_types[0].id, vf=free_vfs[0].address).data["vf"]
    doms = [("vm1", domain_xml("vm1", mdevs=[U1], pci=[used_vf])), ("vm2", domain_xml("vm2"))]

    host.calls.clear()
    dry = gc.collect(host, doms)
    assert dry.dry_run and dry.changed and host.kinds() == ["read"]
    assert {(o["kind"], o["id"]) for o in dry.data["orphans"]} == {("mdev", U2), ("vf", orphan_vf)}
    assert {str(r.uuid) for r in mdev.list()} >= {U1, U2}

    done = gc.collect(host, doms, dry_run=False)
    assert done.changed and set(done.data["removed"]) == {U2, orphan_vf} and not done.data["failed"]
    assert U2 not in {str(r.uuid) for r in mdev.list()} and U1 in {str(r.uuid) for r in mdev.list()}
    types = {str(v.address): v.current_type for v in vendor.vfs()}
    assert types[orphan_vf] == 0 and types[used_vf] != 0
    again = gc.collect(host, doms, dry_run=False)
    assert not again.changed and again.data["orphans"] == []


@pytest.mark.parametrize("profile", list_profiles())
def test_every_profile_starts_without_orphans_it_cannot_explain(profile: str) -> None:
    host = SimHost.from_profile(profile)
    orphans = gc.find_orphans(host, [])
    # with no domains, every pre-existing vGPU of the profile is an orphan, and nothing else is
    active = {str(r.uuid) for r in MdevService(host).list()}
    typed = {str(v.address) for v in VendorVgpuService(host).vfs() if v.current_type > 0}
    assert {o.id for o in orphans} == active | typed
