"""The host agent's own start, without SSH: what one exec of it costs on the machine that runs it.

    python3 benchmarks/bench_agent_exec.py [--rounds 20] [--python python3]

Runs, interleaved in each round so a burst of load hits them alike: `true`, `python3 -I -S -c pass` (the
interpreter's floor), and an empty request (`{"root": "/", "reads": []}`) to the agent started exactly as
SSHHost starts it (`agent_command` with the parts `parts_needed` names: the core alone), once as source and once
as this client's bytecode, and as bytecode with every part (the baseline: the whole agent, as before it
travelled in parts). Over SSH the same
exec also pays the session channel; bench_inventory.py --start-only measures that end to end. This one runs
where no sshd is (a GPU host lent for a few minutes) and isolates the agent's share.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpuvirt.host.agent import parts_needed
from vgpuvirt.host.ssh_agent import agent_command


def empty_request() -> str:
    payload = json.dumps({"root": "/", "reads": [], "compress": True}).encode()
    return base64.b64encode(zlib.compress(payload, 6)).decode("ascii")


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    dt = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} {' '.join(a[:20] for a in argv[1:3])} ... failed ({done.returncode}): "
                         f"{done.stderr.decode(errors='replace')[-400:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--python", default="python3", help="the host's interpreter (default: python3)")
    a = ap.parse_args()
    request = empty_request()
    parts = parts_needed({"root": "/", "reads": []})
    calls = {
        "true": ["true"],
        "python3 -I -S -c pass": [a.python, "-I", "-S", "-c", "pass"],
        "agent as source": [*agent_command(a.python, bytecode=False, parts=parts), request],
        "agent as bytecode": [*agent_command(a.python, bytecode=True, parts=parts), request],
        "bytecode, every part": [*agent_command(a.python, bytecode=True), request],
    }
    answer = subprocess.run(calls["agent as bytecode"], stdout=subprocess.PIPE, check=True).stdout
    if b"bytecode for another python" in answer:
        raise SystemExit("this python reads other bytecode than the client's: run it with the client's python")
    for argv in calls.values():   # warm-up: page cache
        timed(argv)
    runs: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(a.rounds):
        for name, argv in calls.items():
            runs[name].append(timed(argv))
    t_best, t_med = min(runs["true"]), statistics.median(runs["true"])
    version = subprocess.run([a.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    print(f"{a.rounds} interleaved rounds, one exec each, {a.python} ({version})")
    print(f"{'exec':26s} {'best ms':>8s} {'median ms':>10s} {'x true (best)':>14s} {'x true (med)':>13s}")
    for name, samples in runs.items():
        best, med = min(samples), statistics.median(samples)
        print(f"{name:26s} {best * 1000:8.1f} {med * 1000:10.1f} {best / t_best:14.2f} {med / t_med:13.2f}")


if __name__ == "__main__":
    main()
