"""How long the `vgpuvirt` command takes as a whole process, next to an empty Python in the same run.

    .venv/bin/python benchmarks/bench_cli_start.py [--runs 20] [--local]

Each command runs --runs times (after one warm-up run that also writes the bytecode caches, as an installed
package has them: PYTHONDONTWRITEBYTECODE is dropped for the children) and the best and median wall times are
printed with their ratio to `python -c pass`. The "every verb imported" line is the cost of the former start
(the parser built from every verb module), measured in the same run as the baseline for the gain.
``--local`` adds the same verbs on this machine (``--host local``: a real GPU host, where NVML answers), the
interpreter without ``site``, and nvidia-smi's own start where it is installed (scripts/real_host_capture.sh runs it).
Targets (issue 25): `--help` <= 100 ms and `--json --host sim:t4x2 inventory` <= 250 ms on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

COMMANDS: list[tuple[str, list[str]]] = [
    ("python -c pass (baseline)", [PY, "-c", "pass"]),
    ("vgpuvirt --help", [PY, "-m", "vgpuvirt", "--help"]),
    ("vgpuvirt --json --host sim:t4x2 inventory", [PY, "-m", "vgpuvirt", "--json", "--host", "sim:t4x2", "inventory"]),
    ("vgpuvirt --json --host sim:t4x2 metrics", [PY, "-m", "vgpuvirt", "--json", "--host", "sim:t4x2", "metrics"]),
    ("vgpuvirt xml build vdi (no host)", [PY, "-m", "vgpuvirt", "xml", "build", "vdi", "--name", "bench",
                                          "--mdev", "4b20d080-1b54-4048-85b3-a6a62d165c01"]),
    # the former start: every verb module imported to build the parser, then --help
    ("every verb imported, --help (before)", [PY, "-c", "import sys; from vgpuvirt.cli import build_parser, main; "
                                              "build_parser(); sys.exit(main(['--help']))"]),
]


LOCAL: list[tuple[str, list[str]]] = [
    ("python -S -c pass", [PY, "-S", "-c", "pass"]),
    ("vgpuvirt --json inventory (local)", [PY, "-m", "vgpuvirt", "--json", "inventory"]),
    ("vgpuvirt --json metrics (local)", [PY, "-m", "vgpuvirt", "--json", "metrics"]),
    ("vgpuvirt --json types (local)", [PY, "-m", "vgpuvirt", "--json", "types"]),
]
NVIDIA_SMI: list[tuple[str, list[str]]] = [
    ("nvidia-smi -L", ["nvidia-smi", "-L"]),
    ("nvidia-smi --query-gpu=<6 fields>", ["nvidia-smi", "--query-gpu=name,pci.bus_id,memory.total,memory.used,"
                                           "utilization.gpu,mig.mode.current", "--format=csv"]),
]


def time_one(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--local", action="store_true", help="also this machine's verbs and nvidia-smi (a GPU host)")
    a = ap.parse_args()
    commands = list(COMMANDS)
    if a.local:
        commands += LOCAL + (NVIDIA_SMI if shutil.which("nvidia-smi") else [])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # this checkout first; a PYTHONPATH already set (wheels carried to a GPU host) stays behind it
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    for _label, argv in commands:
        time_one(argv, env)                                  # warm-up: page cache and __pycache__
    # interleaved, so a burst of load from elsewhere hits every command alike
    samples: dict[str, list[float]] = {label: [] for label, _ in commands}
    for _ in range(a.runs):
        for label, argv in commands:
            samples[label].append(time_one(argv, env))
    base_best = min(samples[commands[0][0]])
    base_med = statistics.median(samples[commands[0][0]])
    print(f"{a.runs} runs each, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print(f"{'command':45s} {'best ms':>8s} {'median ms':>10s} {'x pass (best)':>14s} {'x pass (med)':>13s}")
    for label, _ in commands:
        best, med = min(samples[label]), statistics.median(samples[label])
        print(f"{label:45s} {best * 1e3:8.1f} {med * 1e3:10.1f} {best / base_best:14.1f} {med / base_med:13.1f}")
    helped = statistics.median(samples["vgpuvirt --help"])
    before = statistics.median(samples["every verb imported, --help (before)"])
    print(f"--help: {before / helped:.1f}x faster than with every verb imported (medians)")


if __name__ == "__main__":
    main()
