"""What a simulated GPU host measures: utilisation that moves over time, and faults that can be injected.

Utilisation is a deterministic function of (time, seed, what is measured): a slow wave per vGPU, so two
collections a second apart differ a little and a test that pins ``clock`` gets the same numbers every run.
Faults (per physical GPU, by PCI address):

* an XID (``inject_xid``): a kernel log line ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off
  the bus.``; XID 48 also counts a double-bit (uncorrectable) ECC error, 63 / 64 set a pending / failed
  row remap (retired page on pre-Ampere boards), as the driver does;
* uncorrectable / correctable ECC errors (``inject_ecc``), pending page retirement or row remapping
  (``inject_pending_repair``);
* a PCIe link that trained at a lower generation / width (``degrade_link``).

The emulated tools (:mod:`vgpuvirt.sim.tools`: ``nvidia-smi -q -x``, ``nvidia-smi vgpu -q``, ``dmesg``) render
this state in the real formats. Faults may also live in a JSON file (``VGPUVIRT_SIM_FAULTS``, written by
``vgpuvirt sim fault``) so that separate ``--host sim:PROFILE`` commands see the same faults.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

#: The simulated hosts all "booted" at this Unix time: kernel-log timestamps (seconds since boot) are then
#: the same in every process that simulates the host.
BOOT_TIME = 1_700_000_000.0
FAULTS_ENV = "VGPUVIRT_SIM_FAULTS"

XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000",
    43: "Ch 00000008, engmask 00000101",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
        "subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}


@dataclass
class GpuFaults:
    xids: list[tuple[int, float, str]] = field(default_factory=list)   # (code, Unix time, text)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    repair_pending: bool = False        # retired pages (pre-Ampere) / row remap (Ampere+) waiting for a reset
    repair_failed: bool = False
    link_gen: int | None = None         # trained generation / width, when below the maximum
    link_width: int | None = None

    @staticmethod
    def from_dict(d: dict[str, Any]) -> GpuFaults:
        f = GpuFaults(**{k: v for k, v in d.items() if k != "xids"})
        f.xids = [(int(c), float(t), str(m)) for c, t, m in d.get("xids", [])]
        return f


def _unit(*key: object) -> float:
    """A stable number in [0, 1) from a key."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class SimTelemetry:
    def __init__(self, *, seed: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.seed = seed
        self.clock = clock
        self.faults: dict[str, GpuFaults] = {}
        self.vms: dict[str, tuple[str, str]] = {}   # mdev UUID / VF address -> (VM name, VM UUID) QEMU was given
        self.profile = ""

    # -- time-varying readings -------------------------------------------------------------------
    def wave(self, *key: object, low: float = 0.0, high: float = 100.0, period_s: float = 60.0) -> float:
        """A reading that drifts between ``low`` and ``high`` over ``period_s``, phase-shifted per key."""
        phase = _unit(self.seed, *key) * 2 * math.pi
        x = (math.sin(2 * math.pi * self.clock() / period_s + phase) + 1) / 2
        return low + (high - low) * x

    # -- faults ----------------------------------------------------------------------------------
    def gpu_faults(self, gpu: str) -> GpuFaults:
        """This GPU's faults: those injected here plus those in the ``VGPUVIRT_SIM_FAULTS`` file."""
        mine = self.faults.get(gpu, GpuFaults())
        other = _file_faults(self.profile).get(gpu)
        if other is None:
            return mine
        return GpuFaults(xids=sorted(mine.xids + other.xids, key=lambda x: x[1]),
                         ecc_corrected=mine.ecc_corrected + other.ecc_corrected,
                         ecc_uncorrected=mine.ecc_uncorrected + other.ecc_uncorrected,
                         repair_pending=mine.repair_pending or other.repair_pending,
                         repair_failed=mine.repair_failed or other.repair_failed,
                         link_gen=mine.link_gen or other.link_gen, link_width=mine.link_width or other.link_width)

    def inject(self, gpu: str, kind: str, value: int | None = None) -> None:
        """One fault by name (the ``vgpuvirt sim fault`` verb's words): ``xid CODE``, ``ecc [N]``,
        ``ecc-corrected [N]``, ``pending-repair``, ``repair-failed``, ``link-width W``, ``link-gen G``."""
        apply_fault(self.faults.setdefault(gpu, GpuFaults()), kind, value, self.clock())

    def inject_xid(self, gpu: str, code: int) -> None:
        self.inject(gpu, "xid", code)

    def inject_ecc(self, gpu: str, uncorrected: int = 1) -> None:
        self.inject(gpu, "ecc", uncorrected)

    def inject_pending_repair(self, gpu: str) -> None:
        self.inject(gpu, "pending-repair")

    def degrade_link(self, gpu: str, *, width: int | None = None, gen: int | None = None) -> None:
        if width is not None:
            self.inject(gpu, "link-width", width)
        if gen is not None:
            self.inject(gpu, "link-gen", gen)

    def clear(self, gpu: str | None = None) -> None:
        if gpu is None:
            self.faults.clear()
        else:
            self.faults.pop(gpu, None)


FAULT_KINDS = ("xid", "ecc", "ecc-corrected", "pending-repair", "repair-failed", "link-width", "link-gen")


def apply_fault(f: GpuFaults, kind: str, value: int | None, now: float) -> None:
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {kind!r} (one of {', '.join(FAULT_KINDS)})")
    if kind in ("xid", "link-width", "link-gen") and value is None:
        raise ValueError(f"fault {kind} needs a value")
    if kind == "xid":
        assert value is not None
        f.xids.append((value, now, XID_TEXT.get(value, "Unspecified error")))
        if value == 48:
            f.ecc_uncorrected += 1
        elif value == 63:
            f.repair_pending = True
        elif value == 64:
            f.repair_failed = True
    elif kind == "ecc":
        f.ecc_uncorrected += value or 1
    elif kind == "ecc-corrected":
        f.ecc_corrected += value or 1
    elif kind == "pending-repair":
        f.repair_pending = True
    elif kind == "repair-failed":
        f.repair_failed = True
    elif kind == "link-width":
        f.link_width = value
    else:
        f.link_gen = value


def _file_faults(profile: str) -> dict[str, GpuFaults]:
    path = os.environ.get(FAULTS_ENV)
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return {gpu: GpuFaults.from_dict(d) for gpu, d in data.get(profile, {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def save_fault(path: str, profile: str, gpu: str, kind: str | None, value: int | None) -> dict[str, Any]:
    """Add one fault to the file (``kind`` None: clear the GPU's faults; ``gpu`` "ALL": every GPU's). Returns
    the profile's faults as written."""
    data: dict[str, Any] = {}
    if os.path.lexists(path):
        from vgpuvirt import files
        from vgpuvirt.errors import InvalidSpec
        try:
            data = json.loads(files.read_text(path, "faults file"))
        except (ValueError, RecursionError) as exc:
            if isinstance(exc, InvalidSpec):
                raise
            raise InvalidSpec("faults file", path, "a JSON object written by `vgpuvirt sim fault`") from None
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise InvalidSpec("faults file", path, "a JSON object written by `vgpuvirt sim fault`")
    faults = data.setdefault(profile, {})
    if kind is None:
        if gpu == "ALL":
            faults.clear()
        else:
            faults.pop(gpu, None)
    else:
        f = GpuFaults.from_dict(faults.get(gpu, {}))
        apply_fault(f, kind, value, time.time())
        faults[gpu] = asdict(f)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)
    return dict(faults)
