"""A layout's vGPU scheduler policy on simulated hosts: apply (NVML path and registry-key path), rerun, assert,
export round trip, rollback, round trips, and the boot unit leaving it to modprobe.d."""

from __future__ import annotations

import pytest
from layout_doubles import FailingWrite

from vgpuvirt.change.scheduler import apply_schedulers
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.layout import dump_layout, parse_layout, verbs
from vgpuvirt.layout.planner import LayoutStep, plan_host
from vgpuvirt.services.scheduler.model import SchedulerSetting as S
from vgpuvirt.services.scheduler.service import plan_schedulers, read_schedulers
from vgpuvirt.sim.host import SimHost

GPU0, GPU1 = "0000:3b:00.0", "0000:d8:00.0"
FILE = "vgpuvirt-scheduler.conf"


def lay(scheduler: str = "{policy: fixed-share, timeslice-ms: 2}", mode: str = "vgpu",
        devices: str = "{T4-2Q: 1}") -> verbs.LayoutConfig:
    extra = f"      vgpu-devices: {devices}\n" if mode == "vgpu" else ""
    sched = f"      scheduler: {scheduler}\n" if scheduler else ""
    return parse_layout(f"version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: {mode}\n{extra}{sched}",
                        "s.yaml").config()


FIXED2 = S(policy="fixed-share", timeslice_us=2000)


def test_nvml_path_sets_it_now_and_for_the_next_driver_load() -> None:
    host = SimHost.from_profile("t4x2")
    r = verbs.apply_host(host, lay())
    texts = [s.text for s in r.done]
    assert any("through NVML" in t for t in texts) and any("RmPVMRL" in t for t in texts)
    assert not r.pending_reload and r.to_dict()["pending_driver_reload"] == []
    # the simulated driver's own view: NVML's state now, and its reading of the key at the next load
    assert host.model.sched.state[GPU0] == {"policy": 3, "arr": 1, "timeslice_ns": 2_000_000}
    assert "RmPVMRL" in host.model.sched.modprobe[FILE]
    # the scheduler read and write rode in the layout's own round trips
    plain = verbs.apply_host(SimHost.from_profile("t4x2"), lay(scheduler=""))
    assert r.round_trips == plain.round_trips == {"read": 1, "prepare": 0, "devices": 1}
    assert verbs.check_notes(host, lay()) == ([], [])
    again = verbs.apply_host(host, lay())
    assert not again.changed and again.round_trips == {"read": 1}
    host.model.sched.reload_driver()
    assert [g.current for g in read_schedulers(host, [GPU0, GPU1])] == [FIXED2, FIXED2]
    assert verbs.check_notes(host, lay()) == ([], [])


def test_registry_path_is_pending_in_plan_report_and_assert() -> None:
    host = SimHost.from_profile("t4x2")
    host.model.sched.nvml_supported = False
    p = verbs.plan(host, lay())
    assert any("pending until the driver reloads" in d.format() for d in p.diffs)
    assert [s.reload_pending for s in p.steps if s.change.kind.startswith("scheduler")] == [True]
    r = verbs.apply_host(host, lay())
    out = r.to_dict()
    assert len(out["pending_driver_reload"]) == 1 and not any("RmPVMRL" in t for t in out["done"])
    assert host.model.sched.loaded["NVreg_RegistryDwordsPerDevice"] == ""        # nothing loaded yet
    # the host will run it after the next driver load: no difference, and a note that it is not active yet
    diffs, notes = verbs.check_notes(host, lay())
    assert diffs == [] and len(notes) == 2 and all("pending until the driver reloads" in n for n in notes)
    assert not verbs.apply_host(host, lay()).changed
    host.model.sched.reload_driver()
    assert verbs.check_notes(host, lay()) == ([], [])
    assert [g.current for g in read_schedulers(host, [GPU0, GPU1])] == [FIXED2, FIXED2]


def test_assert_names_a_current_or_pending_difference() -> None:
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, lay())
    # someone changes GPU0 through NVML (now only): the running policy differs
    apply_schedulers(host, plan_schedulers(host, {GPU0: S(policy="equal-share")}))
    diffs = verbs.check(host, lay())
    assert len(diffs) == 1 and diffs[0].startswith(GPU0) and "scheduler equal-share -> fixed-share" in diffs[0]
    verbs.apply_host(host, lay())
    assert verbs.check(host, lay()) == []
    # the key in modprobe.d is gone: what the next driver load runs differs, though NVML runs the policy now
    host.model.sched.modprobe[FILE] = ""
    diffs = verbs.check(host, lay())
    assert len(diffs) == 2 and all("kept at the next driver load" in d for d in diffs)


