"""The time-sliced vGPU scheduler as values (pure: no I/O).

Two places hold a GPU's scheduler setting, and they encode it differently:

* NVML (``nvmlDeviceGet/SetVgpuSchedulerState``): a policy number (1 best effort, 2 equal share, 3 fixed
  share), the adaptive-round-robin mode (0 driver default, 1 off, 2 on) and a timeslice in ns. A change
  takes effect at once and is lost at the next load of the nvidia module.
* The driver's registry key ``RmPVMRL`` (``options nvidia NVreg_RegistryDwords[PerDevice]=...`` in
  ``/etc/modprobe.d``), read when the module loads. Its bits, as NVIDIA's open kernel modules define them
  (``nvrm_registry.h``): bit 0 per-VM runlists on (off = best effort), bit 1 adaptive round robin OFF
  (clear = the driver's default, on), bits 7:4 the policy (0 equal share, 1 fixed share), bits 23:16 the
  timeslice in ms (0 = default). The vGPU user guide's values: ``0x00`` best effort, ``0x01`` equal share,
  ``0x11`` fixed share, ``0x00TT0001`` / ``0x00TT0011`` with a timeslice of TT ms (0x01..0x1E).

:class:`SchedulerSetting` is what a user asks for; it converts to and from both encodings.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress

POLICIES = ("best-effort", "equal-share", "fixed-share")
NVML_POLICY = {"best-effort": 1, "equal-share": 2, "fixed-share": 3}
NVML_POLICY_NAME = {v: k for k, v in NVML_POLICY.items()}
NVML_ARR = {None: 0, False: 1, True: 2}          # NVML_VGPU_SCHEDULER_ARR_DEFAULT / _DISABLE / _ENABLE
NVML_ARR_NAME = {v: k for k, v in NVML_ARR.items()}
#: the registry key's timeslice field is whole milliseconds, 1..30 (the user guide's 0x01..0x1E)
REGISTRY_TIMESLICE_MS = (1, 30)
#: the file vgpuvirt owns in /etc/modprobe.d (it never edits anyone else's)
MODPROBE_FILE = "/etc/modprobe.d/vgpuvirt-scheduler.conf"
#: The nvidia module's parameters AS LOADED, one ``Name: value`` line each (``RegistryDwords: ""``). The
#: driver registers its parameters with permission 0, so ``/sys/module/nvidia/parameters/`` has no
#: NVreg_RegistryDwords* file to read (a real H100 on R580, tests/fixtures/real/h100-580/raw/
#: proc-driver-nvidia.txt); this file is where the loaded values are.
PROC_PARAMS = "/proc/driver/nvidia/params"


@dataclass(frozen=True, kw_only=True)
class SchedulerSetting:
    """A scheduler policy for one GPU. ``timeslice_us``/``adaptive`` None: the driver's default."""

    policy: str
    timeslice_us: int | None = None
    adaptive: bool | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidSpec("scheduler policy", self.policy, " or ".join(POLICIES))
        ts = self.timeslice_us
        if ts is not None and (not isinstance(ts, int) or isinstance(ts, bool) or ts <= 0 or ts > 10_000_000):
            raise InvalidSpec("timeslice (us)", ts, "a positive number of microseconds (at most 10 s)")
        if self.adaptive is not None and not isinstance(self.adaptive, bool):
            raise InvalidSpec("adaptive", self.adaptive, "true or false")
        if self.policy == "best-effort" and (ts is not None or self.adaptive is not None):
            raise InvalidSpec("scheduler setting", self.describe(),
                              "no timeslice or adaptive mode with best-effort (it has no time slices)")
        if ts is not None and self.adaptive:
            raise InvalidSpec("scheduler setting", self.describe(),
                              "either a timeslice or adaptive mode (the adaptive scheduler sizes its own slices)")

    def describe(self) -> str:
        bits = [self.policy]
        if self.timeslice_us is not None:
            bits.append(f"timeslice {self.timeslice_us} us")
        if self.adaptive is not None:
            bits.append("adaptive" if self.adaptive else "not adaptive")
        return ", ".join(bits)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "timeslice_us": self.timeslice_us, "adaptive": self.adaptive}

    # ---------------------------------------------------------------- the registry key
    def to_rmpvmrl(self) -> int:
        """The RmPVMRL value; a timeslice must be whole milliseconds in 1..30 here."""
        if self.policy == "best-effort":
            return 0x00
        value = 0x01 | (0x10 if self.policy == "fixed-share" else 0)
        if self.adaptive is False:
            value |= 0x02         # the user guide's own values (0x01, 0x00TT0011) leave ARR at its default
        if self.timeslice_us is not None:
            ms, rest = divmod(self.timeslice_us, 1000)
            lo, hi = REGISTRY_TIMESLICE_MS
            if rest or not lo <= ms <= hi:
                raise InvalidSpec("timeslice (us)", self.timeslice_us,
                                  f"whole milliseconds from {lo * 1000} to {hi * 1000} us for the driver's "
                                  "registry key (the NVML path takes other values where the GPU allows them)")
            value |= ms << 16
        return value

    @classmethod
    def from_rmpvmrl(cls, value: int) -> SchedulerSetting:
        if not value & 0x01:
            return cls(policy="best-effort")
        kind = (value >> 4) & 0xF
        if kind not in (0, 1):
            raise InvalidSpec("RmPVMRL value", hex(value), "policy bits 7:4 of 0 (equal share) or 1 (fixed share)")
        ms = (value >> 16) & 0xFF
        adaptive = False if value & 0x02 else None
        return cls(policy="fixed-share" if kind else "equal-share", timeslice_us=ms * 1000 if ms else None,
                   adaptive=None if ms else adaptive)

    # ---------------------------------------------------------------- NVML
    def to_nvml(self) -> dict[str, int]:
        """The fields of ``nvmlVgpuSchedulerSetState_t``: policy, enableARRMode, timeslice (ns, 0 = default)."""
        arr = False if self.timeslice_us is not None else self.adaptive
        return {"policy": NVML_POLICY[self.policy], "arr": NVML_ARR[arr],
                "timeslice_ns": (self.timeslice_us or 0) * 1000}

    @classmethod
    def from_nvml(cls, state: Mapping[str, Any]) -> SchedulerSetting:
        policy = NVML_POLICY_NAME.get(int(state.get("policy", 0)))
        if policy is None:
            raise InvalidSpec("NVML scheduler policy", state.get("policy"), "1, 2 or 3")
        if policy == "best-effort":
            return cls(policy=policy)
        adaptive = NVML_ARR_NAME.get(int(state.get("arr", 0)))
        ts = int(state.get("timeslice_ns") or 0) // 1000
        if ts and not adaptive:     # a set timeslice implies ARR off: the same setting as the registry's TT
            return cls(policy=policy, timeslice_us=ts)
        return cls(policy=policy, adaptive=adaptive)


