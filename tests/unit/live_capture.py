"""Helpers of the tests that replay a real GPU host recorded by ``scripts/real_host_capture.sh``
(tests/fixtures/real/*/live*/): a verb's ``--json`` answer in-process, a recorded answer, the verbs recorded, and
the recorded NVML inventory set beside its replay through nvidia-smi."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from vgpuvirt.cli import main as cli_main

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"

#: the read-only verbs the capture script records: (argv, recorded answer's name, exit status there)
READ_VERBS = [
    (("types",), "types", 0), (("mig", "show"), "mig-show", 0), (("scheduler", "show"), "scheduler-show", 0),
    (("layout", "export"), "layout-export", 0), (("sriov", "show"), "sriov-show", 0),
    (("mdev", "list"), "mdev-list", 0),
    (("iommu", "check", "0000:00:06.0"), "iommu-check", 1),      # refused: a guest without IOMMU
]


def cli_json(host: str, *argv: str, rc: int = 0) -> Any:
    """``vgpuvirt --host HOST --json ARGV...`` run in this process: its exit status checked, its answer parsed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli_main(["--host", host, "--json", *argv]) == rc
    return json.loads(out.getvalue())


def recorded(live: Path, name: str) -> Any:
    """What ``vgpuvirt --host local --json VERB`` answered on the real host (``live/recorded/NAME.json``)."""
    return json.loads((live / "recorded" / f"{name}.json").read_text())


def nvml_beside_smi(live: Path, capture: Path) -> tuple[Any, Any]:
    """The inventory recorded on the host (through NVML) and its replay's (through nvidia-smi), less the fields
    that name their source (checked to name NVML and nvidia-smi): what is left must be the same answer."""
    nvml, smi = recorded(live, "inventory"), cli_json(f"capture:{capture}", "inventory")
    (n_gpu,), (s_gpu,) = nvml["gpus"], smi["gpus"]
    assert (n_gpu["nvidia"].pop("source"), s_gpu["nvidia"].pop("source")) == ("nvml", "nvidia-smi")
    assert s_gpu["nvidia"].pop("not_supported") == [] and n_gpu["nvidia"].pop("not_supported")
    assert nvml.pop("sources")["nvml"] == "ok" and smi.pop("sources")["nvml"] == "not used"
    return nvml, smi
