"""services.mig.geometry: from a wanted geometry to actions, applied on simulated hosts; a rerun is empty."""

from __future__ import annotations

import pytest

from vgpuvirt.change.mig import mig_steps
from vgpuvirt.change.runner import run_host
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.services.mig.geometry import geometry_actions
from vgpuvirt.services.mig.state import read_mig_state
from vgpuvirt.sim import SimHost


def reach(host: SimHost, index: int, want: dict[str, int], **kw: object) -> list[str]:
    gpu = read_mig_state(host).gpus[index]
    acts = geometry_actions(gpu, want, **kw)  # type: ignore[arg-type]
    run_host(host, mig_steps(host.name, gpu, acts), what="mig geometry")
    return [" ".join(a.argv()) for a in acts]


def test_from_off_to_seven_slices_and_a_rerun_changes_nothing() -> None:
    host = SimHost.from_profile("a100-sriov")
    argv = reach(host, 1, {"1g.10gb": 7})
    assert argv == ["nvidia-smi -i 1 -mig 1", "nvidia-smi mig -i 1 -cgi " + ",".join(["1g.10gb"] * 7)]
    g = read_mig_state(host).gpus[1]
    assert g.instance_counts() == {"1g.10gb": 7}
    assert geometry_actions(g, {"1g.10gb": 7}) == []


def test_mixed_geometry_keeps_what_is_wanted_and_creates_largest_first() -> None:
    host = SimHost.from_profile("a100-sriov")                               # GPU 0: 3 x 2g.20gb + 1 x 1g.10gb
    argv = reach(host, 0, {"2g.20gb": 1, "3g.40gb": 1, "1g.10gb": 1}, default_ci=True)
    assert argv == ["nvidia-smi mig -i 0 -dgi -gi 4", "nvidia-smi mig -i 0 -dgi -gi 3",   # 2g at 2 and 0 go
                    "nvidia-smi mig -i 0 -cgi 3g.40gb -C"]                                  # 3g takes 0-3
    assert read_mig_state(host).gpus[0].instance_counts() == {"2g.20gb": 1, "3g.40gb": 1, "1g.10gb": 1}


def test_a_kept_instance_in_the_way_fails_and_rolls_back_then_rebuild_works() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert host.run(["nvidia-smi", "-i", "1", "-mig", "1"]).exit_code == 0
    assert host.run(["nvidia-smi", "mig", "-i", "1", "-cgi", "19:3"]).exit_code == 0   # a 1g in slice 3 (GI 10)
    want = {"1g.10gb": 1, "4g.40gb": 1}                                      # 4g.40gb can only start at 0
    gpu = read_mig_state(host).gpus[1]
    with pytest.raises(ProvisioningError):
        run_host(host, mig_steps(host.name, gpu, geometry_actions(gpu, want)), what="mig geometry")
    assert [(g.id, g.start) for g in read_mig_state(host).gpus[1].gpu_instances] == [(10, 3)]
    argv = reach(host, 1, want, rebuild=True)
    assert argv == ["nvidia-smi mig -i 1 -dgi -gi 10", "nvidia-smi mig -i 1 -cgi 4g.40gb,1g.10gb"]
    assert sorted((g.profile, g.start) for g in read_mig_state(host).gpus[1].gpu_instances) == [
        ("1g.10gb", 6), ("4g.40gb", 0)]


def test_refusals() -> None:
    state = read_mig_state(SimHost.from_profile("a100-sriov"))
    with pytest.raises(InvalidSpec, match="hold vGPUs"):
        geometry_actions(state.gpus[0], {"7g.80gb": 1}, in_use=[3])
    with pytest.raises(InvalidSpec, match=r"1g\.6gb"):
        geometry_actions(state.gpus[0], {"1g.6gb": 1})                      # not an A100 80GB profile
    with pytest.raises(InvalidSpec):
        geometry_actions(state.gpus[0], {"1g.10gb": -1})
    with pytest.raises(InvalidSpec, match="MIG-capable"):
        geometry_actions(read_mig_state(SimHost.from_profile("t4x2")).gpus[0], {"1g.10gb": 1})
