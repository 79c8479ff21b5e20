"""A real H200 recorded by vgpuvirt itself (`scripts/real_host_capture.sh` on a lent machine, 2026-11-26; see
tests/fixtures/real/h200-580/live/README.md): the replay answers as the host did, the nvidia-smi inventory equals
the NVML one apart from the fields that name their source, and `sim:h200` answers as the real board."""

from __future__ import annotations

import pytest
from live_capture import READ_VERBS, REAL, cli_json, nvml_beside_smi, recorded

LIVE = REAL / "h200-580" / "live"
CAPTURE = LIVE / "capture.json"


@pytest.mark.parametrize(("argv", "name", "rc"), READ_VERBS)
def test_the_replay_answers_as_the_real_h200_did(argv: tuple[str, ...], name: str, rc: int) -> None:
    assert cli_json(f"capture:{CAPTURE}", *argv, rc=rc) == recorded(LIVE, name)


def test_the_h200_inventory_through_nvidia_smi_is_the_one_through_nvml() -> None:
    nvml, smi = nvml_beside_smi(LIVE, CAPTURE)
    (n_gpu,) = nvml["gpus"]
    assert n_gpu["health"] is not None and n_gpu["nvidia"]["mig_devices"] == 0     # the two NVML findings
    assert nvml == smi


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
