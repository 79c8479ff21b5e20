"""Layout verbs on simulated hosts: export -> apply -> export, reruns, rollback, and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from layout_doubles import FailingWrite

from vgpuvirt.cli import main
from vgpuvirt.errors import InvalidSpec, NoCapacity, ProvisioningError
from vgpuvirt.layout import dump_layout, parse_layout, verbs
from vgpuvirt.layout.planner import LayoutStep, plan_host
from vgpuvirt.sim.host import SimHost
from vgpuvirt.sim.profiles import list_profiles

PROFILES = list_profiles()

LAB = parse_layout("""\
version: v1
configs:
  day:
    - devices: all
      mode: vgpu
      vgpu-devices: {A10-4Q: 6}
  night:
    - devices: all
      mode: passthrough
  t4-fill:
    - devices: all
      mode: vgpu
      vgpu-devices: {T4-2Q: fill}
  t4-retype:
    - devices: all
      mode: vgpu
      vgpu-devices: {T4-1Q: 2}
  l40s:
    - devices: all
      mode: vgpu
      sizing: equal
      vgpu-devices: {L40S-8Q: 3}
""", "lab.yaml")


@pytest.mark.parametrize("profile", PROFILES)
def test_export_apply_export_is_identical(profile: str) -> None:
    host = SimHost.from_profile(profile)
    before = verbs.export(host)
    result = verbs.apply_host(host, before.config())
    assert not result.changed, [s.text for s in result.done]
    assert dump_layout(verbs.export(host)) == dump_layout(before)


@pytest.mark.parametrize(("profile", "config"), [("a10-sriov", "day"), ("a10-sriov", "night"), ("t4x2", "t4-fill"),
                                                 ("l40s-vgpu17", "l40s"), ("t4x2", "t4-retype")])
def test_a_changed_host_exports_a_layout_that_rebuilds_it(profile: str, config: str) -> None:
    a = SimHost.from_profile(profile)
    done = verbs.apply_host(a, LAB.config(config))
    assert done.changed
    exported = verbs.export(a)
    assert verbs.check(a, LAB.config(config)) == []
    again = verbs.apply_host(a, LAB.config(config))
    assert not again.changed and again.round_trips == {"read": 1}
    b = SimHost.from_profile(profile)
    verbs.apply_host(b, exported.config())
    assert dump_layout(verbs.export(b)) == dump_layout(exported)


def test_round_trips_per_phase_do_not_grow_with_gpus() -> None:
    host = SimHost.from_profile("a10-sriov")
    r = verbs.apply_host(host, LAB.config("day"))
    assert r.round_trips == {"read": 1, "prepare": 1, "re-read": 1, "devices": 1}
    big = SimHost.from_profile("large")
    r = verbs.apply_host(big, parse_layout("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n"
                                           "      vgpu-devices: {A10-2Q: 12}\n").config())
    assert len(r.done) == 8 * 12
    assert r.round_trips == {"read": 1, "prepare": 0, "devices": 1}


def test_reshape_day_night_day() -> None:
    host = SimHost.from_profile("a10-sriov")
    verbs.apply_host(host, LAB.config("day"))
    verbs.apply_host(host, LAB.config("night"))
    assert verbs.export(host).config().entries[0].layout.mode == "passthrough"
    assert verbs.check(host, LAB.config("day"))
    verbs.apply_host(host, LAB.config("day"))
    assert verbs.check(host, LAB.config("day")) == []


def test_rollback_undoes_exactly_what_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, LAB.config("t4-retype"))
    before = dump_layout(verbs.export(host))
    real = plan_host

    def with_a_failing_step(*a: object, **k: object) -> object:
        p = real(*a, **k)  # type: ignore[arg-type]
        step = LayoutStep(p.steps[0].gpu, FailingWrite(host.name, ""))
        return type(p)(p.host, (*p.steps, step), p.diffs, p.pending)

    monkeypatch.setattr(verbs, "plan_host", with_a_failing_step)
    with pytest.raises(ProvisioningError) as exc:
        verbs.apply_host(host, LAB.config("t4-fill"))
    assert exc.value.completed and len(exc.value.rollback) == len(exc.value.completed)
    assert not any("FAILED" in line for line in exc.value.rollback)
    # the runner's one format, "<host>: <what was undone>", in reverse of what ran: the new T4-2Q vGPUs go, then
    # the T4-1Q vGPUs phase 1 removed come back
    undone = [line.removeprefix(f"{host.name}: ") for line in exc.value.rollback]
    assert undone[0] == f"removed vGPU {exc.value.completed[-1].split()[4]}"
    assert undone[-1].startswith("created mdev ") and undone[-1].endswith(" again")
    gone = sum(c.removeprefix(f"{host.name}: ").startswith("remove mdev ") for c in exc.value.completed)
    assert gone and [u.split()[0] for u in undone] == ["removed"] * (len(undone) - gone) + ["created"] * gone
    monkeypatch.undo()
    assert dump_layout(verbs.export(host)) == before


def test_bad_layouts_change_nothing() -> None:
    host = SimHost.from_profile("t4x2")
    with pytest.raises(InvalidSpec, match="A10-4Q"):
        verbs.apply_host(host, LAB.config("day"))
    with pytest.raises(NoCapacity):
        verbs.apply_host(host, parse_layout("version: v1\nconfigs:\n  a:\n    - devices: [0]\n      mode: vgpu\n"
                                            "      vgpu-devices: {T4-2Q: 9}\n").config())
    assert not any(e.layout.vgpu_devices for e in verbs.export(host).config().entries)


def test_cli_plan_apply_assert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "lab.yaml"
    f.write_text(dump_layout(LAB))
    assert main(["--host", "sim:a10-sriov", "layout", "plan", str(f), "-c", "day"]) == 0
    out = capsys.readouterr().out
    assert "set 32 SR-IOV VFs on 0000:41:00.0" in out and "mode off -> vgpu" in out
    assert main(["--host", "sim:a10-sriov", "layout", "assert", str(f), "-c", "day"]) == 1
    assert "DIFFERS" in capsys.readouterr().out
    assert main(["--host", "sim:a10-sriov", "layout", "apply", str(f), "-c", "day"]) == 0
    assert "create mdev" in capsys.readouterr().out
    assert main(["--host", "sim:t4x2", "layout", "export"]) == 0
    assert parse_layout(capsys.readouterr().out).config("exported").entries
    assert main(["--host", "sim:t4x2", "layout", "plan", str(f)]) == 2
    assert "several configs" in capsys.readouterr().err
    assert main(["--host", "sim:t4x2", "layout", "plan", str(tmp_path / "nope.yaml"), "-c", "day"]) == 2


MIG = parse_layout("""\
version: v1
configs:
  train: [{devices: all, mode: mig, mig-devices: {"3g.40gb": 2}}]
  seven: [{devices: all, mode: mig-vgpu, mig-devices: {"1g.10gb": 7}, vgpu-devices: {A100D-1-10C: 7}}]
  ts: [{devices: all, mode: vgpu, vgpu-devices: {A100D-8C: 4}}]
  bad: [{devices: all, mode: mig, mig-devices: {"5g.50gb": 1}}]
