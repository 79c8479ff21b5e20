"""A real H100 recorded by vgpuvirt itself (`scripts/real_host_capture.sh` on a lent GPU machine, 2026-11-26):
`vgpuvirt capture --redact` and every read-only verb's output there (tests/fixtures/real/h100-580/live/).

There vgpuvirt ran as ``--host local`` with pynvml installed, so the inventory took its GPU facts and readings
from NVML; the replay (like any remote host) takes them from nvidia-smi. The two paths were written from
documents by the same hands: on the real GPU they must give the same answer, except the few fields that name
their source. Three of this session's findings are pinned here: the NVML inventory had no health and no MIG
device count, and the simulator's NVML scheduler refusal was not worded as the real one."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
from live_capture import READ_VERBS, REAL, cli_json, recorded

from vgpuvirt.cli import main as cli_main

LIVE = REAL / "h100-580" / "live"
CAPTURE = LIVE / "capture.json"


def replay(*argv: str, rc: int = 0) -> Any:
    return cli_json(f"capture:{CAPTURE}", *argv, rc=rc)


@pytest.mark.parametrize(("argv", "name", "rc"), READ_VERBS)
def test_the_replay_answers_as_the_real_host_did(argv: tuple[str, ...], name: str, rc: int) -> None:
    assert replay(*argv, rc=rc) == recorded(LIVE, name)


def test_the_inventory_through_nvidia_smi_is_the_inventory_through_nvml() -> None:
    live, again = recorded(LIVE, "inventory"), replay("inventory")
    (l_gpu,), (r_gpu,) = live["gpus"], again["gpus"]
    l_facts, r_facts = l_gpu["nvidia"], r_gpu["nvidia"]
    # the fields that name their source, and nothing else
    assert (l_facts.pop("source"), r_facts.pop("source")) == ("nvml", "nvidia-smi")
    assert l_facts.pop("not_supported") == ["host_vgpu_mode", "vgpu_heterogeneous_mode", "supported_vgpus",
                                            "creatable_vgpus", "active_vgpus"]
    assert r_facts.pop("not_supported") == []
    assert live.pop("sources") == {"sysfs": "ok", "nvidia_smi": "not run", "nvml": "ok", "kernel_log": "ok"}
    assert again.pop("sources") == {"sysfs": "ok", "nvidia_smi": "ok", "nvml": "not used", "kernel_log": "ok"}
    # the findings: NVML's inventory now judges health (this board has one uncorrectable ECC error over its
    # life: a warning, not a refusal) and counts MIG devices (0, MIG off) as -q -x does
    assert l_gpu["health"] == {"healthy": True, "reasons": [],
                               "warnings": ["1 uncorrectable ECC error(s) over the board's life"]}
    assert l_facts["mig_devices"] == 0
    assert live == again


def test_metrics_through_nvml_and_through_nvidia_smi_differ_only_in_time_and_rounding() -> None:
    live, again = recorded(LIVE, "metrics"), replay("metrics")
    for d in (live, again, live["hosts"][0], again["hosts"][0]):
        d.pop("collected_at")
    (l_host,), (r_host,) = live["hosts"], again["hosts"]
    l_host.pop("duration_s")
    r_host.pop("duration_s")
    assert (l_host["sources"].pop("nvml"), r_host["sources"].pop("nvml")) == ("ok", "not used")
    (l_gpu,), (r_gpu,) = l_host["gpus"], r_host["gpus"]
    # NVML gives milliwatts; nvidia-smi prints two decimals (the capture's -q -x came a moment apart)
    assert l_gpu.pop("power_w") == pytest.approx(r_gpu.pop("power_w"), abs=1.0)
    assert live == again


def test_the_capture_is_redacted_and_refuses_changes() -> None:
    text = CAPTURE.read_text()
    data = json.loads(text)
    assert data["redacted"] is True and data["format"] == "vgpuvirt-capture"
    assert "firecracker" not in text and "vsock" not in text          # the guest's own command line is gone
    assert data["entries"]["/proc/cmdline"][1] == "pci=realloc=off\n"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli_main(["--host", f"capture:{CAPTURE}", "mig", "enable", "0"]) == 1


def test_the_simulated_h100_answers_as_the_real_one() -> None:
    """sim:h100-sxm5 (built from the first H100's transcript) against this second H100, recorded by vgpuvirt:
    the same answers for what vgpuvirt decides on, apart from the board's identity and its own ECC history."""
    real, sim = replay("inventory"), cli_json("sim:h100-sxm5", "inventory")
    for inv in (real, sim):
        inv.pop("host")
        (gpu,) = inv["gpus"]
        gpu["nvidia"].pop("uuid")
        gpu["health"].pop("warnings")                  # this board: 1 uncorrectable ECC error over its life
    assert real == sim
    for argv in (("types",), ("scheduler", "show")):
        assert replay(*argv) == cli_json("sim:h100-sxm5", *argv)
    real_mig, sim_mig = replay("mig", "show"), cli_json("sim:h100-sxm5", "mig", "show")
    assert real_mig.pop("host") == "local" and sim_mig.pop("host") == "sim:h100-sxm5"
    assert real_mig == sim_mig

