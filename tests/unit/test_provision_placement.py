"""Placement: binpack/spread over GPUs and hosts, NUMA, equal-size, heterogeneous, PF/VF, explanations."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from provision_fixtures import desktop_host, l40s_host, t4_host

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.provision.placement import place
from vgpuvirt.provision.request import NicRequest, VgpuRequest, VmRequest
from vgpuvirt.provision.state import host_states

Q2 = VgpuRequest(type="nvidia-231")


def _states(*invs, **kw):
    return host_states(list(invs), **kw)


def test_binpack_fills_one_gpu_before_the_next():
    hs = _states(t4_host())
    got, _, _ = place(VmRequest.pool("vdi", 10, gpu=Q2), hs)
    per_gpu = Counter(str(a.gpu) for a in got)
    assert per_gpu == {"0000:3b:00.0": 8, "0000:d8:00.0": 2}   # a T4 holds 8 x 2Q


def test_spread_alternates_gpus_and_hosts():
    hs = _states(t4_host("a"), t4_host("b"))
    got, _, _ = place(VmRequest.pool("vdi", 8, gpu=Q2), hs, policy="spread")
    assert Counter(a.host for a in got) == {"a": 4, "b": 4}
    assert Counter((a.host, str(a.gpu)) for a in got) == {
        ("a", "0000:3b:00.0"): 2, ("a", "0000:d8:00.0"): 2, ("b", "0000:3b:00.0"): 2, ("b", "0000:d8:00.0"): 2}


def test_binpack_across_hosts_fills_the_first_host_first():
    hs = _states(t4_host("a"), t4_host("b"))
    got, _, _ = place(VmRequest.pool("vdi", 17, gpu=Q2), hs)
    assert Counter(a.host for a in got) == {"a": 16, "b": 1}


def test_capacity_is_counted_across_the_plan_and_overflow_is_refused_with_reasons():
    hs = _states(t4_host())
    with pytest.raises(NoCapacity) as ei:
        place(VmRequest.pool("vdi", 17, gpu=Q2), hs)
    assert "vdi-017" in str(ei.value)
    assert "no free instance" in str(ei.value) or "in use" in str(ei.value)


def test_equal_size_rule_keeps_sizes_apart():
    # GPU0 already holds one 2Q: a 4Q request must go to GPU1, a 2Q may join GPU0.
    inv = t4_host(mdevs=(("a1b2c3d4-0000-4000-8000-000000000001", "0000:3b:00.0", "nvidia-231"),))
    hs = _states(inv)
    got, why, _ = place([VmRequest("big", gpus=(VgpuRequest(type="nvidia-232"),)), VmRequest("small", gpus=(Q2,))], hs)
    by = {a.vm: str(a.gpu) for a in got}
    assert by == {"big": "0000:d8:00.0", "small": "0000:3b:00.0"}
    skipped = [c for c in why if c.vm == "big" and c.verdict == "skipped"]
    assert skipped and "equal-size" in skipped[0].reason


def test_need_based_request_takes_smallest_type_the_gpu_still_allows():
    hs = _states(t4_host(gpus=(("0000:3b:00.0", 0),)))
    got, _, _ = place([VmRequest("a", gpus=(Q2,)), VmRequest("b", gpus=(VgpuRequest(min_framebuffer_mib=1024,
                                                                                   series="Q"),))], hs)
    # 1Q would be smallest, but the GPU already gets a 2Q: equal-size forces 2Q for b.
    assert [a.type.id for a in got] == ["nvidia-231", "nvidia-231"]


def test_heterogeneous_is_refused_on_a_gpu_without_mixed_size_mode():
    # A T4 (vGPU <= 16, no SR-IOV) runs equal-size mode only: --heterogeneous cannot mix sizes on it, and
    # the refusal says so instead of planning what the driver refuses.
    from vgpuvirt.provision.plan import plan
    from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts

    inv = t4_host(gpus=(("0000:3b:00.0", 0),))
    facts = NvidiaGpuFacts("nvidia-smi", inv.gpus[0].address, memory_total_mib=16384, host_vgpu_mode="Non SR-IOV",
                           vgpu_heterogeneous_mode="Disabled")
    inv = replace(inv, gpus=[replace(inv.gpus[0], nvidia=facts)])
    vms = [VmRequest("a", gpus=(VgpuRequest(type="nvidia-232"),), start=False), VmRequest("b", gpus=(Q2,), start=False)]
    with pytest.raises(NoCapacity) as ei:
        plan([inv], vms, heterogeneous=True)
    msg = str(ei.value)
    assert "b: no GPU can serve" in msg and "equal-size mode" in msg and "no mixed-size mode" in msg


def test_numa_preference_and_strictness():
    hs = _states(t4_host())
    got, why, _ = place([VmRequest("n1", gpus=(Q2,), numa_node=1)], hs)
    assert str(got[0].gpu) == "0000:d8:00.0"
    assert any(c.verdict == "chosen" and "same NUMA node" in c.reason for c in why)
    hs = _states(t4_host(gpus=(("0000:3b:00.0", 0),)))
    got, _, _ = place([VmRequest("n2", gpus=(Q2,), numa_node=1)], hs)     # preference only: still placed
    assert str(got[0].gpu) == "0000:3b:00.0"
    with pytest.raises(NoCapacity) as ei:
        place([VmRequest("n3", gpus=(Q2,), numa_node=1, numa_strict=True)],
              _states(t4_host(gpus=(("0000:3b:00.0", 0),))))
    assert "NUMA node 0" in str(ei.value)


def test_vendor_specific_vfs_one_vgpu_per_vf_and_smallest_type():
    hs = _states(l40s_host(nvfs=3, taken={0: 1148}))
    got, _, hs = place(VmRequest.pool("g", 2, gpu=VgpuRequest(min_framebuffer_mib=2048, series="Q")), hs)
    assert [a.kind for a in got] == ["vendor-vf", "vendor-vf"]
    assert [a.type.id for a in got] == ["nvidia-1148", "nvidia-1148"]
    assert len({a.slot for a in got}) == 2 and all(str(a.slot) != "0000:41:00.4" for a in got)
    with pytest.raises(NoCapacity):
        place([VmRequest("g-3", gpus=(VgpuRequest(type="nvidia-1148"),))], hs)


def test_vendor_vf_equal_size_rule():
    hs = _states(l40s_host(nvfs=3, taken={0: 1148}))
    with pytest.raises(NoCapacity) as ei:
        place([VmRequest("big", gpus=(VgpuRequest(type="nvidia-1152"),))], hs)
    assert "equal-size" in str(ei.value)


def test_passthrough_and_pf_vf_exclusivity():
    hs = _states(desktop_host())
    got, _, hs = place([VmRequest("game", gpus=(VgpuRequest(mode="passthrough"),), template="gaming")], hs)
    assert got[0].kind == "whole" and [str(f) for f in got[0].functions] == ["0000:01:00.0", "0000:01:00.1"]
    with pytest.raises(NoCapacity) as ei:
        place([VmRequest("game2", gpus=(VgpuRequest(mode="passthrough"),))], hs)
    assert "passthrough" in str(ei.value)
    # a GPU with vGPUs cannot be passed through whole, and the other way round
    inv = t4_host(gpus=(("0000:3b:00.0", 0),),
                  mdevs=(("a1b2c3d4-0000-4000-8000-000000000001", "0000:3b:00.0", "nvidia-231"),))
    with pytest.raises(NoCapacity) as ei:
        place([VmRequest("whole", gpus=(VgpuRequest(mode="passthrough"),))], _states(inv))
    assert "PF/VF exclusivity" in str(ei.value)
    hs = _states(t4_host(gpus=(("0000:3b:00.0", 0),)))
    hs = place([VmRequest("whole", gpus=(VgpuRequest(mode="passthrough"),))], hs).hosts
    with pytest.raises(NoCapacity) as ei:
        place([VmRequest("v", gpus=(Q2,))], hs)
    assert "planned for passthrough" in str(ei.value)


def test_explain_lists_every_candidate_gpu_with_a_verdict():
    hs = _states(t4_host("a"), l40s_host("b"), desktop_host("c"))
    _, why, _ = place([VmRequest("v1", gpus=(Q2,))], hs)
    seen = {(c.host, c.gpu): c for c in why if c.vm == "v1"}
    assert seen[("a", "0000:3b:00.0")].verdict == "chosen"
    assert seen[("a", "0000:d8:00.0")].verdict == "eligible"
    assert seen[("b", "0000:41:00.0")].verdict == "skipped" and "no type fits" in seen[("b", "0000:41:00.0")].reason
    desk = seen[("c", "0000:01:00.0")]
    assert desk.verdict == "skipped" and "offers no vGPU types" in desk.reason


def test_vm_with_several_gpus_stays_on_one_host():
    hs = _states(t4_host("a", gpus=(("0000:3b:00.0", 0),)), t4_host("b"))
    vm = VmRequest("multi", gpus=(VgpuRequest(type="nvidia-233"), VgpuRequest(type="nvidia-233"),
                                  VgpuRequest(type="nvidia-233")))
    got, _, _ = place([vm], hs)
    assert {a.host for a in got} == {"b"} and len(got) == 3


def test_a_vm_with_several_gpus_places_each_by_the_policy():
    # the VM's second GPU is ranked like the first: binpack keeps it on the GPU already used, spread moves on
    vm = VmRequest("pair", gpus=(Q2, Q2))
    got, _, _ = place([vm], _states(t4_host()))
    assert [str(a.gpu) for a in got] == ["0000:3b:00.0", "0000:3b:00.0"]
    got, _, _ = place([vm], _states(t4_host()), policy="spread")
    assert sorted(str(a.gpu) for a in got) == ["0000:3b:00.0", "0000:d8:00.0"]


def test_pinned_host_and_bad_policy():
    hs = _states(t4_host("a"), t4_host("b"))
    got, _, _ = place([VmRequest("p", gpus=(Q2,), host="b")], hs)
    assert got[0].host == "b"
    with pytest.raises(InvalidSpec):
        place([VmRequest("p", gpus=(Q2,))], hs, policy="random")  # type: ignore[arg-type]


def test_nic_vf_request_is_served_from_the_hosts_nic_vfs():
    from vgpuvirt.provision.plan import plan
    p = plan([desktop_host("c")], [VmRequest("game", gpus=(VgpuRequest(mode="passthrough"),), template="gaming",
                                             nic=NicRequest(mac="52:54:00:aa:bb:01", vlan=42))])
    xml = next(s.xml for s in p.steps if isinstance(s, DefineDomain))
    assert "type=\"hostdev\"" in xml or "type='hostdev'" in xml
    assert "0x05" in xml and "52:54:00:aa:bb:01" in xml


def test_place_one_by_need_for_one_device_at_a_time():
    from vgpuvirt.model import PciAddress
    from vgpuvirt.provision.by_need import place_one, profile_at, smallest_fitting_type

    inv = t4_host(mdevs=(("a1b2c3d4-0000-4000-8000-000000000001", "0000:3b:00.0", "nvidia-232"),))
    need = VgpuRequest(min_framebuffer_mib=1024, series="Q")
    # Anywhere: the smallest fitting type wins (1Q on the empty GPU).
    a = place_one(inv, need, kind="mdev")
    assert (str(a.slot), a.type.id) == ("0000:d8:00.0", "nvidia-230")
    # Limited to the GPU that runs 4 GiB vGPUs: equal-size mode gives the 4 GiB Q type there.
    b = place_one(inv, need, kind="mdev", where=PciAddress.parse("0000:3b:00.0"))
    assert (str(b.slot), b.type.id) == ("0000:3b:00.0", "nvidia-232")
    with pytest.raises(NoCapacity):
        place_one(inv, VgpuRequest(type="nvidia-231"), kind="mdev", where=PciAddress.parse("0000:3b:00.0"))
    assert profile_at(inv, PciAddress.parse("0000:3b:00.0"), "nvidia-232").framebuffer_mib == 4096
    assert smallest_fitting_type(inv, need, PciAddress.parse("0000:d8:00.0")) == "nvidia-230"



@pytest.mark.parametrize("search", [False, True])
def test_place_leaves_the_callers_states_as_they_were_and_returns_the_new_ones(search: bool):
    """place() is pure: the states it is given are unchanged, after the greedy pass and after the search a
    tight fit runs; the states it returns hold what it placed."""
    import copy

    hs = _states(t4_host())
    before = copy.deepcopy(hs)
    if search:
        # test_provision_bound's case: "any vGPU" first takes the 1 GiB type; the greedy pass leaves `late` no room
        vms = [VmRequest("any", gpus=(VgpuRequest.parse("fb>=1G"),), start=False),
               VmRequest("late", gpus=(VgpuRequest.parse("fb>=2G"), VgpuRequest.parse("fb>=4G")), start=False)]
    else:
        vms = VmRequest.pool("vdi", 3, gpu=Q2)
    got, _, after = place(vms, hs)
    assert len(got) == len([g for vm in vms for g in vm.gpus])
    assert hs == before
    free = {str(g.address): g.used for g in hs["h1"].gpus}
    used = {str(g.address): g.used for g in after["h1"].gpus}
    assert sum(used.values()) - sum(free.values()) == len(got)