""", "mig.yaml")


def test_mig_reshapes_train_seven_time_sliced_and_back() -> None:
    host = SimHost.from_profile("a100-sriov")
    for name in ("train", "seven", "ts", "train"):
        r = verbs.apply_host(host, MIG.config(name))
        assert r.changed and verbs.check(host, MIG.config(name)) == [], name
        assert set(r.round_trips.values()) <= {0, 1, 2}, r.round_trips   # MIG turned on: a second round
    b = SimHost.from_profile("a100-sriov")
    verbs.apply_host(b, verbs.export(host).config())
    assert dump_layout(verbs.export(b)) == dump_layout(verbs.export(host))


def test_mig_bad_profile_and_pending_mode() -> None:
    host = SimHost.from_profile("a100-sriov")
    before = dump_layout(verbs.export(host))
    with pytest.raises(InvalidSpec, match=r"5g\.50gb"):
        verbs.apply_host(host, MIG.config("bad"))
    # a VF bound to vfio-pci makes a mode change wait for a reset: refused, and rolled back
    vf = host.model.vfs(host.model.dev("0000:65:00.0"))[0]
    vf.driver = "vfio-pci"
    with pytest.raises(ProvisioningError, match="pending") as exc:
        verbs.apply_host(host, parse_layout("version: v1\nconfigs:\n  a:\n    - devices: ['0000:65:00.0']\n"
                                            "      mode: mig\n").config())
    assert any("MIG mode" in line for line in exc.value.rollback)
    vf.driver = "nvidia"
    assert dump_layout(verbs.export(host)) == before


def test_the_example_layout_reshapes_the_mixed_host() -> None:
    lab = parse_layout((Path(__file__).parents[2] / "examples/layouts/lab.yaml").read_text(), "lab.yaml")
    host = SimHost.from_profile("mixed")
    for name in ("day", "night", "day"):
        verbs.apply_host(host, lab.config(name))
        assert verbs.check(host, lab.config(name)) == [], name
    modes = {str(e.devices[0].value): e.layout.mode for e in verbs.export(host).config().entries}
    assert modes["0000:41:00.0"] == "vgpu" and modes["0000:85:00.0"] == "vgpu"   # the AMD MxGPU: not selected


def test_equal_size_mode_takes_one_size() -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    mixed = "version: v1\nconfigs:\n  a:\n    - {devices: all, mode: vgpu, vgpu-devices: {L40S-8Q: 2, L40S-16Q: 1}}\n"
    with pytest.raises(InvalidSpec, match="one vGPU size per GPU in equal-size mode"):
        verbs.plan(host, parse_layout(mixed).config())
    assert verbs.plan(host, parse_layout(mixed.replace("}}", "}, sizing: mixed}")).config()).steps


def test_the_diff_documents_are_layouts_each_change_once() -> None:
    """Issue 28 item 10: a check-mode diff's "after" was a comment listing the changes (each change then printed
    twice, as differences and as the comment); now both sides are layout documents of the governed GPUs."""
    lab = Path(__file__).resolve().parents[2] / "examples/layouts/lab.yaml"
    cfg = parse_layout(lab.read_text()).config("day")
    h = SimHost.from_profile("mixed")
    d = verbs.diff_documents(h, cfg)
    before, after = parse_layout(d.before).config("day"), parse_layout(d.after).config("day")
    assert [e.devices[0].value for e in before.entries] == [e.devices[0].value for e in after.entries] == [
        "0000:3b:00.0", "0000:3d:00.0", "0000:41:00.0", "0000:d8:00.0"]
    assert d.changed and list(d.differences) == verbs.check(h, cfg)
    # the "after" document asks for exactly the config's changes: planning it finds the same differences
    assert verbs.check(h, after) == list(d.differences)
    # each change shows once in the document diff: the T4's 8 vGPUs are one line in "after", none in "before"
    assert d.after.count("T4-2Q: 8") == 2 and "T4-2Q" not in d.before
    verbs.apply_host(h, cfg)
    same = verbs.diff_documents(h, cfg)
    assert not same.changed and same.before == same.after