def parse_setting(policy: str, timeslice_us: int | None = None, adaptive: bool | None = None) -> SchedulerSetting:
    """The small entry point other parts (a layout file) call: validated, or :class:`InvalidSpec`."""
    return SchedulerSetting(policy=policy, timeslice_us=timeslice_us, adaptive=adaptive)


# -------------------------------------------------------------------- modprobe.d
_OPTIONS = re.compile(r"^\s*options\s+nvidia\s+(.*)$")


def _dwords(text: str) -> list[tuple[str, str]]:
    """``RmPVMRL=0x11;Other=1`` or the per-device form ``pci=...;RmPVMRL=...`` as (key, value) pairs."""
    out = []
    for item in text.split(";"):
        key, sep, val = item.partition("=")
        if sep:
            out.append((key.strip(), val.strip()))
    return out


def loaded_params(text: str | None) -> dict[str, str] | None:
    """``/proc/driver/nvidia/params`` -> name -> value (quotes around strings removed); None when unread."""
    if text is None:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            v = value.strip()
            out[name.strip()] = v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v
    return out


def registry_values(global_dwords: str | None, per_device: str | None) -> dict[str, int]:
    """RmPVMRL per GPU from the two module parameters: ``{"*": v}`` for all GPUs, ``{"0000:3b:00.0": v}``."""
    out: dict[str, int] = {}
    for key, val in _dwords(global_dwords or ""):
        if key == "RmPVMRL":
            out["*"] = _int(val)
    current: str | None = None
    for key, val in _dwords(per_device or ""):
        if key == "pci":
            current = str(PciAddress.parse(val)) if _is_bdf(val) else None
        elif key == "RmPVMRL" and current is not None:
            out[current] = _int(val)
    return out


def _is_bdf(text: str) -> bool:
    try:
        PciAddress.parse(text)
    except InvalidSpec:
        return False
    return True


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise InvalidSpec("RmPVMRL value", text, "a number such as 0x11") from None


def modprobe_options(files: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per file, the nvidia module's registry options it sets: ``{path: {"NVreg_RegistryDwords": "..."}}``."""
    out: dict[str, dict[str, str]] = {}
    for path, text in sorted(files.items()):
        for line in text.splitlines():
            m = _OPTIONS.match(line.split("#", 1)[0])
            if not m:
                continue
            try:
                words = shlex.split(m[1])
            except ValueError:
                continue
            for w in words:
                name, sep, val = w.partition("=")
                if sep and name in ("NVreg_RegistryDwords", "NVreg_RegistryDwordsPerDevice"):
                    out.setdefault(path, {})[name] = val
    return out


def effective(values: Mapping[str, int], gpu: str) -> SchedulerSetting:
    """The setting a GPU gets from RmPVMRL values (a per-device value wins over the global one)."""
    v = values.get(gpu, values.get("*", 0))
    return SchedulerSetting.from_rmpvmrl(v)


def render_modprobe(values: Mapping[str, int]) -> str:
    """vgpuvirt's own modprobe.d file: one per-device RmPVMRL per GPU, read at the next load of nvidia."""
    items = ";".join(f"pci={gpu};RmPVMRL={v:#04x}" for gpu, v in sorted(values.items()))
    return ("# Written by vgpuvirt (vgpuvirt scheduler set): the time-sliced vGPU scheduler per GPU.\n"
            "# The nvidia module reads it when it loads; edit with vgpuvirt, not by hand.\n"
            f'options nvidia NVreg_RegistryDwordsPerDevice="{items}"\n') if values else ""
