"""Provisioning that first enables SR-IOV (an NVIDIA board whose vGPU types live on VFs) runs the preparation and the
plan on ONE runner per host: a failure of the plan's LAST step rolls back the plan and the preparation, and the
whole host is as before."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from host_state import diff, fail_last, host_state
from provision_fixtures import drop_test_domains

from vgpuvirt.errors import ProvisioningError
from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
from vgpuvirt.provision import VgpuRequest, VmRequest, provision
from vgpuvirt.sim import SimHost

PF = "0000:41:00.0"


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    c = LibvirtConnection("test:///default", retry=no_retry)
    yield c
    drop_test_domains(c)


def _vms(n: int) -> list[VmRequest]:
    return VmRequest.pool("p" + uuid.uuid4().hex[:6], n, gpu=VgpuRequest.parse("fb>=12G"), start=False)


def test_the_last_host_step_failing_undoes_the_plan_and_the_sriov_preparation(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("a10-sriov")
    start = host_state(host)
    vms = _vms(2)
    # the last host op of the plan: the second VM's vGPU (an mdev on its VF: the A10 is pre-vGPU-17) created
    with fail_last(host, lambda op: op.op == "write" and op.path is not None and op.path.endswith("/create")) \
            as failed, \
            pytest.raises(ProvisioningError, match="injected") as err:
        provision(host, conn, vms)
    assert len(failed) == 1
    assert err.value.completed[0] == f"sim:a10-sriov: set 32 SR-IOV VFs on {PF} (from 0)"
    assert err.value.rollback[-1] == f"sim:a10-sriov: set 0 SR-IOV VFs on {PF} again"   # the preparation last
    assert diff(start, host_state(host)) == []
    assert not any(conn.exists(v.name) for v in vms)


def test_the_last_libvirt_step_failing_undoes_everything_too(conn: LibvirtConnection,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    host = SimHost.from_profile("a10-sriov")
    start = host_state(host)
    vms = _vms(2)
    real = LibvirtConnection.define

    def define(self: LibvirtConnection, xml: str, *, name: str | None = None) -> object:
        if f"<name>{vms[-1].name}</name>" in xml:            # the plan's last step: the last VM's define
            from vgpuvirt.errors import VgpuvirtError
            raise VgpuvirtError("injected: libvirt refused the definition")
        return real(self, xml, name=name)

    monkeypatch.setattr(LibvirtConnection, "define", define)
    with pytest.raises(ProvisioningError, match="injected") as err:
        provision(host, conn, vms)
    assert f"sim:a10-sriov: set 0 SR-IOV VFs on {PF} again" in err.value.rollback
    assert diff(start, host_state(host)) == []
    assert not any(conn.exists(v.name) for v in vms)


def test_a_successful_run_reports_the_preparation_in_the_one_report(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("a10-sriov")
    r = provision(host, conn, _vms(1))
    assert r.applied is not None and r.applied.done[0] == f"sim:a10-sriov: set 32 SR-IOV VFs on {PF} (from 0)"
