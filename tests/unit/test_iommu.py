"""IOMMU pre-flight on snapshots shaped like hostdata/iommu_examples.txt, and the bind/release plans."""

from __future__ import annotations

import pytest
from lifecycle_doubles import PciTree, domain_xml

from vgpuvirt.change.driver import prepare_vfio
from vgpuvirt.errors import NotAssignable
from vgpuvirt.model import PciAddress
from vgpuvirt.services.iommu import api as iommu
from vgpuvirt.services.iommu.api import Binding, BindingRecord

BRIDGE, VGA, D3, AUDIO, USB, UCSI, HOSTB = 0x060400, 0x030000, 0x030200, 0x040300, 0x0C0330, 0x0C8000, 0x060000


def skylake() -> PciTree:
    """(a) GTX 1070 + HDMI audio + the CPU root port in group 1; iGPU alone in group 2."""
    return (PciTree()
            .dev("0000:00:01.0", BRIDGE, "pcieport", 1)
            .dev("0000:01:00.0", VGA, "nvidia", 1)
            .dev("0000:01:00.1", AUDIO, "snd_hda_intel", 1)
            .dev("0000:00:02.0", VGA, "i915", 2))


def two_gpus_one_group(amd_driver: str | None = "amdgpu", amd_audio: str | None = "snd_hda_intel") -> PciTree:
    """(b) two GPUs behind bridges without ACS: everything in group 1."""
    return (PciTree()
            .dev("0000:00:01.0", BRIDGE, "pcieport", 1)
            .dev("0000:00:01.1", BRIDGE, "pcieport", 1)
            .dev("0000:01:00.0", VGA, "nvidia", 1)
            .dev("0000:01:00.1", AUDIO, "snd_hda_intel", 1)
            .dev("0000:01:00.2", USB, "xhci_hcd", 1)
            .dev("0000:01:00.3", UCSI, "i2c-nvidia-gpu", 1)
            .dev("0000:02:00.0", VGA, amd_driver, 1)
            .dev("0000:02:00.1", AUDIO, amd_audio, 1))


def a10_with_vfs(numvfs: int = 4, vgpu_type: int | None = None) -> PciTree:
    t = (PciTree()
         .dev("0000:40:03.0", HOSTB, None, 44)
         .dev("0000:40:03.1", BRIDGE, "pcieport", 44)
         .dev("0000:41:00.0", D3, "nvidia", 44, numvfs=numvfs))
    for i in range(numvfs):
        t.dev(f"0000:41:00.{4 + i}", D3, "nvidia", 210 + i, physfn="0000:41:00.0", vgpu_type=vgpu_type)
    return t


def test_gpu_with_audio_and_root_port_is_assignable_and_audio_must_go_along() -> None:
    host = skylake().host()
    rep = iommu.check_assignable(host, ["01:00.0"])
    assert rep.iommu_enabled and rep.assignable, rep.reasons
    d = rep.devices[0]
    assert d.group == 1
    assert d.must_include == (PciAddress.parse("0000:01:00.1"),)
    roles = {str(m.address): m.role for m in d.members}
    assert roles == {"0000:00:01.0": "bridge", "0000:01:00.0": "requested", "0000:01:00.1": "companion"}
    assert {m.driver for m in d.members} == {"pcieport", "nvidia", "snd_hda_intel"}
    assert any("0000:01:00.1" in w for w in d.warnings)
    assert [c[0] for c in host.calls] == ["read"], "one round trip for the whole report"


def test_gpu_and_audio_requested_together_need_nothing_else() -> None:
    rep = iommu.check_assignable(skylake().host(), ["0000:01:00.0", "0000:01:00.1"])
    assert rep.assignable
    assert all(not d.must_include for d in rep.devices)
    assert rep.to_dict()["devices"][0]["members"][0]["class_name"] == "PCI bridge"


