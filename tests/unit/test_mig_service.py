"""services.mig.state / mig_ops and the MIG change kinds on simulated hosts: one round trip to read every GPU's MIG
state, validated argv, one batch to change through the runner, and a rollback that leaves the host as it was."""

from __future__ import annotations

import pytest
from host_state import diff, fail_last, host_state

from vgpuvirt.change.mig import MigStep, SetMigMode, mig_steps
from vgpuvirt.change.runner import run_host
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.host.base import Op
from vgpuvirt.services.mig.ops import MigAction, check_against
from vgpuvirt.services.mig.state import read_mig_state
from vgpuvirt.sim import SimHost


def _gis(host: SimHost) -> list[tuple[int, int, str, int]]:
    return [(g.index, gi.id, gi.profile, gi.start) for g in read_mig_state(host).gpus for gi in g.gpu_instances]


def test_one_round_trip_reads_every_gpu() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert host.run(["nvidia-smi", "mig", "-i", "0", "-gi", "13", "-cci", "0"]).exit_code == 0
    before = host.round_trips
    state = read_mig_state(host)
    assert host.round_trips == before + 1
    g0, g1 = state.gpus
    assert (str(g0.address), g0.enabled, g0.pending) == ("0000:17:00.0", True, False)
    assert g0.instance_counts() == {"2g.20gb": 3, "1g.10gb": 1}
    assert [(c.gi, c.id, c.profile) for c in g0.compute_instances] == [(13, 0, "1g.10gb")]
    assert g0.free_profiles()["1g.10gb"] == 0 and g0.profile(19) is not None
    assert g0.profile("3g.40gb") is not None and g0.profile("3g.40gb").placements == (0, 4)  # type: ignore[union-attr]
    assert (g1.capable, g1.enabled, g1.gpu_instances) == (True, False, ())
    # MIG off: the board still lists its own profiles, all free (a real H100/H200 on R580 does)
    assert [p.name for p in g1.profiles] == [p.name for p in g0.profiles]
    assert all(p.free == p.total for p in g1.profiles)
    assert state.gpu("0000:65:00.0") is g1 and state.gpu(0) is g0 and state.errors == ()


def test_read_is_one_round_trip_whatever_the_number_of_gpus() -> None:
    host = SimHost.from_profile("large")                                   # 8 GPUs, no MIG
    state = read_mig_state(host)
    assert host.round_trips == 1 and len(state.gpus) == 8 and not any(g.capable for g in state.gpus)
    gvtg = SimHost.from_profile("gvtg")
    assert not read_mig_state(gvtg).available                               # no NVIDIA driver


def test_bad_values_are_refused_before_anything_reaches_the_host() -> None:
    for bad in (lambda: MigAction.create_gi(0, ["1g.10gb; reboot"]), lambda: MigAction.create_gi(0, []),
                lambda: MigAction.create_gi(0, ["1g.10gb"], placements=[9]), lambda: MigAction.mode(-1, True),
                lambda: MigAction.destroy_gi(0, [1, 1]), lambda: MigAction.destroy_ci(0, 1, [64]),
                lambda: MigAction.create_gi(True, ["19"])):  # type: ignore[arg-type]
        with pytest.raises(InvalidSpec):
            bad()
    a = MigAction.create_gi(1, ["MIG 1g.10gb", 9, "14"], placements=[6, None, 0], default_ci=True)
    assert a.argv() == ["nvidia-smi", "mig", "-i", "1", "-cgi", "1g.10gb:6,9,14:0", "-C"]
    state = read_mig_state(SimHost.from_profile("a30-mig"))
    with pytest.raises(InvalidSpec, match=r"1g\.10gb"):
        check_against(MigAction.create_gi(0, ["1g.10gb"]), state.gpus[0])
    check_against(MigAction.create_gi(0, ["1g.6gb", 5]), state.gpus[0])
    with pytest.raises(InvalidSpec, match=r"one of its starts \{0,2\}"):
        check_against(MigAction.create_gi(0, ["2g.12gb"], placements=[1]), state.gpus[0])


def _steps(host: SimHost, *per_gpu: tuple[int, list[MigAction]]) -> list[MigStep]:
    state = read_mig_state(host)
    return [s for i, acts in per_gpu for s in mig_steps(host.name, state.gpus[i], acts)]


