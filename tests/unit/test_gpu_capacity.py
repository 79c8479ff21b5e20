"""The capacity model (services/capacity/budget): each GPU as one budget, counted by the documented rules,
and placement built on it. The simulated hosts are the referee: what a plan proposes, the simulated
kernel accepts (tests/property runs the same question over random requests)."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from provision_fixtures import drop_test_domains

from vgpuvirt.change.nvidia_mode import SetMixedSize
from vgpuvirt.errors import LibvirtError, NoCapacity, ProvisioningError
from vgpuvirt.host.base import Op
from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
from vgpuvirt.model import PciAddress
from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan, provision
from vgpuvirt.services.capacity.budget import GpuBudget, Place, Resident, VgpuType
from vgpuvirt.services.capacity.build import gpu_budgets
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.usage import GpuUse


@pytest.fixture
def conn():
    c = LibvirtConnection("test:///default", retry=no_retry)
    yield c
    drop_test_domains(c)


def _budget(profile: str, gpu: str) -> GpuBudget:
    return next(b for b in gpu_budgets(inventory(SimHost.from_profile(profile))) if str(b.address) == gpu)


def _pool(n: int, gpu: str) -> list[VmRequest]:
    return VmRequest.pool("c" + uuid.uuid4().hex[:6], n, gpu=VgpuRequest.parse(gpu), start=False)


# -- the rules, one GPU at a time ------------------------------------------------------------------


def test_equal_size_mode_counts_the_framebuffer_and_the_maximum() -> None:
    b = _budget("l40s-vgpu17", "0000:3d:00.0")
    assert (b.mode, b.sizing, b.framebuffer_mib) == ("free", "equal", 49152)
    f = b.fit("nvidia-1152")                                   # L40S-8Q
    assert f.fits_now == 6 and f.exact and "48 GiB, equal-size mode, 8 GiB type: max 6 per GPU" in f.reason
    one = b.with_vgpu("nvidia-1152", b.free_place("nvidia-1152").address)   # type: ignore[union-attr]
    assert one.fit("nvidia-1152").fits_now == 5 and one.mode is GpuUse.VENDOR_VF and one.to_dict()["mode"] == "vf-vgpu"
    refused = one.fit("nvidia-1148")                           # a 2 GiB type next to an 8 GiB one
    assert refused.fits_now == 0 and "equal-size mode: the GPU holds 1 vGPU(s) of 8 GiB" in refused.reason


def test_a_vf_is_needed_per_vgpu_on_sriov_boards() -> None:
    b = _budget("l40s-vgpu17", "0000:3d:00.0")                # 16 VFs enabled of 32
    f = b.fit("nvidia-1147")                                   # 1Q: 32 by framebuffer and VFs, 16 VFs here
    assert f.fits_now == 16 and "16 free VF(s) offer it" in f.reason


def test_no_free_vf_left_means_none_fit_though_the_framebuffer_has_room() -> None:
    b = _budget("l40s-vgpu17", "0000:3d:00.0")                # 16 VFs enabled, 48 GiB
    for _ in range(16):
        b = b.with_vgpu("nvidia-1147", b.free_place("nvidia-1147").address)   # type: ignore[union-attr]
    f = b.fit("nvidia-1147")                                   # 16 GiB of 1Q used, 32 GiB left, no VF
    assert f.fits_now == 0 and "0 free VF(s) offer it" in f.reason


def test_mixed_size_mode_counts_the_framebuffer_left() -> None:
    t8 = VgpuType("t8", "X-8Q", 8192, 6)
    t16 = VgpuType("t16", "X-16Q", 16384, 3)
    places = tuple(Place(f"vf{i}", "vendor-vf", True, {"t8": 1, "t16": 1}) for i in range(8))
    b = GpuBudget("h", PciAddress.parse("0000:01:00.0"), "nvidia", "free",
                  {"t8": t8, "t16": t16}, places, (), framebuffer_mib=49152, sizing="mixed")
    b = b.with_vgpu("t16", "vf0").with_vgpu("t16", "vf1")      # 32 GiB taken
    assert b.fit("t8").fits_now == 2 and b.fit("t16").fits_now == 1
    assert "mixed-size mode, 32 GiB in use" in b.fit("t8").reason


def test_a_vgpu_of_unknown_size_in_mixed_size_mode_leaves_the_count_to_the_host() -> None:
    # found by the capacity referee: an L40S in mixed-size mode holding 12Q and 24Q. The VFs list only the types
    # still creatable, so the 24Q's type number (1155) has no name here, and its 24 GiB were counted as 0:
    # twelve 3A (3 GiB) "fit" where 12 GiB are left, and the simulator refused the fifth with EIO.
    host = SimHost.from_profile("mixed")
    m = host.model
    gpu = m.devices["0000:3d:00.0"].gpu
    assert gpu is not None
    m.set_heterogeneous(gpu, True)
    m.set_vendor_type(m.devices["0000:3d:00.7"], "1153")
    m.set_vendor_type(m.devices["0000:3d:01.1"], "1155")
    b = next(b for b in gpu_budgets(inventory(host)) if str(b.address) == "0000:3d:00.0")
    assert b.types["nvidia-1155"].framebuffer_mib is None
    f = b.fit("nvidia-1159")
    assert (f.fits_now, f.exact) == (1, False)
    assert f.reason.startswith("mixed-size mode, framebuffer in use unknown (a vGPU of type nvidia-1155 of unknown "
                               "size): the host is the only authority")
    one = b.with_vgpu("nvidia-1159", b.free_place("nvidia-1159").address)   # type: ignore[union-attr]
    assert one.fit("nvidia-1159").fits_now == 0
    # five 3A: not five on this GPU, but the other L40S's VFs enabled first, then the five placed
    vms = [VmRequest(f"vm-{i}", gpus=(VgpuRequest(type="NVIDIA L40S-3A"),)) for i in range(5)]
    p = plan([inventory(host)], vms)
    assert [str(prep.pf) for prep in p.prep] == ["0000:41:00.0"] and len(p.pending) == 5 and not p.assignments
    assert ("0000:3d:00.0: nvidia-1159: mixed-size mode, framebuffer in use unknown (a vGPU of type nvidia-1155 of "
            "unknown size): the host is the only authority and one more is already planned here") in p.unmet


def test_mig_backed_types_count_gpu_instances() -> None:
    b = _budget("a100-sriov", "0000:17:00.0")                  # MIG on: 3 x 2g.20gb and 1 x 1g.10gb instances
    assert b.mig_enabled and b.gpu_instances == {"2g.20gb": 3, "1g.10gb": 1}
    assert b.fit("nvidia-700").fits_now == 3                   # A100D-2-20C
    assert b.fit("nvidia-699").fits_now == 1                   # A100D-1-10C
    assert b.fit("nvidia-692").fits_now == 0 and "MIG mode is on" in b.fit("nvidia-692").reason
    off = _budget("a100-sriov", "0000:65:00.0")
    assert off.fit("nvidia-700").fits_now == 0 and "MIG mode is off" in off.fit("nvidia-700").reason


def test_gvtg_pool_takes_the_kernels_count_then_estimates() -> None:
    host = SimHost.from_profile("gvtg")
    inv = inventory(host)
    (b,) = [x for x in gpu_budgets(inv) if x.mode is GpuUse.GVTG]
    parent = inv.mdev_parents[0]
    for t in parent.types:                                     # the kernel's figure, exactly
        assert b.fit(t.id).fits_now == t.available_instances and b.fit(t.id).exact


def test_the_host_is_the_authority_when_the_rules_cannot_count() -> None:
    # issue 22: the kernel's available_instances, exactly (it used to be capped at 1)
    t, u = VgpuType("t", "unknown", None, None), VgpuType("u", "other", None, None)
    b = GpuBudget("h", PciAddress.parse("0000:01:00.0"), "nvidia", "free",
                  {"t": t, "u": u}, (Place("0000:01:00.0", "mdev", False, {"t": 5, "u": 2}),), sizing="equal")
    f = b.fit("t")
    assert (f.fits_now, f.exact) == (5, False) and "the host's own count: 5 available" in f.reason
    assert b.with_vgpu("t", "0000:01:00.0").fit("t").fits_now == 4       # each planned one takes one
    assert b.with_vgpu("u", "0000:01:00.0").fit("t").fits_now == 0       # how types share it: unknown


def test_capacity_section_in_the_inventory_json() -> None:
    d = inventory(SimHost.from_profile("l40s-vgpu17")).to_dict()
    cap = d["gpus"][0]["capacity"]
    assert cap["mode"] == "free" and cap["sizing"] == "equal" and cap["budget"]["framebuffer_mib"] == 49152
    row = next(t for t in cap["types"] if t["id"] == "nvidia-1152")
    assert row["fits_now"] == 6 and row["exact"] is True
    assert cap["used"]["vgpus"] == 0


def test_the_capacity_json_counts_the_vgpus_on_the_gpu() -> None:
    host = SimHost.from_profile("t4x2")
    assert host.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-232/create",
                                str(uuid.uuid4()))]).ok
    caps = {g["address"]: g["capacity"] for g in inventory(host).to_dict()["gpus"]}
    assert (caps["0000:3b:00.0"]["used"]["vgpus"], caps["0000:d8:00.0"]["used"]["vgpus"]) == (1, 0)


def test_existing_vgpus_are_residents() -> None:
    host = SimHost.from_profile("t4x2")
    assert host.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-232/create",
                                str(uuid.uuid4()))]).ok
    inv = inventory(host)
    b = next(x for x in gpu_budgets(inv) if str(x.address) == "0000:3b:00.0")
    assert b.mode is GpuUse.MDEV and b.to_dict()["mode"] == "mdev-vgpu"
    assert b.residents == (Resident("nvidia-232", 4096, "0000:3b:00.0", None),)
    assert b.fit("nvidia-232").fits_now == 3 and b.fit("nvidia-231").fits_now == 0


# -- the issue's four cases, end to end on the simulated hosts -------------------------------------


def test_eight_l40s_8q_land_as_six_plus_two(conn) -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    r = provision(host, conn, _pool(8, "L40S-8Q"))
    per_gpu: dict[str, int] = {}
    for a in r.plan.assignments:
        per_gpu[str(a.gpu)] = per_gpu.get(str(a.gpu), 0) + 1
    assert per_gpu == {"0000:3d:00.0": 6, "0000:bd:00.0": 2}
    assert r.applied is not None
    assert sum(1 for v in inventory(host).vendor_vgpu if v.current_type == 1152) == 8
    chosen = [c for c in r.plan.explain if c.verdict == "chosen"]
    assert "48 GiB, equal-size mode, 8 GiB type: max 6 per GPU" in chosen[0].reason
    skipped = [c for c in r.plan.explain if c.verdict == "skipped" and c.gpu == "0000:3d:00.0"]
    assert skipped and "6 in use: 0 fit" in skipped[0].reason


def test_desktop_passthrough_never_picks_a_blocked_group() -> None:
    inv = inventory(SimHost.from_profile("desktop"))
    p = plan([inv], VmRequest.pool("g", 1, gpu=VgpuRequest(mode="passthrough"), template="gaming", start=False))
    assert [str(a.gpu) for a in p.assignments] == ["0000:01:00.0"]
    assert [str(f) for f in p.assignments[0].functions] == ["0000:01:00.0", "0000:01:00.1"]
    why = {c.gpu: c for c in p.explain}
    assert why["0000:02:00.0"].verdict == "skipped" and "Ethernet controller" in why["0000:02:00.0"].reason
    assert "boot VGA" in why["0000:00:02.0"].reason
    with pytest.raises(NoCapacity) as ei:
        plan([inv], VmRequest.pool("g", 2, gpu=VgpuRequest(mode="passthrough"), template="gaming", start=False))
    msg = str(ei.value)
    assert "0000:02:00.0: not passed through whole: IOMMU check: group 8 also holds 0000:03:00.0" in msg
    assert "0000:00:02.0: boot VGA device" in msg and "0000:01:00.0: whole GPU planned for passthrough" in msg


def test_boot_vga_is_taken_only_when_asked() -> None:
    inv = inventory(SimHost.from_profile("desktop"))
    vms = [VmRequest("a", gpus=(VgpuRequest(mode="passthrough"),), template="gaming", start=False),
           VmRequest("b", gpus=(VgpuRequest.parse("mode=passthrough,boot_vga=yes"),), template="gaming", start=False)]
    p = plan([inv], vms)
    assert {a.vm: str(a.gpu) for a in p.assignments} == {"a": "0000:01:00.0", "b": "0000:00:02.0"}


def test_the_mixed_size_switch_counts_as_done_only_on_a_gpu_in_mixed_size_mode() -> None:
    # what a rerun after a cut batch asks: is the switch already made? Not while the GPU is equal-size.
    from vgpuvirt.provision.state import host_state
    from vgpuvirt.services.mutation import apply_items
    host = SimHost.from_profile("l40s-vgpu17")
    step = SetMixedSize(host.name, "vm", PciAddress.parse("0000:3d:00.0"))
    assert not step.done_in(host_state(inventory(host)))
    assert apply_items(host, [step.item(5.0)])[0].ok
    assert step.done_in(host_state(inventory(host)))


def test_heterogeneous_switches_an_idle_gpu_and_the_host_accepts(conn) -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    vms = [VmRequest("h8", gpus=(VgpuRequest.parse("L40S-8Q"),), start=False),
           VmRequest("h2", gpus=(VgpuRequest.parse("L40S-2Q"),), start=False)]
    r = provision(host, conn, vms, heterogeneous=True)
    steps = r.plan.steps
    assert isinstance(steps[0], SetMixedSize) and str(steps[0].gpu) == "0000:3d:00.0"
    assert {str(a.gpu) for a in r.plan.assignments} == {"0000:3d:00.0"}
    assert host.run(["nvidia-smi", "-q", "-x"]).stdout.count("<vgpu_heterogeneous_mode>Enabled") == 1
    # Without --heterogeneous the sizes go to separate GPUs (equal-size mode stays).
    other = SimHost.from_profile("l40s-vgpu17")
    r2 = plan([inventory(other)], [replace(v, name=v.name + "x") for v in vms])
    assert len({str(a.gpu) for a in r2.assignments}) == 2 and not any(isinstance(s, SetMixedSize) for s in r2.steps)


def test_a_failed_run_switches_the_gpu_back(conn) -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    vms = [VmRequest("m8", gpus=(VgpuRequest.parse("L40S-8Q"),), start=False),
           VmRequest("m2", gpus=(VgpuRequest.parse("L40S-2Q"),), start=False)]
    p = plan([inventory(host)], vms, heterogeneous=True)

    class RefusingConn(LibvirtConnection):
        def define(self, xml: str, *, name: str | None = None) -> str:
            raise LibvirtError("define failed: injected", domain="m2", code=1, uri=self.uri)

    with pytest.raises(ProvisioningError) as ei:
        apply(p, host, RefusingConn("test:///default", retry=no_retry))
    assert ei.value.rollback[-1].endswith("switched GPU 0000:3d:00.0 back to equal-size mode")
    assert "<vgpu_heterogeneous_mode>Enabled" not in host.run(["nvidia-smi", "-q", "-x"]).stdout
    assert not any(v.current_type for v in inventory(host).vendor_vgpu)


def test_sriov_off_is_planned_as_vf_enablement_and_applied(conn) -> None:
    host = SimHost.from_profile("a10-sriov")
    vms = _pool(2, "fb>=2G,series=Q")
    p = plan([inventory(host)], vms)
    assert [x.describe() for x in p.prep] == ["enable 32 SR-IOV VFs on 0000:41:00.0 (its vGPU types appear on the VFs)"]
    assert p.pending == [v.name for v in vms] and not p.steps
    r = provision(host, conn, vms)
    assert r.applied is not None and [a.type.id for a in r.plan.assignments] == ["nvidia-591", "nvidia-591"]
    assert inventory(host).gpus[0].sriov_numvfs == 32


def test_sriov_enablement_is_undone_when_nothing_fits_after_it(conn) -> None:
    host = SimHost.from_profile("a10-sriov")
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, _pool(1, "fb>=48G"))                   # no A10 type is that large
    assert isinstance(ei.value.cause, NoCapacity) and "no type fits" in str(ei.value.cause)
    assert ei.value.rollback == ["sim:a10-sriov: set 0 SR-IOV VFs on 0000:41:00.0 again"]
    assert not inventory(host).gpus[0].sriov_numvfs                 # disabled again


def test_nothing_fits_names_every_gpu_with_its_budget_reason() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    with pytest.raises(NoCapacity) as ei:
        plan([inv], _pool(3, "T4-16Q"))
    msg = str(ei.value)
    for gpu in ("0000:3b:00.0", "0000:d8:00.0"):
        assert f"{gpu}: nvidia-234: 16 GiB, equal-size mode, 16 GiB type: max 1 per GPU, 1 in use: 0 fit" in msg
