"""The suite's end-of-run summary under pytest-xdist (issue 25): the generated-case counts are added up over the
workers (each worker counts its own cases; the summary is printed by the controller, which ran none), and the
lanes' test counts and times are printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_pytest(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CI", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / f"bt{len(list(tmp_path.iterdir()))}"), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_workers_counts_add_up_to_the_one_process_count(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    sel = ["tests/fuzz/test_fuzz_model.py", "-k", "PciAddress"]
    one = run_pytest(tmp_path, *sel)
    two = run_pytest(tmp_path, "-n", "2", *sel)
    counts = [re.search(r"fuzz: (\d+) generated cases in (\d+) tests", out) for out in (one, two)]
    assert counts[0] and counts[1], (one[-1500:], two[-1500:])
    assert int(counts[0][2]) >= 2                        # cases in both workers' tests, not one worker's
    assert counts[0].groups() == counts[1].groups()
    assert "lanes: wall" in two and "on 2 xdist workers" in two
    lane = re.search(r"^\s+fuzz\s+(\d+) tests\s+[\d.]+ s of test time", two, re.M)
    assert lane and int(lane[1]) == int(counts[1][2])