def test_apply_in_one_batch_with_the_one_report() -> None:
    host = SimHost.from_profile("a100-sriov")
    steps = _steps(host, (1, [MigAction.mode(1, True),
                              MigAction.create_gi(1, ["3g.40gb", "1g.10gb"], default_ci=True)]),
                   (0, [MigAction.destroy_gi(0, [13])]))
    before = host.round_trips
    rep = run_host(host, steps, what="mig")
    assert host.round_trips == before + 1 and rep.round_trips == {host.name: 1}
    assert rep.done == ["sim:a100-sriov: turn MIG mode on on 0000:65:00.0",
                        "sim:a100-sriov: create GPU instances 3g.40gb,1g.10gb on 0000:65:00.0",
                        "sim:a100-sriov: destroy GPU instance 13 (1g.10gb) on 0000:17:00.0"]
    assert (1, 1, "3g.40gb", 0) in _gis(host) and (0, 13, "1g.10gb", 6) not in _gis(host)


def test_the_last_create_failing_half_way_rolls_back_to_exactly_the_host_as_before() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert host.run(["nvidia-smi", "-i", "1", "-mig", "1"]).exit_code == 0
    start = host_state(host)
    steps = _steps(host, (0, [MigAction.destroy_gi(0, [13])]),
                   (1, [MigAction.create_gi(1, ["19", "19"], default_ci=True),
                        MigAction.create_gi(1, ["3g.40gb", "4g.40gb"])]))      # 4g at 0 overlaps: fails half-way
    with pytest.raises(ProvisioningError) as err:
        run_host(host, steps, what="mig create")
    assert "Insufficient Resources" in str(err.value.cause)
    # the half-made 3g.40gb is learned from the answer; the two 1g with their CIs; the destroyed 13 made again
    assert err.value.rollback == ["sim:a100-sriov: destroyed the GPU instances 3g.40gb,4g.40gb made on 0000:65:00.0",
                                  "sim:a100-sriov: destroyed the GPU instances 19,19 made on 0000:65:00.0",
                                  "sim:a100-sriov: created GPU instance 1g.10gb on 0000:17:00.0 at placement 6 again"]
    assert diff(start, host_state(host)) == []


def test_a_mode_change_pending_a_reset_fails_the_step_and_is_set_back() -> None:
    host = SimHost.from_profile("a100-sriov")
    host.model.gpus["0000:65:00.0"].processes = 1
    start = host_state(host)
    steps = _steps(host, (1, [MigAction.mode(1, True), MigAction.create_gi(1, ["19"])]))
    with pytest.raises(ProvisioningError, match="pending until the GPU is reset") as err:
        run_host(host, steps, what="mig")
    assert err.value.rollback == ["sim:a100-sriov: turned MIG mode off on 0000:65:00.0 again"]
    g = read_mig_state(host).gpus[1]
    assert (g.mode_current, g.mode_pending) == ("Disabled", "Disabled") and diff(start, host_state(host)) == []
    # asked for as such (`vgpuvirt mig enable`), the pending change is what was wanted
    step = steps[0]
    assert isinstance(step, SetMigMode)
    ok = SetMigMode(step.host, "", step.gpu, step.index, on=True, was=False, pending_ok=True)
    assert run_host(host, [ok], what="mig enable").done == ["sim:a100-sriov: turn MIG mode on on 0000:65:00.0"]
    assert read_mig_state(host).gpus[1].mode_pending == "Enabled"


def test_exec_ops_are_argv_never_a_shell() -> None:
    a = MigAction.create_gi(0, ["1g.10gb"])
    op = Op.exec(a.argv())
    assert op.argv == ("nvidia-smi", "mig", "-i", "0", "-cgi", "1g.10gb") and "sh" not in op.argv


def test_the_capacity_model_reads_the_free_slices_in_the_inventorys_round_trip() -> None:
    from vgpuvirt.services.capacity.build import gpu_budgets
    from vgpuvirt.services.inventory.read import inventory
    host = SimHost.from_profile("a30-mig")
    b = gpu_budgets(inventory(host))[0]
    assert host.round_trips == 1
    assert b.gi_free == {"1g.6gb": 2, "1g.6gb+me": 1, "2g.12gb": 1, "2g.12gb+me": 1, "4g.24gb": 0}
    assert b.to_dict()["budget"]["gpu_instance_profiles_free"] == b.gi_free
    fit = b.fit("nvidia-689")                                               # GRID A30-1-6C on 1g.6gb
    assert fit.fits_now == 2 and "the free slices take 2 more GPU instance(s) of it" in fit.reason
    assert gpu_budgets(inventory(host, nvidia_smi=False))[0].gi_free is None   # not read: not known


