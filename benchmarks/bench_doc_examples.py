"""The documentation examples' command lines, run as tests/unit/test_doc_examples.py runs them, two ways:
each ``vgpuvirt`` a whole ``python -m vgpuvirt`` (the baseline, as before), and each a process forked from one
interpreter that imported the CLI once (tests/unit/cli_zygote.py, what the test uses).

    .venv/bin/python benchmarks/bench_doc_examples.py [--rounds 2]

Every ``sh`` block of README.md and docs/*.md that needs no testbed, each line through ``bash -c`` in a scratch
directory; the rounds interleave the two ways and the best round counts. Printed per way: wall time and the
machine's CPU time over the round (``/proc/stat``: the forked processes are not this process's children).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "unit"), str(REPO)]

from cli_zygote import Zygote  # noqa: E402
from test_doc_examples import CASES, comment  # noqa: E402


def machine_cpu() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")   # user nice system irq softirq steal


def blocks() -> list[list[str]]:
    out = []
    for case in CASES:
        _path, _n, block = case.values
        cmds = [cmd for _, cmd in block]
        if not any("(testbed)" in comment(c) for c in cmds):
            out.append(cmds)
    return out


def run_all(bindir: Path, todo: list[list[str]]) -> tuple[float, float, int]:
    """(wall s, machine CPU s, command lines run)."""
    n = 0
    t, c = time.monotonic(), machine_cpu()
    for cmds in todo:
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "examples").symlink_to(REPO / "examples")
            env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80",
                   "VGPUVIRT_AUDIT_LOG": str(Path(d) / "audit.jsonl")}
            for cmd in cmds:
                if cmd.startswith("export "):
                    name, _, value = cmd[len("export "):].partition("=")
                    env[name] = value
                    continue
                subprocess.run(["bash", "-c", cmd], cwd=d, env=env, capture_output=True, timeout=300)
                n += 1
    return time.monotonic() - t, machine_cpu() - c, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    todo = blocks()
    with tempfile.TemporaryDirectory() as base:
        fresh = Path(base) / "fresh"
        fresh.mkdir()
        exe = fresh / "vgpuvirt"
        exe.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m vgpuvirt "$@"\n')
        exe.chmod(0o755)
        zygote = Zygote(Path(base) / "zygote")
        try:
            best: dict[str, tuple[float, float, int]] = {}
            for _ in range(a.rounds):
                for name, bindir in (("python -m vgpuvirt per command (baseline)", fresh),
                                     ("forked from one warm interpreter", zygote.bindir)):
                    got = run_all(bindir, todo)
                    if name not in best or got[1] < best[name][1]:
                        best[name] = got
        finally:
            zygote.close()
    base_cpu = best["python -m vgpuvirt per command (baseline)"][1]
    print(f"{len(todo)} example blocks without the testbed, best of {a.rounds} interleaved rounds")
    print(f"{'':44s} {'lines':>6s} {'wall s':>8s} {'CPU s':>8s} {'CPU x baseline':>15s}")
    for name, (wall, cpu, n) in best.items():
        print(f"{name:44s} {n:6d} {wall:8.2f} {cpu:8.2f} {cpu / base_cpu:14.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
