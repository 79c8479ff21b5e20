"""Take the secrets out of a capture, consistently: what a user may attach to a public bug report.

* every UUID (GPU-, MIG-, mdev, VM, anywhere: file text, paths, program output) becomes a made-up UUID of the
  same shape; the same UUID gets the same replacement everywhere, so an mdev's directory, the type it was made
  from, nvidia-smi's vGPU list and the VM that uses it still agree;
* serial numbers and per-device identifiers nvidia-smi reports (``<serial>``, ``<board_serial>``, ``<pdi>``,
  ``--query-gpu`` serial columns) become digits of the same length (``[N/A]`` stays);
* the host's name (from ``ssh://user@NAME:port``) becomes ``redacted-host``, wherever it appears;
* the kernel command line keeps only the options vgpuvirt reads (IOMMU, hugepages, VFIO, isolated CPUs);
* the kernel log keeps the NVIDIA driver's lines, and its last line's timestamp (where the next collection
  starts).

Replay stays faithful: a redacted capture answers every verb as the live host did, with the replacements in
place of the originals (tests/unit/test_capture_replay.py checks it on every simulated profile).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.services.nvidia.kernel_log import DMESG_ARGV
from vgpuvirt.services.pci.sysfs import PROC_CMDLINE

__all__ = ["Redacted", "redact"]

_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
#: nvidia-smi -q -x elements that identify one board (serial numbers, the per-device identifier)
_XML_SECRET = re.compile(r"<(?P<tag>\w*(?:serial|pdi|guid)\w*)>(?P<value>[^<]+)</(?P=tag)>")
#: -q (text) and --query-gpu (csv) spellings of the same facts
_TEXT_SECRET = re.compile(r"^\s*(?:Serial Number|Board Serial|GPU PDI|Chassis Serial Number)\s*:\s*(?P<value>\S+)\s*$",
                          re.MULTILINE)
_NOT_A_SECRET = {"N/A", "[N/A]", "Not Supported", "[Not Supported]", "None", "0", "0x0"}
#: kernel command-line options that vgpuvirt reads (IOMMU on/pass-through, hugepages, VFIO ids, isolated CPUs)
_CMDLINE_KEEP = re.compile(r"^(?:intel_iommu|amd_iommu|iommu|iommu\.\w+|hugepages|hugepagesz|default_hugepagesz|"
                           r"vfio[-_.]\S*|isolcpus|nohz_full|rcu_nocbs|pci|pcie_acs_override|nvidia[-_.]\S*)(?:=|$)")
_NVIDIA_LINE = re.compile(r"NVRM|nvidia|Xid", re.IGNORECASE)
_TIMESTAMP = re.compile(r"^\[\s*[^\]]*\]")


@dataclass
class Redacted:
    capture: dict[str, Any]
    #: original -> replacement, every one applied (for a test, or a user checking what changed)
    replaced: dict[str, str] = field(default_factory=dict)


def _host_name(spec: str) -> str | None:
    m = re.match(r"^ssh://(?:[^@/]+@)?(?P<host>\[[^\]]+\]|[^:/]+)", spec)
    return m["host"].strip("[]") if m else None


def _secrets(data: dict[str, Any]) -> dict[str, str]:
    texts = [p.get("stdout", "") for p in data.get("programs", [])]
    texts += [e[1] for e in data["entries"].values() if e[0] == "f" and e[1]]
    serials: dict[str, str] = {}
    for text in texts:
        for m in [*_XML_SECRET.finditer(text), *_TEXT_SECRET.finditer(text)]:
            value = m["value"].strip()
            if value and value not in _NOT_A_SECRET and not _UUID.fullmatch(value) and value not in serials:
                n = len(serials) + 1
                if value.startswith("0x"):
                    serials[value] = "0x" + f"{n:x}".rjust(len(value) - 2, "0")
                elif value.isdigit():
                    serials[value] = str(n).rjust(len(value), "0")
                else:
                    serials[value] = f"REDACTED{n}"
    for p in data.get("programs", []):       # --query-gpu: the columns named serial / uuid
        if any(a.startswith("--query-gpu=") for a in p["argv"]):
            fields = next(a for a in p["argv"] if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
            for line in str(p.get("stdout", "")).splitlines():
                for name, value in zip(fields, (v.strip() for v in line.split(",")), strict=False):
                    if "serial" in name and value not in _NOT_A_SECRET and value not in serials and value.isdigit():
                        serials[value] = str(len(serials) + 1).rjust(len(value), "0")
    host = _host_name(str(data.get("host", "")))
    if host:
        serials[host] = "redacted-host"
    return serials


def _uuid_mapper(replaced: dict[str, str]) -> Callable[[re.Match[str]], str]:
    seen: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        key = m.group().lower()
        new = seen.get(key)
        if new is None:
            n = len(seen) + 1
            new = seen[key] = f"00000000-0000-4000-8000-{n:012x}"
        out = new.upper() if m.group().isupper() else new
        replaced[m.group()] = out
        return out
    return sub


def _cmdline(text: str) -> str:
    return " ".join(t for t in text.split() if _CMDLINE_KEEP.match(t)) + "\n"


def _kernel_log(text: str) -> str:
    lines = text.splitlines()
    kept = [ln for ln in lines if _NVIDIA_LINE.search(ln)]
    last = _TIMESTAMP.match(lines[-1]) if lines else None
    if last and (not kept or kept[-1] != lines[-1]):
        kept.append(f"{last.group()} (other kernel messages redacted)")
    return "".join(ln + "\n" for ln in kept)


def redact(capture: dict[str, Any]) -> Redacted:
    """A redacted copy of ``capture`` (the original is left as it is)."""
    data = copy.deepcopy(capture)
    literal = _secrets(data)
    replaced: dict[str, str] = {}
    pattern = re.compile("|".join(rf"(?<![\w.-]){re.escape(s)}(?![\w-])" for s in sorted(literal, key=len,
                                                                                               reverse=True)))
    uuids = _uuid_mapper(replaced)

    def clean(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        if literal:
            text = pattern.sub(lambda m: replaced.setdefault(m.group(), literal[m.group()]), text)
        return _UUID.sub(uuids, text)

    cmdline = data["entries"].get(PROC_CMDLINE)
    if cmdline and cmdline[0] == "f" and cmdline[1] is not None:
        replaced[cmdline[1].strip()] = _cmdline(cmdline[1]).strip()
        cmdline[1] = _cmdline(cmdline[1])
    for p in data.get("programs", []):
        if tuple(p["argv"]) == DMESG_ARGV:
            p["stdout"] = _kernel_log(str(p.get("stdout", "")))
        for key in ("stdout", "stderr", "error"):
            p[key] = clean(p.get(key))
    for call in data.get("nvml", []):
        for key in ("stdout", "error"):
            call["result"][key] = clean(call["result"].get(key))
    data["entries"] = {clean(path): [e[0], clean(e[1]), e[2]] for path, e in data["entries"].items()}
    data["host"] = clean(data.get("host"))
    data["redacted"] = True
    return Redacted(data, replaced)