def test_listing_failures_without_any_gpu_in_mig_mode_are_not_errors() -> None:
    from vgpuvirt.host.base import OpResult
    from vgpuvirt.services.mig.state import READ_ARGVS, build_mig_state
    host = SimHost.from_profile("t4x2")
    xml = host.run(["nvidia-smi", "-q", "-x"]).stdout
    ok = OpResult(Op.exec(READ_ARGVS[0]), ok=True, rc=0, stdout=xml)
    not_supported = [OpResult(Op.exec(a), ok=False, rc=3, stderr="Not Supported\n") for a in READ_ARGVS[1:]]
    state = build_mig_state("t4", [ok, *not_supported])
    assert state.available and state.errors == () and [g.capable for g in state.gpus] == [False, False]
    a100 = SimHost.from_profile("a100-sriov")
    xml = a100.run(["nvidia-smi", "-q", "-x"]).stdout
    state = build_mig_state("a100", [OpResult(Op.exec(READ_ARGVS[0]), ok=True, rc=0, stdout=xml), *not_supported])
    assert len(state.errors) == 4 and "nvidia-smi mig -lgi failed (exit 3): Not Supported" in state.errors


def test_rollback_creates_again_what_the_batch_destroyed() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert host.run(["nvidia-smi", "mig", "-i", "0", "-gi", "13", "-cci"]).exit_code == 0
    before = read_mig_state(host)
    start = host_state(host)
    steps = _steps(host, (0, [MigAction.destroy_ci(0, 13, [0]), MigAction.destroy_gi(0, [13, 5]),
                              MigAction.create_gi(0, ["7g.80gb"])]))      # 7g: GIs 3 and 4 remain: it fails
    with pytest.raises(ProvisioningError) as err:
        run_host(host, steps, what="mig")
    made = "sim:a100-sriov: created"
    assert err.value.rollback == [f"{made} GPU instance 2g.20gb on 0000:17:00.0 at placement 4 again",
                                  f"{made} GPU instance 1g.10gb on 0000:17:00.0 at placement 6 again",
                                  f"{made} compute instances 0 in GPU instance 13 on 0000:17:00.0 again"]
    after = read_mig_state(host).gpus[0]
    assert after.gpu_instances == before.gpus[0].gpu_instances
    assert after.compute_instances == before.gpus[0].compute_instances
    assert diff(start, host_state(host)) == []


def test_the_last_step_refused_by_the_tool_leaves_the_host_as_before() -> None:
    """An injected failure of the LAST op (nvidia-smi refuses the final destroy): everything before is undone."""
    host = SimHost.from_profile("a100-sriov")
    start = host_state(host)
    steps = _steps(host, (1, [MigAction.mode(1, True), MigAction.create_gi(1, ["1g.10gb"], default_ci=True)]),
                   (0, [MigAction.destroy_gi(0, [13])]))
    with fail_last(host, lambda op: op.op == "exec" and "-dgi" in op.argv) as failed, \
            pytest.raises(ProvisioningError, match="injected failure") as err:
        run_host(host, steps, what="mig")
    assert len(failed) == 1 and len(err.value.completed) == 2
    assert diff(start, host_state(host)) == []


def test_each_action_kind_runs_as_its_step_kind() -> None:
    from vgpuvirt.change.mig import ACTION_STEPS
    assert {k: c.kind for k, c in ACTION_STEPS.items()} == {
        "mode": "mig-mode", "create-gi": "create-gpu-instances", "destroy-gi": "destroy-gpu-instance",
        "create-ci": "create-compute-instances", "destroy-ci": "destroy-compute-instances", "reset": "gpu-reset"}
    g0 = read_mig_state(SimHost.from_profile("a100-sriov")).gpus[0]
    with pytest.raises(InvalidSpec, match="GPU instance of GPU 0"):
        mig_steps("h", g0, [MigAction.destroy_gi(0, [9])])
