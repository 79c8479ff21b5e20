"""A second H100 board, recorded by today's tree (`scripts/real_host_capture.sh` on a lent machine; see
tests/fixtures/real/h100-580/live-b/README.md): the replay answers as the host did, the nvidia-smi inventory is
the NVML one, and the two boards' recordings, made by trees weeks of commits apart, agree wherever the answer
is the kind's and not the board's own (its UUID, its ECC record)."""

from __future__ import annotations

import pytest
from live_capture import READ_VERBS, REAL, cli_json, nvml_beside_smi, recorded

LIVE_B, LIVE_A = REAL / "h100-580" / "live-b", REAL / "h100-580" / "live"
CAPTURE_B = LIVE_B / "capture.json"


@pytest.mark.parametrize(("argv", "name", "rc"), READ_VERBS)
def test_the_replay_answers_as_the_second_h100_did(argv: tuple[str, ...], name: str, rc: int) -> None:
    assert cli_json(f"capture:{CAPTURE_B}", *argv, rc=rc) == recorded(LIVE_B, name)


def test_its_inventory_through_nvidia_smi_is_the_one_through_nvml() -> None:
    nvml, smi = nvml_beside_smi(LIVE_B, CAPTURE_B)
    assert nvml == smi


@pytest.mark.parametrize("name", [n for _, n, _ in READ_VERBS])
def test_both_boards_answer_alike(name: str) -> None:
    assert recorded(LIVE_B, name) == recorded(LIVE_A, name)


def test_both_inventories_differ_only_in_what_is_the_boards_own() -> None:
    a, b = recorded(LIVE_A, "inventory"), recorded(LIVE_B, "inventory")
    (ga,), (gb,) = a["gpus"], b["gpus"]
    # board A had an uncorrected ECC error on record (its health warning); board B has none
    assert ga["health"]["warnings"] and not gb["health"]["warnings"]
    assert ga["nvidia"]["uuid"] == gb["nvidia"]["uuid"] == "GPU-00000000-0000-4000-8000-000000000001"  # redacted
    for g in (ga, gb):
        g["health"].pop("warnings")
    assert a == b
