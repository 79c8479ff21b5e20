"""SR-IOV VFs on every simulator profile: enable/disable through 0, wait, VF <-> PF, exclusivity; the change runs as
the change engine's SR-IOV step (``change.sriov.set_vf_count``), and a failure leaves the host as it was."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any

import pytest
from lifecycle_doubles import Wrapped, domain_xml

from vgpuvirt.change.sriov import set_vf_count
from vgpuvirt.errors import DeviceBusy, InvalidSpec, ProvisioningError
from vgpuvirt.host.base import BatchResult, Op, OpResult
from vgpuvirt.services.mutation import Change
from vgpuvirt.services.pci.sriov import SRIOV_MANAGE, SriovService
from vgpuvirt.services.vgpu.vendor import VendorVgpuService
from vgpuvirt.sim import SimHost, list_profiles


def sim(profile: str) -> Wrapped:
    return Wrapped(SimHost.from_profile(profile))


def enable(host: Any, pf: Any, count: Any = None, **kw: Any) -> Change:
    return set_vf_count(host, pf, count, **kw)[0]


def disable(host: Any, pf: Any, **kw: Any) -> Change:
    return set_vf_count(host, pf, 0, **kw)[0]


def physfn_map(host: Wrapped) -> dict[str, str]:
    snap = host.read(["/sys/bus/pci/devices/*/physfn"])
    return {p.split("/")[5]: (snap.link(p) or "").rsplit("/", 1)[-1] for p in snap}


@pytest.mark.parametrize("profile", list_profiles())
def test_enable_disable_idempotent_and_vf_pf_report(profile: str) -> None:
    host = sim(profile)
    svc = SriovService(host, vendor_tool=False)
    pfs = [p for p in svc.report() if not any(v.in_use for v in p.vfs)]
    if not svc.report():
        with pytest.raises(Exception, match="not an SR-IOV capable PF"):
            enable(host, "0000:00:00.0", 1, vendor_tool=False)
        return
    for pf in pfs:
        assert disable(host, pf.address, vendor_tool=False).changed == bool(pf.num_vfs)
        assert not disable(host, pf.address, vendor_tool=False).changed
        assert svc.report(pf.address)[0].vfs == ()
        want = max(1, pf.total_vfs // 2)
        host.calls.clear()
        ch = enable(host, pf.address, want, vendor_tool=False)
        assert ch.changed and host.kinds() == ["read", "apply"]
        assert not enable(host, pf.address, want, vendor_tool=False).changed
        info = svc.report(pf.address)[0]
        assert info.num_vfs == want and len(info.vfs) == want
        # VF <-> PF both ways: every virtfnN link's target has a physfn link back to the PF
        back = physfn_map(host)
        assert all(back[str(v.address)] == str(pf.address) for v in info.vfs)
        assert [v.index for v in info.vfs] == list(range(want))
        if pf.total_vfs != want:
            ch = enable(host, pf.address, vendor_tool=False)     # all of them: a non-zero count goes through 0 first
            assert [o.value for o in ch.ops if o.op == "write"] == ["0", str(pf.total_vfs)]
            assert svc.report(pf.address)[0].num_vfs == pf.total_vfs


def test_vfs_in_use_are_not_pulled_away_without_force() -> None:
    host = sim("l40s-vgpu17")
    VendorVgpuService(host).assign(1155, vf="0000:3d:00.4")
    svc = SriovService(host, vendor_tool=False)
    host.calls.clear()
    with pytest.raises(DeviceBusy, match=r"0000:3d:00\.4 carries vGPU type 1155"):
        disable(host, "0000:3d:00.0", vendor_tool=False)
    assert "apply" not in host.kinds()
    assert svc.report("0000:3d:00.0")[0].num_vfs == 16


def test_vf_used_by_a_domain_blocks_and_force_overrides_the_check() -> None:
    host = sim("desktop")
    svc = SriovService(host)
    enable(host, "0000:05:00.0", 2)
    vf = str(svc.report("0000:05:00.0")[0].vfs[0].address)
    doms = [("vm", domain_xml("vm", pci=[vf]))]
    with pytest.raises(DeviceBusy, match="used by domain vm"):
        enable(host, "0000:05:00.0", 4, domains=doms)
    assert enable(host, "0000:05:00.0", 4, domains=doms, force=True).changed


def test_a_pf_passed_through_whole_gets_no_vfs() -> None:
    host = sim("desktop")
    with pytest.raises(DeviceBusy, match="passed through whole"):
        enable(host, "0000:05:00.0", 2, domains=[("vm", domain_xml("vm", pci=["0000:05:00.0"]))])


def test_more_vfs_than_the_pf_supports_is_invalid() -> None:
    host = sim("desktop")
    with pytest.raises(InvalidSpec, match=r"0\.\.7"):
        enable(host, "0000:05:00.0", 8)
    assert "apply" not in host.kinds()


def test_nvidia_pf_uses_sriov_manage() -> None:
    host = sim("a10-sriov")
    svc = SriovService(host)
    plan = enable(host, "0000:41:00.0", dry_run=True)
    assert plan.ops[0].argv == (SRIOV_MANAGE, "-e", "0000:41:00.0") and plan.data["via"] == "sriov-manage"
    ch = enable(host, "0000:41:00.0")
    assert ch.changed and ch.data["via"] == "sriov-manage"
    assert svc.report("0000:41:00.0")[0].num_vfs == 32
    applies = [c[1] for c in host.calls if c[0] == "apply"]
    assert len(applies) == 1 and applies[0][0].op == "exec" and applies[0][0].argv[0] == SRIOV_MANAGE
    # a partial count cannot use the tool (it always enables all VFs)
    assert enable(host, "0000:41:00.0", 4, dry_run=True).ops[0].op == "write"


class NoVendorTool(Wrapped):
    """A host without /usr/lib/nvidia/sriov-manage: running it exits 127, as the shell says."""

    def apply(self, ops: Sequence[Op], **kw: Any) -> BatchResult:
        if ops and ops[0].op == "exec" and ops[0].argv and ops[0].argv[0] == SRIOV_MANAGE:
            self.calls.append(("apply", list(ops)))
            missing = OpResult(ops[0], False, errno=errno.ENOENT, error="not found", rc=127)
            return BatchResult((missing, *(OpResult(o, False, skipped=True) for o in ops[1:])))
        return super().apply(ops, **kw)


def test_nvidia_pf_falls_back_to_sysfs_when_sriov_manage_is_missing() -> None:
    host = NoVendorTool(SimHost.from_profile("a10-sriov"))
    svc = SriovService(host)
    ch = enable(host, "0000:41:00.0")
    assert ch.changed and ch.data["via"] == "sysfs"
    applies = [c[1] for c in host.calls if c[0] == "apply"]
    assert len(applies) == 2 and applies[1][0].path.endswith("/sriov_numvfs")
    assert svc.report("0000:41:00.0")[0].num_vfs == 32


def test_the_vendor_tool_is_not_used_on_a_tree_below_another_root() -> None:
    class Rooted(Wrapped):
        @property
        def sysfs_root(self) -> str:
            return "/mnt/tree"

    plan = enable(Rooted(SimHost.from_profile("a10-sriov")), "0000:41:00.0", dry_run=True)
    assert plan.ops[0].op == "write" and plan.data["via"] == "sysfs"


def test_the_last_step_of_sriov_enable_failing_leaves_the_host_as_before() -> None:
    """The last write (the new count, after the PF went through 0) is refused: the runner reads the PF again, finds
    it moved (0 VFs), sets the count it had back, and the whole host is as before."""
    from host_state import diff, fail_last, host_state
    host = SimHost.from_profile("desktop")
    enable(host, "0000:05:00.0", 2)
    start = host_state(host)
    with fail_last(host, lambda op: op.op == "write" and op.value == "4"), \
            pytest.raises(ProvisioningError, match="injected") as err:
        set_vf_count(host, "0000:05:00.0", 4)
    assert err.value.rollback == [f"{host.name}: set 2 SR-IOV VFs on 0000:05:00.0 again"]
    assert diff(start, host_state(host)) == []


def test_the_cli_reports_in_the_one_format(capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.cli import main
    assert main(["--host", "sim:desktop", "sriov", "enable", "0000:05:00.0", "-n", "2"]) == 0
    assert capsys.readouterr().out == "done: sim:desktop: set 2 SR-IOV VFs on 0000:05:00.0 (from 0)\n"