def test_a_root_port_is_never_assignable() -> None:
    rep = iommu.check_assignable(skylake().host(), ["0000:00:01.0"])
    assert not rep.assignable
    assert "Non-endpoint" in rep.reasons[0]


def test_other_gpu_on_a_host_driver_in_the_same_group_blocks() -> None:
    rep = iommu.check_assignable(two_gpus_one_group().host(),
                                 ["01:00.0", "01:00.1", "01:00.2", "01:00.3"])
    assert not rep.assignable
    blocked = {str(m.address) for d in rep.devices for m in d.members if m.role == "blocking"}
    assert blocked == {"0000:02:00.0", "0000:02:00.1"}
    assert any("amdgpu" in r for r in rep.reasons)


@pytest.mark.parametrize(("drv", "audio"), [("vfio-pci", "vfio-pci"), (None, None), ("pci-stub", None)])
def test_other_endpoints_that_keep_the_group_viable_do_not_block(drv: str | None, audio: str | None) -> None:
    rep = iommu.check_assignable(two_gpus_one_group(drv, audio).host(), ["01:00.0", "01:00.1", "01:00.2", "01:00.3"])
    assert rep.assignable, rep.reasons


def test_passing_every_endpoint_of_the_group_is_assignable() -> None:
    addrs = ["01:00.0", "01:00.1", "01:00.2", "01:00.3", "02:00.0", "02:00.1"]
    assert iommu.check_assignable(two_gpus_one_group().host(), addrs).assignable


def test_group_member_used_by_another_domain_blocks_but_not_our_own() -> None:
    host = two_gpus_one_group("vfio-pci", "vfio-pci").host()
    doms = [("other", domain_xml("other", pci=["0000:02:00.0"])), ("me", domain_xml("me", pci=["0000:01:00.0"]))]
    addrs = ["01:00.0", "01:00.1", "01:00.2", "01:00.3"]
    rep = iommu.check_assignable(host, addrs, domains=doms, for_domain="me")
    assert not rep.assignable
    assert any("domain other" in r for r in rep.reasons) and not any("domain me" in r for r in rep.reasons)
    rep2 = iommu.check_assignable(host, addrs, domains=doms[1:], for_domain="me")
    assert rep2.assignable


def test_the_device_itself_used_by_another_domain_blocks() -> None:
    rep = iommu.check_assignable(skylake().host(), ["01:00.0"],
                                 domains=[("vm2", domain_xml("vm2", pci=["0000:01:00.0"]))])
    assert not rep.assignable and "in use by domain vm2" in rep.reasons[0]


def test_iommu_off_is_never_assignable() -> None:
    tree = PciTree(iommu=False).dev("0000:01:00.0", VGA, "nvidia", None)
    rep = iommu.check_assignable(tree.host(), ["01:00.0"])
    assert not rep.iommu_enabled and not rep.assignable
    assert "the IOMMU is off (no /sys/kernel/iommu_groups)" in rep.reasons[0]


def test_missing_device_is_reported() -> None:
    rep = iommu.check_assignable(skylake().host(), ["0000:99:00.0"])
    assert not rep.assignable and "no PCI device" in rep.reasons[0]


def test_pf_with_vfs_is_not_passed_whole_and_vf_not_with_its_pf() -> None:
    host = a10_with_vfs().host()
    assert not iommu.check_assignable(host, ["41:00.0"]).assignable
    both = iommu.check_assignable(host, ["41:00.0", "41:00.4"])
    assert any("exclusive" in r for r in both.reasons)
    alone = iommu.check_assignable(host, ["41:00.4"])
    assert alone.assignable, alone.reasons
    assert alone.devices[0].physfn == PciAddress.parse("41:00.0")
    pf_taken = iommu.check_assignable(host, ["41:00.5"], domains=[("big", domain_xml("big", pci=["0000:41:00.0"]))])
    assert not pf_taken.assignable and "its PF" in pf_taken.reasons[0]


