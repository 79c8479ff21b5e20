"""The vGPU scheduler: RmPVMRL encoding against NVIDIA's documented values, round trips through NVML (the
simulated driver's calls) and through the registry key (pending until the simulated driver reloads), bad
input refused with nothing written, one round trip per phase; the frame rate limiter through vgpu_params."""

from __future__ import annotations

import uuid

import pytest

from vgpuvirt.change.scheduler import apply_schedulers
from vgpuvirt.cli import main
from vgpuvirt.errors import DeviceNotFound, InvalidSpec, ProvisioningError
from vgpuvirt.services.scheduler.model import (
    MODPROBE_FILE,
    SchedulerSetting,
    modprobe_options,
    parse_setting,
    registry_values,
)
from vgpuvirt.services.scheduler.service import SchedulerError, plan_schedulers, read_schedulers
from vgpuvirt.sim import SimHost

GPU0, GPU1 = "0000:3b:00.0", "0000:d8:00.0"
S = SchedulerSetting


@pytest.mark.parametrize(("setting", "value"), [
    # the vGPU user guide's own values
    (S(policy="best-effort"), 0x00),
    (S(policy="equal-share"), 0x01),
    (S(policy="fixed-share"), 0x11),
    (S(policy="equal-share", timeslice_us=3000), 0x00030001),
    (S(policy="fixed-share", timeslice_us=30000), 0x001E0011),
    # bit 1: adaptive round robin off (nvrm_registry.h)
    (S(policy="equal-share", adaptive=False), 0x03),
])
def test_rmpvmrl_encoding(setting, value):
    assert setting.to_rmpvmrl() == value
    assert SchedulerSetting.from_rmpvmrl(value) == setting


@pytest.mark.parametrize("kw", [
    {"policy": "round-robin"},
    {"policy": "best-effort", "timeslice_us": 1000},
    {"policy": "best-effort", "adaptive": True},
    {"policy": "equal-share", "timeslice_us": 2000, "adaptive": True},
    {"policy": "equal-share", "timeslice_us": 0},
    {"policy": "equal-share", "timeslice_us": True},
])
def test_bad_settings_are_refused(kw):
    with pytest.raises(InvalidSpec):
        parse_setting(**kw)


@pytest.mark.parametrize("ts", [500, 1500, 31000])
def test_registry_timeslice_must_be_whole_ms_in_range(ts):
    with pytest.raises(InvalidSpec, match="whole milliseconds"):
        S(policy="equal-share", timeslice_us=ts).to_rmpvmrl()


def test_modprobe_parsing_per_device_wins_over_global():
    opts = modprobe_options({"/etc/modprobe.d/a.conf": 'options nvidia NVreg_RegistryDwords="RmPVMRL=0x01"\n',
                             "/etc/modprobe.d/b.conf": "# options nvidia NVreg_RegistryDwords=RmPVMRL=0x11\n"
                             'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:3B:00.0;RmPVMRL=0x11"\n'})
    assert set(opts) == {"/etc/modprobe.d/a.conf", "/etc/modprobe.d/b.conf"}
    values = registry_values(opts["/etc/modprobe.d/a.conf"]["NVreg_RegistryDwords"],
                             opts["/etc/modprobe.d/b.conf"]["NVreg_RegistryDwordsPerDevice"])
    assert values == {"*": 0x01, GPU0: 0x11}


def test_show_reads_every_gpu_in_one_round_trip_per_phase():
    host = SimHost.from_profile("t4x2")
    before = host.round_trips
    gpus = read_schedulers(host, [GPU0, GPU1])
    assert host.round_trips - before == 1
    assert [g.address for g in gpus] == [GPU0, GPU1]
    assert all(g.nvml and g.current == S(policy="best-effort") == g.pending for g in gpus)
    with pytest.raises(DeviceNotFound):
        read_schedulers(host, ["0000:99:00.0"])


