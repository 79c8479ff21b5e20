"""What the NVIDIA driver writes to the kernel log (``dmesg``; pure, never raises): XID errors and the vGPU
scheduler's boot message.

Formats (real lines, driver 470-580)::

    [12345.678901] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.
    [ 2101.503320] NVRM: Xid (PCI:0000:b9:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error ...
    NVRM: GPU at 0000:01:00.0 has software scheduler DISABLED with policy BEST_EFFORT.

The XID's PCI id has no function number: it names the GPU's function 0. ``dmesg -T`` style timestamps
(``[Mon May 25 12:34:56 2026]``) are accepted with no uptime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.services.metrics_model import Scheduler, Xid

DMESG_ARGV = ("dmesg",)

_XID = re.compile(r"^(?:\[\s*(?P<ts>[^\]]*)\]\s*)?(?:.*?kernel:\s*)?NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\):\s*"
                  r"(?P<code>\d+)\s*,?\s*(?P<rest>.*)$")
_WHO = re.compile(r"^(?:pid=[^,]*,\s*)?(?:name=[^,]*,\s*)?")   # the process the XID hit, not the error
_SCHED = re.compile(r"NVRM: GPU at (?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+) has software scheduler (?P<state>ENABLED|DISABLED)"
                    r" with policy (?P<policy>[A-Z_]+)")

#: XIDs after which the GPU must not take new vGPUs until it is reset or serviced (NVIDIA "XID Errors"
#: catalogue): the reason placement prints.
UNHEALTHY_XIDS: dict[int, str] = {
    48: "double-bit ECC error (XID 48)",
    63: "ECC page retirement / row remapping pending (XID 63): reset the GPU",
    64: "ECC page retirement / row remapping failed (XID 64)",
    74: "NVLink error (XID 74)",
    79: "GPU has fallen off the bus (XID 79)",
    95: "uncontained ECC error (XID 95): reset the GPU",
    119: "GSP RPC timeout (XID 119)",
    120: "GSP error (XID 120)",
}

_POLICIES = {"BEST_EFFORT": "best-effort", "EQUAL_SHARE": "equal-share", "FIXED_SHARE": "fixed-share"}


@dataclass(frozen=True)
class KernelLog:
    """The NVIDIA lines of one kernel log, by GPU."""

    xids: dict[PciAddress, tuple[Xid, ...]]
    schedulers: dict[PciAddress, Scheduler]
    last_uptime_s: float | None          # the newest timestamp in the log (the collector's cursor)


def _address(pci: str) -> PciAddress | None:
    text = pci.rstrip(":.")
    if text.count(":") == 2 and "." not in text:     # 0000:18:00 -> function 0
        text += ".0"
    try:
        return PciAddress.parse(text)
    except InvalidSpec:
        try:
            return PciAddress.from_nvml(text)
        except InvalidSpec:
            return None


def _uptime(ts: str | None) -> float | None:
    if ts is None:
        return None
    try:
        return float(ts.strip())
    except ValueError:
        return None


def parse_kernel_log(text: str | None) -> KernelLog:
    xids: dict[PciAddress, list[Xid]] = {}
    scheds: dict[PciAddress, Scheduler] = {}
    last: float | None = None
    for line in (text or "").splitlines():
        if line.startswith("["):
            up = _uptime(line[1:line.find("]")] if "]" in line else None)
            if up is not None:
                last = up if last is None else max(last, up)
        if "NVRM" not in line:
            continue
        m = _XID.search(line)
        if m:
            a = _address(m["pci"])
            if a is not None:
                text = _WHO.sub("", m["rest"].strip())
                xids.setdefault(a, []).append(Xid(int(m["code"]), _uptime(m["ts"]), text))
            continue
        s = _SCHED.search(line)
        if s:
            a = _address(s["pci"])
            if a is not None:
                scheds[a] = Scheduler(policy=_POLICIES.get(s["policy"], s["policy"].lower()),
                                      enabled=s["state"] == "ENABLED", source="kernel-log")
    return KernelLog({a: tuple(v) for a, v in xids.items()}, scheds, last)


def since(xids: tuple[Xid, ...], cursor: float | None) -> tuple[Xid, ...]:
    """The XIDs newer than ``cursor`` (an uptime); all of them when there is no cursor or no timestamps."""
    if cursor is None:
        return xids
    return tuple(x for x in xids if x.uptime_s is None or x.uptime_s > cursor)