def test_pf_without_vfs_and_its_host_bridge_group_is_assignable() -> None:
    rep = iommu.check_assignable(a10_with_vfs(numvfs=0).host(), ["41:00.0"])
    assert rep.assignable, rep.reasons
    assert {m.role for m in rep.devices[0].members} == {"bridge", "requested"}


def test_gpu_hosting_mdevs_is_not_passed_whole() -> None:
    tree = skylake().mdev("a1b2c3d4-0000-4000-8000-000000000001", "0000:01:00.0", "nvidia-231")
    rep = iommu.check_assignable(tree.host(), ["01:00.0", "01:00.1"])
    assert not rep.assignable and "mediated device" in rep.reasons[0]


def test_vendor_vgpu_vf_needs_a_type_and_is_never_rebound() -> None:
    rep0 = iommu.check_assignable(a10_with_vfs(vgpu_type=0).host(), ["41:00.4"])
    assert not rep0.assignable and "current_vgpu_type is 0" in rep0.reasons[0]
    host = a10_with_vfs(vgpu_type=1155).host()
    rep = iommu.check_assignable(host, ["41:00.4"])
    assert rep.assignable and rep.devices[0].vendor_vfio
    assert any("managed='no'" in w for w in rep.warnings)
    change, record, _ = prepare_vfio(host, ["41:00.4"])
    assert not change.changed and record.bindings == ()
    assert [c[0] for c in host.calls] == ["read", "read"], "nothing written for a vendor VF"


def test_reset_capability_is_reported() -> None:
    tree = PciTree().dev("0000:01:00.0", VGA, "nvidia", 1, reset=None).dev("0000:02:00.0", VGA, "nvidia", 2, reset="")
    rep = iommu.check_assignable(tree.host(), ["01:00.0", "02:00.0"])
    assert rep.assignable
    assert [d.resettable for d in rep.devices] == [False, False]
    assert len(rep.warnings) == 2
    ok = iommu.check_assignable(skylake().host(), ["01:00.0"]).devices[0]
    assert ok.resettable and ok.reset_methods == ("flr", "bus")


def test_prepare_dry_run_plans_override_unbind_probe_wait_for_every_endpoint() -> None:
    host = skylake().host()
    change, record, _ = prepare_vfio(host, ["01:00.0"], dry_run=True)
    assert change.changed and change.dry_run
    assert [c[0] for c in host.calls] == ["read"], "a dry run never applies"
    assert [op.describe() for op in change.ops] == [
        "write 'vfio-pci' > /sys/bus/pci/devices/0000:01:00.0/driver_override",
        "write '0000:01:00.0' > /sys/bus/pci/drivers/nvidia/unbind",
        "write '0000:01:00.0' > /sys/bus/pci/drivers_probe",
        "wait /sys/bus/pci/devices/0000:01:00.0/driver",
        "write 'vfio-pci' > /sys/bus/pci/devices/0000:01:00.1/driver_override",
        "write '0000:01:00.1' > /sys/bus/pci/drivers/snd_hda_intel/unbind",
        "write '0000:01:00.1' > /sys/bus/pci/drivers_probe",
        "wait /sys/bus/pci/devices/0000:01:00.1/driver",
    ]
    assert not any("new_id" in (op.path or "") for op in change.ops)
    assert record.to_dict()["bindings"] == [
        {"address": "0000:01:00.0", "original_driver": "nvidia", "original_override": None},
        {"address": "0000:01:00.1", "original_driver": "snd_hda_intel", "original_override": None}]
    assert BindingRecord.from_dict(record.to_dict()) == record


def test_prepare_refuses_when_not_assignable_and_writes_nothing() -> None:
    host = two_gpus_one_group().host()
    with pytest.raises(NotAssignable) as ei:
        prepare_vfio(host, ["01:00.0"])
    assert ei.value.report is not None and not ei.value.report.assignable
    assert [c[0] for c in host.calls] == ["read"]