def test_nvml_path_changes_now_and_is_lost_at_driver_reload():
    host = SimHost.from_profile("t4x2")
    want = S(policy="fixed-share", timeslice_us=2000)
    plan = plan_schedulers(host, {GPU0: want})
    assert [c.via for c in plan.changes] == ["nvml"]
    rt = host.round_trips
    apply_schedulers(host, plan)
    assert host.round_trips - rt == 1
    g0, g1 = read_schedulers(host, [GPU0, GPU1])
    assert g0.current == want and g0.current_source == "nvml" and g0.pending == S(policy="best-effort")
    assert g1.current == S(policy="best-effort")                     # the other GPU untouched
    assert host.model.sched.state[GPU0] == {"policy": 3, "arr": 1, "timeslice_ns": 2_000_000}
    host.model.sched.reload_driver()
    assert read_schedulers(host, [GPU0])[0].current == S(policy="best-effort")
    # rerun converges: nothing to do
    apply_schedulers(host, plan_schedulers(host, {GPU0: want}))
    assert [c.via for c in plan_schedulers(host, {GPU0: want}).changes] == ["none"]


def test_nvml_path_with_persist_also_writes_the_registry_key():
    host = SimHost.from_profile("t4x2")
    want = S(policy="equal-share", timeslice_us=5000)
    apply_schedulers(host, plan_schedulers(host, {GPU0: want}, persist=True))
    assert "RmPVMRL=0x50001" in host.model.sched.modprobe["vgpuvirt-scheduler.conf"]
    host.model.sched.reload_driver()
    assert read_schedulers(host, [GPU0])[0].current == want


def test_nvml_refuses_a_timeslice_outside_the_gpus_capabilities():
    host = SimHost.from_profile("t4x2")
    with pytest.raises(InvalidSpec, match="NVML capabilities"):
        plan_schedulers(host, {GPU0: S(policy="equal-share", timeslice_us=500)})
    assert host.model.sched.state == {} and host.model.sched.modprobe == {}


def test_registry_path_is_pending_until_the_driver_reloads():
    host = SimHost.from_profile("t4x2")
    host.model.sched.nvml_supported = False
    want = S(policy="fixed-share")
    plan = plan_schedulers(host, {GPU0: want, GPU1: S(policy="equal-share", timeslice_us=4000)})
    assert [c.via for c in plan.changes] == ["registry", "registry"]
    assert all("next load of the nvidia module" in c.describe() for c in plan.changes)
    apply_schedulers(host, plan)
    g0, g1 = read_schedulers(host, [GPU0, GPU1])
    assert not g0.nvml and g0.current_source == "module parameters"
    assert g0.current == S(policy="best-effort") and g0.pending == want and g0.differs
    assert g1.pending == S(policy="equal-share", timeslice_us=4000)
    # the simulated driver reads the file itself (its own decoder, not the client's)
    host.model.sched.reload_driver()
    g0, g1 = read_schedulers(host, [GPU0, GPU1])
    assert (g0.current, g0.differs) == (want, False)
    assert g1.current == S(policy="equal-share", timeslice_us=4000)
    # a later change of one GPU keeps the other's entry in vgpuvirt's file
    apply_schedulers(host, plan_schedulers(host, {GPU0: S(policy="equal-share")}))
    g0, g1 = read_schedulers(host, [GPU0, GPU1])
    assert g0.pending == S(policy="equal-share") and g1.pending == g1.current


def test_registry_path_refuses_another_file_setting_the_per_device_key():
    host = SimHost.from_profile("t4x2")
    host.model.sched.nvml_supported = False
    host.model.sched.modprobe["nvidia-vgpu.conf"] = (
        'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:d8:00.0;RmPVMRL=0x01"\n')
    with pytest.raises(SchedulerError, match=r"nvidia-vgpu\.conf also sets"):
        plan_schedulers(host, {GPU0: S(policy="fixed-share")})
    assert set(host.model.sched.modprobe) == {"nvidia-vgpu.conf"}
    # the foreign file's value is reported as pending all the same
    assert read_schedulers(host, [GPU1])[0].pending == S(policy="equal-share")


def test_failed_nvml_set_puts_the_file_back():
    host = SimHost.from_profile("t4x2")
    plan = plan_schedulers(host, {GPU0: S(policy="fixed-share")}, persist=True)
    real = host.model.sched.nvml

    def refuse_sets(op):
        if op.get("value") == "vgpu_scheduler_set":
            return {"ok": False, "errno": None, "rc": 19, "error": "In use by another client"}
        return real(op)
    host.model.sched.nvml = refuse_sets  # type: ignore[method-assign]
    with pytest.raises(ProvisioningError, match=r"In use by another client") as err:
        apply_schedulers(host, plan)
    assert err.value.rollback == [f"{host.name}: removed /etc/modprobe.d/vgpuvirt-scheduler.conf again"]
    assert "vgpuvirt-scheduler.conf" not in host.model.sched.modprobe      # as before: there was no file
    assert read_schedulers(host, [GPU0])[0].pending == S(policy="best-effort")


