#!/usr/bin/env python3
"""Turn a read-only transcript of a real host (``../shared/hostdata/real-*``: ``vgpuvirt/snapshot.json``, the
agent's answer to one inventory request, and ``raw/``, the tools' own output) into a vgpuvirt capture file.

    python3 scripts/hostdata_to_capture.py ../shared/hostdata/real-h100-580 tests/fixtures/real/h100-580/capture.json

Every answer comes from the transcript: the snapshot's entries and programs as the agent gave them; the
programs the snapshot does not hold (``vgpu -q``, ``mig -lci``, ``mig -lgipp``) from ``raw/`` with exit status 0
(the transcript's README says so for each); the NVIDIA procfs files from ``raw/proc-driver-nvidia.txt``; the
NVML scheduler read from ``vgpuvirt/scheduler-show.json`` (the agent's NVML error there, per GPU).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

KINDS = {"file": "f", "link": "l", "dir": "d", "error": "e"}
#: programs the snapshot lacks: argv -> raw file
RAW_PROGRAMS = {("nvidia-smi", "vgpu", "-q"): "vgpu-q.txt", ("nvidia-smi", "mig", "-lci"): "mig-lci.txt",
                ("nvidia-smi", "mig", "-lgipp"): "mig-lgipp.txt"}


def _argv(op_repr: str) -> list[str]:
    m = re.search(r"argv=(\([^)]*\))", op_repr)
    if not m:
        raise SystemExit(f"no argv in {op_repr[:80]!r}")
    return list(ast.literal_eval(m.group(1)))


def _proc_files(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for block in text.split("### ")[1:]:
        path, _, body = block.partition("\n")
        out[path.strip()] = body
    return out


def _empty_dirs(listing: str) -> list[str]:
    """The folders ``ls -la`` shows with nothing but ``.`` and ``..`` (/sys/kernel/iommu_groups on a guest)."""
    found = []
    lines = listing.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("/") and line.endswith(":") and lines[i + 1].startswith("total ")):
            continue
        names = []
        for entry in lines[i + 2:]:
            if not re.match(r"[-dlcbps][-rwxsStT]{9}", entry):     # the listing of this folder ends
                break
            names.append(entry.rsplit(" ", 1)[-1])
        if names == [".", ".."]:
            found.append(line[:-1])
    return found


def convert(src: Path) -> dict[str, object]:
    snap = json.loads((src / "vgpuvirt" / "snapshot.json").read_text())
    entries = {p: [KINDS[k], target if k == "link" else text, code] for p, (k, text, target, code)
               in snap["entries"].items()}
    for path, body in _proc_files((src / "raw" / "proc-driver-nvidia.txt").read_text()).items():
        entries[path] = ["f", body, None]
    for path in _empty_dirs((src / "raw" / "sys-ls.txt").read_text()):
        # the snapshot predates reading these folders themselves; the listing shows them present and empty
        entries.setdefault(path, ["d", None, None])
    programs = [{"argv": _argv(r["op"]), "rc": r["rc"], "stdout": r["stdout"], "stderr": r["stderr"],
                 "errno": r["errno"], **({"error": r["error"]} if r["errno"] is not None else {})}
                for r in snap["programs"]]
    for argv, name in RAW_PROGRAMS.items():
        programs.append({"argv": list(argv), "rc": 0, "stdout": (src / "raw" / name).read_text(), "stderr": "",
                         "errno": None})
    sched = json.loads((src / "vgpuvirt" / "scheduler-show.json").read_text())
    per_gpu = []
    for g in sched:
        bus = "0000" + g["gpu"].upper()     # NVML's 8-digit domain: 0000:00:06.0 -> 00000000:00:06.0
        per_gpu.append({"gpu": bus, "ok": g["nvml"], "rc": 0 if g["nvml"] else (3 if not g["vgpu_capable"] else None),
                        "state": None, "error": g["nvml_error"]})
    smi = next(p["stdout"] for p in programs if p["argv"] == ["nvidia-smi", "-q", "-x"])
    version = re.search(r"<driver_version>([^<]+)<", smi)
    return {"format": "vgpuvirt-capture", "version": 1, "host": "local", "sysfs_root": "/",
            "captured_at": "2026-11-26T10:55:13Z", "vgpuvirt_version": "0.1.0 (97383fc)",
            "driver_version": version.group(1) if version else None, "redacted": False,
            "source": f"converted from {src.name} by scripts/hostdata_to_capture.py",
            "globs": [], "programs": programs,
            "nvml": [{"call": "vgpu_scheduler_get", "args": ["all"],
                      "result": {"ok": True, "rc": 0, "stdout": json.dumps(per_gpu), "errno": None, "error": None}}],
            "entries": entries}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    data = convert(Path(sys.argv[1]))
    Path(sys.argv[2]).parent.mkdir(parents=True, exist_ok=True)
    Path(sys.argv[2]).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