def test_export_writes_a_non_default_policy_and_round_trips() -> None:
    host = SimHost.from_profile("t4x2")
    assert "scheduler" not in dump_layout(verbs.export(host))        # best effort, the default: not written
    verbs.apply_host(host, lay())
    exported = verbs.export(host)
    assert all(e.layout.scheduler is not None and e.layout.scheduler.to_dict() ==
               {"policy": "fixed-share", "timeslice-ms": 2} for e in exported.config().entries)
    assert not verbs.apply_host(host, exported.config()).changed
    other = SimHost.from_profile("t4x2")
    other.model.sched.nvml_supported = False
    verbs.apply_host(other, exported.config())
    other.model.sched.reload_driver()
    assert dump_layout(verbs.export(other)) == dump_layout(exported)


@pytest.mark.parametrize("nvml", [True, False])
def test_a_failed_apply_puts_the_previous_setting_back(monkeypatch: pytest.MonkeyPatch, nvml: bool) -> None:
    host = SimHost.from_profile("t4x2")
    host.model.sched.nvml_supported = nvml
    apply_schedulers(host, plan_schedulers(host, {GPU1: S(policy="equal-share")}, persist=True))
    before_file = host.model.sched.modprobe[FILE]
    before = read_schedulers(host, [GPU0, GPU1])
    real = plan_host

    def with_a_failing_step(*a: object, **k: object) -> object:
        p = real(*a, **k)  # type: ignore[arg-type]
        step = LayoutStep(p.steps[0].gpu, FailingWrite(host.name, ""))
        return type(p)(p.host, (*p.steps, step), p.diffs, p.pending, p.notes)

    monkeypatch.setattr(verbs, "plan_host", with_a_failing_step)
    with pytest.raises(ProvisioningError) as exc:
        verbs.apply_host(host, lay())
    assert any("RmPVMRL" in c for c in exc.value.completed)
    assert not any("FAILED" in line for line in exc.value.rollback)
    assert host.model.sched.modprobe[FILE] == before_file
    assert read_schedulers(host, [GPU0, GPU1]) == before


def test_a_scheduler_where_there_is_none_is_refused_and_changes_nothing() -> None:
    host = SimHost.from_profile("t4x2")
    with pytest.raises(InvalidSpec, match="mode passthrough"):
        verbs.apply_host(host, lay(mode="passthrough"))
    with pytest.raises(InvalidSpec, match="average-factor"):
        verbs.apply_host(host, lay(scheduler="{policy: equal-share, average-factor: 3}"))
    assert FILE not in host.model.sched.modprobe and not host.model.sched.state
    gvt = SimHost.from_profile("gvtg")
    with pytest.raises(InvalidSpec, match="only NVIDIA vGPU GPUs"):
        verbs.plan(gvt, parse_layout("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n"
                                     "      scheduler: {policy: equal-share}\n", "g.yaml").config())


def test_round_trips_stay_constant_in_the_gpu_count() -> None:
    big = SimHost.from_profile("large")
    r = verbs.apply_host(big, lay(devices="{A10-2Q: 1}"))
    assert r.round_trips == {"read": 1, "prepare": 0, "devices": 1}
    assert len([s for s in r.done if "through NVML" in s.text]) == 8


def test_the_boot_program_leaves_the_scheduler_to_modprobe_d() -> None:
    from vgpuvirt.layout.boot import boot_program

    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, lay())
    program = boot_program(host, lay())
    assert "scheduler" not in repr(program) and "modprobe" not in repr(program)


def test_cli_plan_apply_and_assert_notes(tmp_path: object, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from vgpuvirt.cli import main

    f = Path(str(tmp_path)) / "s.yaml"
    f.write_text("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n      vgpu-devices: {T4-2Q: 1}\n"
                 "      scheduler: {policy: equal-share}\n")
    assert main(["--host", "sim:t4x2", "layout", "plan", str(f)]) == 0
    out = capsys.readouterr().out
    assert "scheduler best-effort -> equal-share" in out and "through NVML" in out and "RmPVMRL" in out
    assert main(["--host", "sim:t4x2", "layout", "apply", str(f)]) == 0
    assert "set the vGPU scheduler of 0000:3b:00.0 to equal-share" in capsys.readouterr().out
    # what the registry path leaves after apply: no difference, a note (exit 0)
    monkeypatch.setattr(verbs, "check_notes", lambda h, c, d=None: ([], [f"{GPU0}: scheduler equal-share pending"]))
    assert main(["--host", "sim:t4x2", "layout", "assert", str(f)]) == 0
    out = capsys.readouterr().out
    assert ": ok" in out and f"note: {GPU0}: scheduler equal-share pending" in out


def test_registry_options_it_cannot_read_do_not_break_the_layout_read() -> None:
    host = SimHost.from_profile("t4x2")
    host.model.sched.modprobe["other.conf"] = 'options nvidia NVreg_RegistryDwords="RmPVMRL=0x21"\n'  # policy bits 2
    assert verbs.export(host).config().entries and verbs.check(host, lay(scheduler="")) != []
    with pytest.raises(InvalidSpec, match="scheduler show"):
        verbs.apply_host(host, lay())
    assert not host.model.sched.state and FILE not in host.model.sched.modprobe