def test_prepare_skips_devices_already_on_vfio() -> None:
    tree = (PciTree().dev("0000:00:01.0", BRIDGE, "pcieport", 1).dev("0000:01:00.0", VGA, "vfio-pci", 1)
            .dev("0000:01:00.1", AUDIO, "vfio-pci", 1))
    host = tree.host()
    change, record, _ = prepare_vfio(host, ["01:00.0"])
    assert not change.changed and record.bindings == ()
    assert [c[0] for c in host.calls] == ["read"]


def test_release_plan_restores_original_driver_and_override() -> None:
    tree = (PciTree().dev("0000:01:00.0", VGA, "vfio-pci", 1, override="vfio-pci")
            .dev("0000:01:00.1", AUDIO, "vfio-pci", 1, override="vfio-pci"))
    rec = BindingRecord("double", (Binding(PciAddress.parse("01:00.0"), "nvidia"),
                                   Binding(PciAddress.parse("01:00.1"), None)))
    host = tree.host()
    change = iommu.release(host, rec, dry_run=True)
    assert [op.describe() for op in change.ops] == [
        "write '\\n' > /sys/bus/pci/devices/0000:01:00.0/driver_override",
        "write '0000:01:00.0' > /sys/bus/pci/drivers/vfio-pci/unbind",
        "write '0000:01:00.0' > /sys/bus/pci/drivers_probe",
        "wait /sys/bus/pci/devices/0000:01:00.0/driver",
        "write '\\n' > /sys/bus/pci/devices/0000:01:00.1/driver_override",
        "write '0000:01:00.1' > /sys/bus/pci/drivers/vfio-pci/unbind",
    ]
    assert change.ops[3].value == "nvidia"


def test_release_refuses_a_device_a_domain_still_uses() -> None:
    from vgpuvirt.errors import DeviceBusy
    tree = PciTree().dev("0000:01:00.0", VGA, "vfio-pci", 1, override="vfio-pci")
    with pytest.raises(DeviceBusy):
        iommu.release(tree.host(), ["01:00.0"], domains=[("vm", domain_xml("vm", pci=["0000:01:00.0"]))])


# ---------------------------------------------------------------- through the simulator (kernel semantics)


def _drivers(host: object, addrs: list[str]) -> dict[str, str | None]:
    snap = host.read([f"/sys/bus/pci/devices/{a}/driver" for a in addrs])  # type: ignore[attr-defined]
    return {a: snap.link_name(f"/sys/bus/pci/devices/{a}/driver") for a in addrs}


@pytest.mark.parametrize("profile", __import__("vgpuvirt.sim", fromlist=["list_profiles"]).list_profiles())
def test_check_every_gpu_of_every_profile_in_one_read(profile: str) -> None:
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile(profile)
    snap = host.read(["/sys/bus/pci/devices/*/class"])
    gpus = [p.split("/")[5] for p in snap if (snap.text(p) or "").startswith("0x03")]
    assert gpus
    before = host.round_trips
    rep = iommu.check_assignable(host, gpus)
    assert host.round_trips == before + 1
    assert len(rep.devices) == len(gpus)
    if not host.model.profile.iommu:         # the guests built from real captures (h100-sxm5, h200)
        assert not rep.iommu_enabled and not rep.assignable and rep.vm_guest
        assert rep.reasons[0].startswith("the IOMMU is off (/sys/kernel/iommu_groups is empty")
        return
    assert rep.iommu_enabled
    for d in rep.devices:
        assert d.present and d.group is not None
        assert any(m.address == d.address and m.role == "requested" for m in d.members)
        # a verdict always comes with its reasons
        assert bool(d.blocking) == any(str(d.address) in r for r in rep.reasons)
    assert rep.to_dict()["assignable"] == rep.assignable