def test_the_last_gpus_nvml_set_failing_leaves_the_host_exactly_as_before():
    """Two GPUs with --persist over a file already there: the second GPU's NVML set (the LAST step) is refused;
    the first GPU's policy, the file and every other part of the host are as before."""
    from host_state import diff, fail_last, host_state
    host = SimHost.from_profile("t4x2")
    apply_schedulers(host, plan_schedulers(host, {GPU1: S(policy="equal-share")}, persist=True))
    start = host_state(host)
    was = [g.current for g in read_schedulers(host, [GPU0, GPU1])]
    plan = plan_schedulers(host, {GPU0: S(policy="fixed-share"), GPU1: S(policy="fixed-share")}, persist=True)
    with fail_last(host, lambda op: op.op == "nvml"), pytest.raises(ProvisioningError, match="injected") as err:
        apply_schedulers(host, plan)
    assert len(err.value.rollback) == 2 and not any("FAILED" in x for x in err.value.rollback)
    assert diff(start, host_state(host)) == []
    # what NVML reports (the driver's state; the simulator's model may hold the default as an explicit entry)
    assert [g.current for g in read_schedulers(host, [GPU0, GPU1])] == was == [S(policy="best-effort"),
                                                                                S(policy="equal-share")]


def test_cli_show_and_set(capsys):
    assert main(["--host", "sim:t4x2", "scheduler", "show"]) == 0
    out = capsys.readouterr().out
    assert GPU0 in out and GPU1 in out and "best-effort" in out
    assert main(["--host", "sim:t4x2", "scheduler", "set", GPU0, "--policy", "fixed-share",
                 "--timeslice-us", "2000", "--dry-run"]) == 0
    assert "would set" in capsys.readouterr().out
    assert main(["--host", "sim:t4x2", "scheduler", "set", GPU0, "--policy", "best-effort",
                 "--timeslice-us", "2000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "best-effort" in err


def test_modprobe_file_name_is_vgpuvirts_own():
    assert MODPROBE_FILE == "/etc/modprobe.d/vgpuvirt-scheduler.conf"


# ---------------------------------------------------------------------------------- frame rate limiter
def test_frl_in_gpu_specs():
    from vgpuvirt.provision import VgpuRequest
    r = VgpuRequest.parse("nvidia-231,frl=off")
    assert (r.type, r.frl) == ("nvidia-231", False)
    assert VgpuRequest.parse("fb>=2G,series=Q,frl=on").frl is True
    assert VgpuRequest.parse("nvidia-231").frl is None
    with pytest.raises(InvalidSpec, match="frl=on or frl=off"):
        VgpuRequest.parse("nvidia-231,frl=maybe")
    with pytest.raises(InvalidSpec, match="frame rate limiter"):
        VgpuRequest(mode="passthrough", frl=False)


@pytest.fixture
def conn():
    pytest.importorskip("libvirt")
    from provision_fixtures import drop_test_domains

    from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
    c = LibvirtConnection("test:///default", retry=no_retry)
    yield c
    drop_test_domains(c)


def test_frl_off_is_written_before_the_vm_is_defined(conn):
    from vgpuvirt.provision import VgpuRequest, VmRequest, provision
    host = SimHost.from_profile("t4x2")
    name = "frl-" + uuid.uuid4().hex[:6]
    r = provision(host, conn, [VmRequest(name, gpus=(VgpuRequest.parse("nvidia-231,frl=off"),),
                                         start=False)])
    assert r.applied is not None and r.applied.round_trips[host.name] == 1
    (md,) = host.model.mdevs.values()
    assert md.vgpu_params == "frame_rate_limiter=0"
    snap = host.read([f"/sys/bus/mdev/devices/{md.uuid}/nvidia/vgpu_params"])
    assert snap.text(f"/sys/bus/mdev/devices/{md.uuid}/nvidia/vgpu_params") == "frame_rate_limiter=0"


def test_frl_off_on_a_vendor_vf_is_refused_clearly(conn):
    from vgpuvirt.provision import VgpuRequest, VmRequest, provision
    host = SimHost.from_profile("l40s-vgpu17")
    with pytest.raises((InvalidSpec, ProvisioningError), match="frame rate limiter"):
        provision(host, conn, [VmRequest("frl-vf-" + uuid.uuid4().hex[:6],
                                         gpus=(VgpuRequest.parse("fb>=2G,frl=off"),))])
    assert not host.model.mdevs and all(d.vendor_type == 0 for d in host.model.devices.values())


def test_agent_nvml_structures_match_pynvml():
    """The agent's ctypes layouts of the scheduler structures are NVML's (pynvml's, field for field in size)."""
    pynvml = pytest.importorskip("pynvml")
    import ctypes

    from vgpuvirt.host import agent
    _, get_state, set_state, caps, log, pci_info = agent._nvml_structs()
    assert ctypes.sizeof(pci_info) == ctypes.sizeof(pynvml.nvmlPciInfo_t)
    assert ctypes.sizeof(get_state) == ctypes.sizeof(pynvml.c_nvmlVgpuSchedulerGetState_t)
    assert ctypes.sizeof(set_state) == ctypes.sizeof(pynvml.c_nvmlVgpuSchedulerSetState_t)
    assert ctypes.sizeof(caps) == ctypes.sizeof(pynvml.c_nvmlVgpuSchedulerCapabilities_t)
    assert ctypes.sizeof(log) == ctypes.sizeof(pynvml.c_nvmlVgpuSchedulerLog_t)
    assert log.entries.offset == pynvml.c_nvmlVgpuSchedulerLog_t.logEntries.offset


def test_without_the_nvml_library_the_agent_says_so(tmp_path):
    from vgpuvirt.host.local import LocalHost
    from vgpuvirt.sim import materialize
    materialize("t4x2", str(tmp_path))
    g0 = read_schedulers(LocalHost(str(tmp_path)), [GPU0])[0]
    # this machine has no NVIDIA driver: NVML's library is missing (or has no such GPU)
    assert not g0.nvml and ("NVML library not found" in g0.nvml_error or "Not Found" in g0.nvml_error)
    assert g0.current == S(policy="best-effort") and g0.current_source == "module parameters"


def test_a_gpu_without_vgpu_is_refused_and_nothing_written():
    host = SimHost.from_profile("desktop")               # a consumer GPU on the nvidia driver
    (g,) = read_schedulers(host)
    # worded as the real H100 (driver 580) answered through the agent
    assert not g.nvml and not g.vgpu_capable and g.nvml_error == "GetVgpuSchedulerState: Not Supported"
    with pytest.raises(SchedulerError, match="not supported on this GPU"):
        plan_schedulers(host, {g.address: S(policy="equal-share")})
    assert host.model.sched.modprobe == {}


def test_registry_path_rerun_converges_with_adaptive():
    host = SimHost.from_profile("t4x2")
    host.model.sched.nvml_supported = False
    want = S(policy="fixed-share", adaptive=True)
    apply_schedulers(host, plan_schedulers(host, {GPU0: want}))
    again = plan_schedulers(host, {GPU0: want})
    assert [c.via for c in again.changes] == ["none"] and again.ops == ()


@pytest.mark.parametrize("profile", ["desktop", "t4x2", "mixed"])
def test_the_all_gpus_read_answers_each_gpu_as_its_own_call_does(profile: str) -> None:
    """The agent builds NVML's ``all`` answer from one call per GPU NVML sees; the simulator must list the same
    GPUs (a board without vGPU too, with its own NOT_SUPPORTED) so that both reads agree."""
    import json

    from vgpuvirt.host.base import Op
    from vgpuvirt.model import PciAddress
    from vgpuvirt.services.scheduler.service import nvidia_gpus

    h = SimHost.from_profile(profile)
    gpus = nvidia_gpus(h)
    (everything,) = h.apply([Op.nvml("vgpu_scheduler_get", ["all"], read_only=True)], lock=False).results
    listed = {str(PciAddress.from_nvml(e["gpu"])): e for e in json.loads(everything.stdout)}
    one_by_one = h.apply([Op.nvml("vgpu_scheduler_get", [PciAddress.parse(g).nvml_bus_id], read_only=True)
                          for g in gpus], lock=False, on_error="continue").results
    for g, r in zip(gpus, one_by_one, strict=True):
        if r.rc == 6:          # NVML does not see it (bound to vfio-pci): not listed either
            assert g not in listed
            continue
        assert g in listed, f"{g} answers {r.rc} {r.error} alone but is missing from the all-GPUs read"
        assert (listed[g]["ok"], listed[g]["rc"], listed[g]["error"]) == (r.ok, r.rc if not r.ok else 0, r.error)
