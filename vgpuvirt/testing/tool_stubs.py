"""Stand-ins for a GPU host's driver tools on a machine without a GPU: shell stubs that print what the
simulator's ``nvidia-smi`` and ``dmesg`` answered for a :class:`~vgpuvirt.sim.SimHost`, frozen at the moment
they are written. With a materialized tree of the same host, a real sshd then serves a whole metrics
collection (``Collector(programs=stubs)``) with real formats, as benchmarks/bench_metrics.py and the SSH
integration test do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

_ANSWERS = {"nvidia-smi -q -x": "smi.xml", "nvidia-smi vgpu -q": "vgpu.txt", "nvidia-smi mig -lgi": "lgi.txt",
            "dmesg": "dmesg.txt"}


def write_tool_stubs(sim: Any, dest: str, *, costs: dict[str, float] | None = None) -> dict[str, str]:
    """Save ``sim``'s tool answers under ``dest`` and write ``stub-nvidia-smi`` / ``stub-dmesg`` there;
    returns {program: stub path} for ``Collector(programs=...)``. ``costs``: seconds a stub sleeps before
    answering ``-q -x`` / ``--query-gpu`` (a real H100 on driver 580 takes 0.108 / 0.025)."""
    from vgpuvirt.services.nvidia.query_gpu import QUERY_GPU_ARGV

    data = os.path.join(dest, "tool-answers")
    os.makedirs(data, exist_ok=True)
    for cmd, fname in _ANSWERS.items():
        Path(data, fname).write_text(sim.run(cmd.split()).stdout)
    Path(data, "query.csv").write_text(sim.run(list(QUERY_GPU_ARGV)).stdout)
    cost = {k: f"sleep {float(v):.3f}; " if v else "" for k, v in (costs or {}).items()}
    scripts = {
        "nvidia-smi": (f'case "$1 $2" in\n  "-q -x") {cost.get("-q -x", "")}exec cat {data}/smi.xml ;;\n'
                       f'  "--query-gpu="*) {cost.get("--query-gpu", "")}exec cat {data}/query.csv ;;\n'
                       f'  "vgpu -q") exec cat {data}/vgpu.txt ;;\n'
                       f'  "mig -lgi") cat {data}/lgi.txt; [ -s {data}/lgi.txt ] || exit 6 ;;\n'
                       '  *) exit 2 ;;\nesac\n'),
        "dmesg": f"exec cat {data}/dmesg.txt\n",
    }
    stubs = {}
    for prog, script in scripts.items():
        path = os.path.join(dest, f"stub-{prog}")
        Path(path).write_text("#!/bin/sh\n" + script)
        os.chmod(path, 0o700)   # run by the same user (root) through sshd
        stubs[prog] = path
    return stubs


_PROGRAM_STUB = '''#!/usr/bin/env python3
import json, sys
answers = json.load(open(%r))
rc, out, err = answers.get(" ".join(sys.argv[1:]), [2, "", "stub: not recorded: %%s\\n" %% " ".join(sys.argv[1:])])
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(rc)
'''


def write_program_stubs(sim: Any, dest: str, argvs: Any) -> dict[str, str]:
    """Like :func:`write_tool_stubs`, for any list of argvs: each program's stub (a small python3 script)
    answers every argv of the list with the simulator's exit status, stdout and stderr, frozen now; returns
    {program: stub path} (``capture(programs=...)``, ``Collector(programs=...)``)."""
    by_program: dict[str, dict[str, list[Any]]] = {}
    for argv in argvs:
        r = sim.run(list(argv))
        by_program.setdefault(argv[0], {})[" ".join(argv[1:])] = [r.exit_code, r.stdout, r.stderr]
    stubs = {}
    for prog, answers in by_program.items():
        data = os.path.join(dest, f"answers-{prog}.json")
        Path(data).write_text(json.dumps(answers))
        path = os.path.join(dest, f"stub-{prog}")
        Path(path).write_text(_PROGRAM_STUB % data)
        os.chmod(path, 0o700)
        stubs[prog] = path
    return stubs
