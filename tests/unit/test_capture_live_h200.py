"""A real H200 recorded by vgpuvirt itself (`scripts/real_host_capture.sh` on a lent machine, 2026-11-26; see
tests/fixtures/real/h200-580/live/README.md): the replay answers as the host did, the nvidia-smi inventory equals
the NVML one apart from the fields that name their source, and `sim:h200` answers as the real board."""

from __future__ import annotations

import pytest
from live_capture import REAL, cli_json, recorded

LIVE = REAL / "h200-580" / "live"
CAPTURE = LIVE / "capture.json"


@pytest.mark.parametrize(("argv", "name", "rc"), [
    (("types",), "types", 0), (("mig", "show"), "mig-show", 0), (("scheduler", "show"), "scheduler-show", 0),
    (("layout", "export"), "layout-export", 0), (("sriov", "show"), "sriov-show", 0),
    (("mdev", "list"), "mdev-list", 0), (("iommu", "check", "0000:00:06.0"), "iommu-check", 1),
])
def test_the_replay_answers_as_the_real_h200_did(argv: tuple[str, ...], name: str, rc: int) -> None:
    assert cli_json(f"capture:{CAPTURE}", *argv, rc=rc) == recorded(LIVE, name)


def test_the_h200_inventory_through_nvidia_smi_is_the_one_through_nvml() -> None:
    live, again = recorded(LIVE, "inventory"), cli_json(f"capture:{CAPTURE}", "inventory")
    (l_gpu,), (r_gpu,) = live["gpus"], again["gpus"]
    assert (l_gpu["nvidia"].pop("source"), r_gpu["nvidia"].pop("source")) == ("nvml", "nvidia-smi")
    assert r_gpu["nvidia"].pop("not_supported") == [] and l_gpu["nvidia"].pop("not_supported")
    assert live.pop("sources")["nvml"] == "ok" and again.pop("sources")["nvml"] == "not used"
    assert l_gpu["health"] is not None and l_gpu["nvidia"]["mig_devices"] == 0     # the two NVML findings
    assert live == again


def test_the_simulated_h200_answers_as_the_real_one() -> None:
    real, sim = cli_json(f"capture:{CAPTURE}", "inventory"), cli_json("sim:h200", "inventory")
    for inv in (real, sim):
        inv.pop("host")
        inv["gpus"][0]["nvidia"].pop("uuid")
    assert real == sim
    for argv in (("types",), ("scheduler", "show")):
        assert cli_json(f"capture:{CAPTURE}", *argv) == cli_json("sim:h200", *argv)
    real_mig, sim_mig = cli_json(f"capture:{CAPTURE}", "mig", "show"), cli_json("sim:h200", "mig", "show")
    assert (real_mig.pop("host"), sim_mig.pop("host")) == ("local", "sim:h200")
    assert real_mig == sim_mig
