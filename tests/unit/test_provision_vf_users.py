"""A vGPU-17 VF (SR-IOV VF typed through ``nvidia/current_vgpu_type``) that another domain's definition names is
that domain's, even while no type is set on it (its VM is off, or the host rebooted and the types went): the
planner gives a new VM another VF. Found on the suite's shared libvirtd: a leftover domain named the VF a new VM
was given, and detach then refused to reset it ("used by domain ...")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from provision_fixtures import drop_test_domains

from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import PciAddress
from vgpuvirt.provision import VgpuRequest, VmRequest, plan
from vgpuvirt.provision.run import gather
from vgpuvirt.provision.state import GpuUse, host_state
from vgpuvirt.sim import SimHost
from vgpuvirt.xml import PciHostdev, build_domain


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    c = LibvirtConnection("test:///default")
    yield c
    drop_test_domains(c)


def _vf_of_a_new_vm(host: SimHost, conn: LibvirtConnection) -> str:
    invs, doms = gather({host.name: host}, {host.name: conn})
    p = plan(invs, [VmRequest("new-" + uuid.uuid4().hex[:6], gpus=(VgpuRequest.parse("L40S-8Q"),))], domains=doms)
    (a,) = p.assignments
    assert a.kind is GpuUse.VENDOR_VF
    return str(a.slot)


def test_a_vf_another_definition_names_is_not_given_to_a_new_vm(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    first = _vf_of_a_new_vm(host, conn)
    other = "other-" + uuid.uuid4().hex[:6]
    conn.define(build_domain("compute", name=other, memory_mib=256, vcpus=1,
                             pci=[PciHostdev(PciAddress.parse(first))]).to_xml())
    assert not conn.is_active(other)                        # off: the VF carries no type now
    again = _vf_of_a_new_vm(host, conn)
    assert again != first
    invs, doms = gather({host.name: host}, {host.name: conn})
    hs = host_state(invs[host.name], doms[host.name])
    (slot,) = [s for g in hs.gpus for s in g.slots if str(s.address) == first and s.kind is GpuUse.VENDOR_VF]
    assert slot.blocked == f"used by domain {other}"

