"""mdev lifecycle against every simulator profile through SimHost (the kernel's semantics)."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Callable

import pytest
from lifecycle_doubles import Wrapped, mdev_types

from vgpuvirt.change.mdev_service import MdevService
from vgpuvirt.change.sriov import set_vf_count
from vgpuvirt.errors import (
    AlreadyExists,
    DeviceNotFound,
    NoCapacity,
    RemoteRequirementMissing,
    VgpuvirtError,
    WriteFailed,
)
from vgpuvirt.model import MdevUuid
from vgpuvirt.services.pci.sriov import SriovService
from vgpuvirt.sim import Profile, SimHost, list_profiles, load_profile

U1 = "11111111-2222-4333-8444-555555555555"
U2 = "11111111-2222-4333-8444-666666666666"
MDEV_MODES = ("mdev", "mdev-sriov", "gvtg")     # the vGPU modes whose parents register with the mdev bus


def offers_mdev(profile: Profile) -> bool:
    """The host has an mdev parent (on the GPU, or on its VFs once enabled): a vGPU <= 16 board or GVT-g."""
    return any(d.vgpu is not None and d.vgpu.mode in MDEV_MODES for d in profile.devices)


def profiles_where(predicate: Callable[[Profile], bool]) -> list[str]:
    """The simulator profiles that have a capability; none is an error (a test must never run on no host)."""
    chosen = [n for n in list_profiles() if predicate(load_profile(n))]
    if not chosen:
        raise AssertionError(f"no simulator profile satisfies {predicate.__name__}")
    return chosen


MDEV_PROFILES = profiles_where(offers_mdev)
NO_MDEV_PROFILES = profiles_where(lambda p: not offers_mdev(p))


def sim(profile: str) -> Wrapped:
    return Wrapped(SimHost.from_profile(profile))


def target(host: Wrapped) -> tuple[str, str, int]:
    """The (parent, type, available) with the most free instances. SR-IOV boards (A10/A100 with
    vGPU <= 16) get their VFs enabled first: their mdev parents are the VFs."""
    if not mdev_types(host):
        for pf in SriovService(host.inner).report():
            if pf.total_vfs and not pf.num_vfs:
                set_vf_count(host.inner, pf.address)
    free = [t for t in mdev_types(host) if t[2] > 0]
    assert free, "a host with an mdev-capable GPU offers a type with a free instance"
    return max(free, key=lambda t: (t[2], t[0], t[1]))


def test_profiles_are_split_by_capability() -> None:
    """Every profile is in exactly one set, and both sets hold real examples."""
    assert sorted(MDEV_PROFILES + NO_MDEV_PROFILES) == sorted(list_profiles())
    assert {"t4x2", "a10-sriov", "gvtg"} <= set(MDEV_PROFILES)
    assert {"l40s-vgpu17", "h100-sxm5", "desktop"} <= set(NO_MDEV_PROFILES)
    with pytest.raises(AssertionError, match="no simulator profile"):
        profiles_where(lambda p: False)


@pytest.mark.parametrize("profile", NO_MDEV_PROFILES)
def test_a_host_without_mdev_refuses_to_create_one(profile: str) -> None:
    """vGPU 17+, MxGPU, plain passthrough: no mdev parent even with VFs enabled; creating one says so."""
    host = sim(profile)
    for pf in SriovService(host.inner).report():
        if pf.total_vfs and not pf.num_vfs:
            set_vf_count(host.inner, pf.address)
    assert not mdev_types(host)
    gpu = host.read(["/sys/bus/pci/devices/*/class"])
    addr = next(p.split("/")[5] for p in sorted(gpu) if (gpu.text(p) or "").startswith("0x03"))
    with pytest.raises(DeviceNotFound, match="not currently registered for mdev"):
        MdevService(host).create(addr, "nvidia-231")
    assert MdevService(host).list() == []


def avail(host: Wrapped, parent: str, type_id: str) -> int:
    return dict(((p, t), a) for p, t, a in mdev_types(host))[(parent, type_id)]


@pytest.mark.parametrize("profile", MDEV_PROFILES)
def test_create_list_remove_and_idempotence(profile: str) -> None:
    host = sim(profile)
    parent, type_id, before = target(host)
    svc = MdevService(host)
    host.calls.clear()
    ch = svc.create(parent, type_id, U1)
    assert ch.changed and ch.data["uuid"] == U1
    assert host.kinds() == ["read", "apply"], "one read + one locked batch"
    assert avail(host, parent, type_id) == before - 1
    listed = {str(r.uuid): r for r in svc.list()}
    assert listed[U1].parent == parent and listed[U1].type == type_id and listed[U1].active
    # same UUID, parent, type: success, unchanged, nothing written
    host.calls.clear()
    again = svc.create(parent, type_id, U1)
    assert not again.changed and host.kinds() == ["read"]
    assert avail(host, parent, type_id) == before - 1
    # remove twice
    assert svc.remove(U1).changed
    assert not svc.remove(U1).changed
    assert avail(host, parent, type_id) == before
    assert U1 not in {str(r.uuid) for r in svc.list()}


@pytest.mark.parametrize("profile", MDEV_PROFILES)
def test_ensure_present_then_absent_changes_only_the_first_time(profile: str) -> None:
    host = sim(profile)
    parent, type_id, _ = target(host)
    svc = MdevService(host)
    assert [svc.ensure(U2, parent, type_id).changed for _ in range(2)] == [True, False]
    state = sorted((str(r.uuid), r.parent, r.type) for r in svc.list())
    assert [svc.ensure(U2, state="absent").changed for _ in range(2)] == [True, False]
    assert svc.ensure(U2, parent, type_id).changed
    assert sorted((str(r.uuid), r.parent, r.type) for r in svc.list()) == state


@pytest.mark.parametrize("profile", MDEV_PROFILES)
def test_generated_uuid_is_canonical_and_new(profile: str) -> None:
    host = sim(profile)
    t = target(host)
    before = {r.uuid for r in MdevService(host).list()}
    ch = MdevService(host).create(t[0], t[1])
    u = MdevUuid.parse(ch.data["uuid"])
    assert u not in before and u in {r.uuid for r in MdevService(host).list()}


def test_mdevctl_three_checks_on_an_existing_uuid() -> None:
    host = sim("t4x2")
    svc = MdevService(host)
    svc.create("0000:3b:00.0", "nvidia-231", U1)
    with pytest.raises(AlreadyExists, match=r"different parent '0000:3b:00\.0'"):
        svc.create("0000:d8:00.0", "nvidia-231", U1)
    with pytest.raises(AlreadyExists, match="different type 'nvidia-231'"):
        svc.create("0000:3b:00.0", "nvidia-223", U1)
    with pytest.raises(AlreadyExists):
        svc.ensure(U1, "0000:d8:00.0", "nvidia-231")
    assert not svc.create("0000:3b:00.0", "nvidia-231", U1).changed


def test_capacity_is_checked_before_writing_and_names_the_reason() -> None:
    host = sim("t4x2")
    svc = MdevService(host)
    gpu = "0000:d8:00.0"
    n = avail(host, gpu, "nvidia-233")            # T4-8Q: 2 per 16 GB T4
    made = [svc.create(gpu, "nvidia-233").data["uuid"] for _ in range(n)]
    assert len(made) == n == 2
    host.calls.clear()
    with pytest.raises(NoCapacity, match="no available instances of nvidia-233"):
        svc.create(gpu, "nvidia-233")
    assert host.kinds() == ["read"], "refused before anything was written"
    # equal-size rule: an 8 GB vGPU exists, so a 2 GB type shows 0 and the message says why
    with pytest.raises(NoCapacity, match="equal-size"):
        svc.create(gpu, "nvidia-231")


def test_unknown_parent_or_type_is_device_not_found() -> None:
    svc = MdevService(sim("t4x2"))
    with pytest.raises(DeviceNotFound, match="not currently registered"):
        svc.create("0000:3a:00.0", "nvidia-231")
    with pytest.raises(DeviceNotFound, match="does not support mdev type nvidia-999"):
        svc.create("0000:3b:00.0", "nvidia-999")


def test_lost_race_for_the_last_instance_is_no_capacity_and_leaks_nothing() -> None:
    host = sim("t4x2")
    svc = MdevService(host)
    gpu = "0000:d8:00.0"
    rival = MdevService(host.inner)
    # our read sees 1 free T4-16Q; a rival takes it between our read and our batch
    host.before_apply = lambda ops: rival.create(gpu, "nvidia-234", U2)
    with pytest.raises(NoCapacity, match="concurrent"):
        svc.create(gpu, "nvidia-234", U1)
    uuids = {str(r.uuid) for r in svc.list()}
    assert U2 in uuids and U1 not in uuids


def test_same_uuid_created_concurrently_with_the_same_spec_is_success_for_ensure() -> None:
    host = sim("t4x2")
    rival = MdevService(host.inner)
    host.before_apply = lambda ops: rival.create("0000:d8:00.0", "nvidia-231", U1)
    ch = MdevService(host).ensure(U1, "0000:d8:00.0", "nvidia-231")
    assert not ch.changed and "concurrently" in ch.message
    host.before_apply = lambda ops: rival.create("0000:d8:00.0", "nvidia-231", U2)
    with pytest.raises(AlreadyExists):
        MdevService(host).create("0000:3b:00.0", "nvidia-231", U2)


@pytest.mark.parametrize(("code", "exc"), [
    (errno.ENOSPC, NoCapacity), (errno.EUSERS, NoCapacity), (errno.EEXIST, AlreadyExists),
    (errno.EINVAL, NoCapacity), (errno.EIO, WriteFailed), (errno.ENODEV, DeviceNotFound),
])
def test_kernel_errnos_on_create_map_to_errors_never_oserror(code: int, exc: type[Exception]) -> None:
    host = sim("t4x2")
    host.fail["/create"] = code
    with pytest.raises(exc) as ei:
        MdevService(host).create("0000:d8:00.0", "nvidia-231", U1)
    assert isinstance(ei.value, VgpuvirtError) and not isinstance(ei.value, OSError)
    assert "sim:t4x2" in str(ei.value) and "0000:d8:00.0" in str(ei.value)
    assert errno.errorcode[code] in str(ei.value)


def test_remove_of_a_device_that_vanished_meanwhile_is_unchanged() -> None:
    host = sim("t4x2")
    svc = MdevService(host)
    svc.create("0000:d8:00.0", "nvidia-231", U1)
    host.before_apply = lambda ops: MdevService(host.inner).remove(U1)
    ch = svc.remove(U1)
    assert not ch.changed and ch.message == "already gone"


def test_dry_run_plans_the_locked_batch_and_changes_nothing() -> None:
    host = sim("t4x2")
    svc = MdevService(host)
    before = mdev_types(host)
    ch = svc.create("0000:d8:00.0", "nvidia-231", U1, dry_run=True)
    assert ch.changed and ch.dry_run
    assert [o.op for o in ch.ops] == ["check_absent", "check_int", "write", "wait"]
    assert ch.ops[1].path == "/sys/class/mdev_bus/0000:d8:00.0/mdev_supported_types/nvidia-231/available_instances"
    assert ch.ops[2].value == U1 and ch.ops[2].path.endswith("/nvidia-231/create")
    assert len({o.group for o in ch.ops}) == 1, "the check and the write share one group"
    assert "apply" not in host.kinds() and mdev_types(host) == before
    svc.create("0000:d8:00.0", "nvidia-231", U1)
    rm = svc.remove(U1, dry_run=True)
    assert rm.changed and [o.op for o in rm.ops] == ["write", "wait"]
    assert U1 in {str(r.uuid) for r in svc.list()}


def test_every_mutation_is_audited_with_host_path_value_result(caplog: pytest.LogCaptureFixture) -> None:
    host = sim("t4x2")
    with caplog.at_level(logging.INFO, logger="vgpuvirt.audit"):
        MdevService(host).create("0000:d8:00.0", "nvidia-231", U1)
    lines = [r.getMessage() for r in caplog.records if r.name == "vgpuvirt.audit"]
    assert any("sim:t4x2" in m and "mdev.create" in m and U1 in m for m in lines)
    assert any(f"write '{U1}' > /sys/class/mdev_bus/0000:d8:00.0/mdev_supported_types/nvidia-231/create -> ok" in m
               for m in lines)


def test_persistent_needs_mdevctl_and_says_so() -> None:
    host = sim("t4x2")          # the simulator has no mdevctl: exit 127
    with pytest.raises(RemoteRequirementMissing, match="mdevctl"):
        MdevService(host).create("0000:d8:00.0", "nvidia-231", U1, persist="persistent")
    with pytest.raises(RemoteRequirementMissing, match="mdevctl=None"):
        MdevService(host, mdevctl=None).create("0000:d8:00.0", "nvidia-231", U1, persist="persistent")
    with pytest.raises(RemoteRequirementMissing):
        MdevService(host).restore()
    assert "apply" not in host.kinds()
    # transient needs no mdevctl, and removal without mdevctl simply has nothing to undefine
    MdevService(host).create("0000:d8:00.0", "nvidia-231", U1)
    assert MdevService(host).remove(U1).changed


def test_persistent_plan_defines_with_auto_through_the_injected_prefix() -> None:
    host = sim("t4x2")
    host.mdevctl_json = "[]"
    svc = MdevService(host, mdevctl=["/opt/wrap", "mdevctl"])
    ch = svc.create("0000:d8:00.0", "nvidia-231", U1, persist="persistent", dry_run=True)
    assert ch.ops[-1].op == "exec" and ch.ops[-1].argv == (
        "/opt/wrap", "mdevctl", "define", "-u", U1, "-p", "0000:d8:00.0", "-t", "nvidia-231", "--auto")
    assert ch.ops[-1].group == ch.ops[2].group
    # active but not defined yet: persistent ensure only defines
    svc.create("0000:d8:00.0", "nvidia-231", U1)
    plan = svc.ensure(U1, "0000:d8:00.0", "nvidia-231", persist="persistent", dry_run=True)
    assert [o.op for o in plan.ops] == ["exec"]
    # active and defined: nothing to do
    host.mdevctl_json = json.dumps([{"0000:d8:00.0": [{U1: {"mdev_type": "nvidia-231", "start": "auto",
                                                             "attrs": []}}]}])
    assert not svc.ensure(U1, "0000:d8:00.0", "nvidia-231", persist="persistent").changed
    # defined with another type on that parent: refused like mdevctl does
    with pytest.raises(AlreadyExists):
        svc.ensure(U1, "0000:d8:00.0", "nvidia-233", persist="persistent")
    # removal undefines it too
    rm = svc.remove(U1, dry_run=True)
    assert rm.ops[-1].argv == ("/opt/wrap", "mdevctl", "undefine", "-u", U1, "-p", "0000:d8:00.0")


def test_failed_define_rolls_the_create_back() -> None:
    host = sim("t4x2")
    host.mdevctl_json = "[]"       # the list answers; the define exec then fails (no mdevctl in the sim)
    before = mdev_types(host)
    with pytest.raises(VgpuvirtError, match="mdevctl define"):
        MdevService(host).create("0000:d8:00.0", "nvidia-231", U1, persist="persistent")
    assert mdev_types(host) == before and MdevService(host).list() == []


def test_restore_plans_a_start_for_each_defined_inactive_device() -> None:
    host = sim("t4x2")
    host.mdevctl_json = json.dumps([{"0000:d8:00.0": [{U1: {"mdev_type": "nvidia-231", "start": "auto"}},
                                                      {U2: {"mdev_type": "nvidia-231", "start": "manual"}}]}])
    svc = MdevService(host)
    svc.create("0000:d8:00.0", "nvidia-231", U2)
    ch = svc.restore(dry_run=True)
    assert ch.changed and [o.argv for o in ch.ops] == [("mdevctl", "start", "-u", U1, "-p", "0000:d8:00.0")]
    listed = {(str(r.uuid), r.active, r.defined, r.start) for r in svc.list(defined=True)}
    assert listed == {(U1, False, True, "auto"), (U2, True, True, "manual")}
