"""Stand-ins for a GPU host's driver tools on a machine without a GPU: shell stubs that print what the
simulator's ``nvidia-smi`` and ``dmesg`` answered for a :class:`~vgpuvirt.sim.SimHost`, frozen at the moment
they are written. With a materialized tree of the same host, a real sshd then serves a whole metrics
collection (``Collector(programs=stubs)``) with real formats, as benchmarks/bench_metrics.py and the SSH
integration test do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_ANSWERS = {"nvidia-smi -q -x": "smi.xml", "nvidia-smi vgpu -q": "vgpu.txt", "nvidia-smi mig -lgi": "lgi.txt",
            "dmesg": "dmesg.txt"}


def write_tool_stubs(sim: Any, dest: str) -> dict[str, str]:
    """Save ``sim``'s tool answers under ``dest`` and write ``stub-nvidia-smi`` / ``stub-dmesg`` there;
    returns {program: stub path} for ``Collector(programs=...)``."""
    data = os.path.join(dest, "tool-answers")
    os.makedirs(data, exist_ok=True)
    for cmd, fname in _ANSWERS.items():
        Path(data, fname).write_text(sim.run(cmd.split()).stdout)
    scripts = {
        "nvidia-smi": (f'case "$1 $2" in\n  "-q -x") exec cat {data}/smi.xml ;;\n'
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
