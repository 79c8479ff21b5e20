"""Helpers of the tests that replay a real GPU host recorded by ``scripts/real_host_capture.sh``
(tests/fixtures/real/*/live*/): a verb's ``--json`` answer in-process, and a recorded answer."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from vgpuvirt.cli import main as cli_main

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"


def cli_json(host: str, *argv: str, rc: int = 0) -> Any:
    """``vgpuvirt --host HOST --json ARGV...`` run in this process: its exit status checked, its answer parsed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli_main(["--host", host, "--json", *argv]) == rc
    return json.loads(out.getvalue())


def recorded(live: Path, name: str) -> Any:
    """What ``vgpuvirt --host local --json VERB`` answered on the real host (``live/recorded/NAME.json``)."""
    return json.loads((live / "recorded" / f"{name}.json").read_text())