def test_prepare_and_release_on_the_simulated_desktop() -> None:
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile("desktop")
    addrs = ["0000:01:00.0", "0000:01:00.1"]
    assert _drivers(host, addrs) == {"0000:01:00.0": "nvidia", "0000:01:00.1": "snd_hda_intel"}
    change, record, _ = prepare_vfio(host, ["0000:01:00.0"])
    assert change.changed and len(record.bindings) == 2
    assert _drivers(host, addrs) == dict.fromkeys(addrs, "vfio-pci")
    again, rec2, _ = prepare_vfio(host, ["0000:01:00.0"])
    assert not again.changed and rec2.bindings == ()
    # the audio function is now vfio-bound: the group is viable for the GPU alone too
    assert iommu.check_assignable(host, ["0000:01:00.0"]).assignable
    back = iommu.release(host, BindingRecord.from_dict(record.to_dict()))
    assert back.changed
    assert _drivers(host, addrs) == {"0000:01:00.0": "nvidia", "0000:01:00.1": "snd_hda_intel"}
    snap = host.read([f"/sys/bus/pci/devices/{a}/driver_override" for a in addrs])
    assert all(snap.text(p) == "(null)" for p in snap)
    assert not iommu.release(host, record).changed


def test_release_without_a_record_lets_the_kernel_probe_the_default_driver() -> None:
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile("desktop")
    prepare_vfio(host, ["0000:01:00.0", "0000:01:00.1"])
    assert iommu.release(host, ["0000:01:00.0", "0000:01:00.1"]).changed
    assert _drivers(host, ["0000:01:00.0", "0000:01:00.1"]) == {"0000:01:00.0": "nvidia",
                                                                "0000:01:00.1": "snd_hda_intel"}
    assert not iommu.release(host, ["0000:01:00.0", "0000:01:00.1"]).changed


def test_a_failed_bind_rolls_back_the_devices_that_moved() -> None:
    import errno

    from lifecycle_doubles import Wrapped

    from vgpuvirt.errors import ProvisioningError, VgpuvirtError
    from vgpuvirt.sim import SimHost
    host = Wrapped(SimHost.from_profile("desktop"))
    host.fail["/drivers/snd_hda_intel/unbind"] = errno.EBUSY
    with pytest.raises(VgpuvirtError, match="EBUSY") as err:
        prepare_vfio(host, ["0000:01:00.0"])
    assert _drivers(host, ["0000:01:00.0", "0000:01:00.1"]) == {"0000:01:00.0": "nvidia",
                                                                "0000:01:00.1": "snd_hda_intel"}
    assert isinstance(err.value, ProvisioningError)         # the runner's: what ran, what its rollback did
    assert err.value.rollback == [f"{host.name}: bound 0000:01:00.1 back to snd_hda_intel",
                                  f"{host.name}: bound 0000:01:00.0 back to nvidia"]


def test_the_last_binding_failing_leaves_the_host_exactly_as_before() -> None:
    """The last device's final write (the probe of the audio function) fails: the whole host (drivers and
    overrides of every function) is as before."""
    from host_state import diff, fail_last, host_state

    from vgpuvirt.errors import ProvisioningError
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile("desktop")
    start = host_state(host)
    with fail_last(host, lambda op: op.op == "write" and op.value == "0000:01:00.1" and "drivers_probe" in op.path), \
            pytest.raises(ProvisioningError, match="injected") as err:
        prepare_vfio(host, ["0000:01:00.0"])
    assert len(err.value.rollback) == 2 and not any("FAILED" in line for line in err.value.rollback)
    assert diff(start, host_state(host)) == []


def test_blocked_group_on_the_simulated_desktop() -> None:
    from vgpuvirt.sim import SimHost
    rep = iommu.check_assignable(SimHost.from_profile("desktop"), ["0000:02:00.0", "0000:02:00.1"])
    assert not rep.assignable
    assert any("igb" in r for r in rep.reasons) and any("xhci_hcd" in r for r in rep.reasons)
