"""The simulated driver's vGPU scheduler: NVML's scheduler calls, the RmPVMRL registry key, a driver reload.

Written from the driver's side, independently of the client's encoder (``services/scheduler/model``), so
that a test of the client meets a referee and not its own reflection:

* ``nvml_supported`` False plays a driver without the NVML scheduler calls (FUNCTION_NOT_FOUND);
* ``/etc/modprobe.d/*.conf`` is a small writable directory (files replaced whole, as the agent does);
* :meth:`SimScheduler.reload_driver` is the next load of the nvidia module: it takes the registry options
  from modprobe.d into ``/proc/driver/nvidia/params`` (as the real driver does: its parameters are registered
  with permission 0, so ``/sys/module/nvidia/parameters`` shows none of them) and the GPUs' scheduler state
  from RmPVMRL;
* an NVML set changes the state now and is forgotten at the next reload (as NVML documents).
"""

from __future__ import annotations

import errno
import json
import re
from typing import TYPE_CHECKING, Any, Protocol

from vgpuvirt.model import PciAddress

if TYPE_CHECKING:
    import threading

    from vgpuvirt.sim.devices import Dev

NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, FUNCTION_NOT_FOUND = 3, 2, 6, 13
# what the simulated GPUs report (nvmlVgpuSchedulerCapabilities_t): 1..30 ms, ARR supported
MIN_TS_NS, MAX_TS_NS = 1_000_000, 30_000_000
PARAMS = ("NVreg_RegistryDwords", "NVreg_RegistryDwordsPerDevice")
# /proc/driver/nvidia/params as a real R580 driver prints it (tests/fixtures/real/h100-580/raw/
# proc-driver-nvidia.txt): every parameter, "Name: value", strings in double quotes; the two registry ones
# are filled from what was loaded. A non-empty string value in quotes is INFERRED (only "" has been seen).
_PROC_PARAMS_HEAD = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 1
RmProfilingAdminOnly: 0
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
CoherentGPUMemoryMode: ""
"""
_PROC_PARAMS_TAIL = """RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
"""


def _decode(value: int) -> dict[str, int]:
    """RmPVMRL as the driver reads it: bit 0 on, bit 1 ARR off, bits 7:4 fixed share, bits 23:16 ms."""
    if not value & 1:
        return {"policy": 1, "arr": 0, "timeslice_ns": 0}
    ms = (value >> 16) & 0xFF
    return {"policy": 3 if (value >> 4) & 0xF == 1 else 2, "arr": 1 if value & 2 else 0,
            "timeslice_ns": min(ms, 30) * 1_000_000}


class SchedulerHost(Protocol):
    """What the scheduler reads of its host's model (:class:`~vgpuvirt.sim.model.SimModel`, which owns it)."""

    lock: threading.RLock
    devices: dict[str, Dev]

    def bump(self) -> None: ...


class SimScheduler:
    def __init__(self, model: SchedulerHost) -> None:
        self.model = model
        self.nvml_supported = True
        self.modprobe: dict[str, str] = {}                  # file name in /etc/modprobe.d -> content
        self.loaded: dict[str, str] = dict.fromkeys(PARAMS, "")
        self.state: dict[str, dict[str, int]] = {}          # GPU address -> NVML's view

    # ------------------------------------------------------------------ the driver
    def gpus(self) -> list[str]:
        return sorted(a for a, d in self.model.devices.items()
                      if d.gpu is not None and d.gpu.vgpu_host and d.spec.vendor == 0x10DE and d.physfn is None)

    def get(self, addr: str) -> dict[str, int]:
        return dict(self.state.get(addr) or self._registry(addr))

    def _registry(self, addr: str) -> dict[str, int]:
        found: int | None = None
        for item in self.loaded["NVreg_RegistryDwords"].split(";"):
            key, _, val = item.partition("=")
            if key.strip() == "RmPVMRL":
                found = int(val.strip(), 0)
        current: str | None = None
        for item in self.loaded["NVreg_RegistryDwordsPerDevice"].split(";"):
            key, _, val = item.partition("=")
            if key.strip() == "pci":
                current = str(PciAddress.parse(val.strip()))
            elif key.strip() == "RmPVMRL" and current == addr:
                found = int(val.strip(), 0)
        return _decode(found or 0)

    def proc_params(self) -> str:
        """``/proc/driver/nvidia/params``: the loaded module's parameters."""
        return (_PROC_PARAMS_HEAD + f'RegistryDwords: "{self.loaded["NVreg_RegistryDwords"]}"\n'
                f'RegistryDwordsPerDevice: "{self.loaded["NVreg_RegistryDwordsPerDevice"]}"\n' + _PROC_PARAMS_TAIL)

    def loaded_policy(self, addr: str) -> str:
        """The policy name the driver's boot message gives (from the registry as loaded)."""
        return {1: "BEST_EFFORT", 2: "EQUAL_SHARE", 3: "FIXED_SHARE"}[self._registry(addr)["policy"]]

    def reload_driver(self) -> None:
        """The nvidia module unloaded and loaded again: modprobe.d's options apply, NVML's changes are gone."""
        with self.model.lock:
            loaded = dict.fromkeys(PARAMS, "")
            for name in sorted(self.modprobe):
                for line in self.modprobe[name].splitlines():
                    m = re.match(r"\s*options\s+nvidia\s+(\w+)=\"?([^\"]*)\"?\s*$", line.split("#", 1)[0])
                    if m and m[1] in loaded:
                        loaded[m[1]] = m[2]
            self.loaded = loaded
            self.state.clear()
            self.model.bump()

    # ------------------------------------------------------------------ NVML (the agent's "nvml" op)
    def nvml(self, op: dict[str, Any]) -> dict[str, Any]:
        call, args = op.get("value"), [str(a) for a in op.get("argv") or []]
        if not self.nvml_supported:
            return {"ok": False, "errno": None, "rc": FUNCTION_NOT_FOUND,
                    "error": "NVML has no nvmlDeviceGetVgpuSchedulerState (driver too old)"}
        if call == "vgpu_scheduler_get" and args[:1] == ["all"]:
            # every GPU the nvidia driver has (NVML's device list), each answered as a call of its own: the same
            # devices a per-GPU call finds (a board without vGPU is listed, with its own NOT_SUPPORTED)
            seen = sorted(a for a, d in self.model.devices.items() if d.driver == "nvidia" and d.physfn is None)
            out_all = []
            for a in seen:
                bus = PciAddress.parse(a).nvml_bus_id
                one = self.nvml({"value": call, "argv": [bus]})
                out_all.append({"gpu": bus, "ok": one["ok"], "rc": one["rc"], "error": one.get("error"),
                                "state": json.loads(one["stdout"]) if one["ok"] else None})
            return {"ok": True, "rc": 0, "stdout": json.dumps(out_all)}
        addr = _address(args[0]) if args else None
        dev = self.model.devices.get(addr or "")
        if dev is None or dev.driver != "nvidia" or dev.physfn is not None:
            return {"ok": False, "errno": None, "rc": NOT_FOUND,
                    # the agent's words: "<what>: <nvmlErrorString>", the bus ID for the handle lookup
                    "error": f"{args[0] if args else 'GetHandleByPciBusId'}: Not Found"}
        if addr not in self.gpus():     # an NVML device without vGPU (a consumer or passthrough board)
            # as the real H100 on driver 580 answered through the agent
            return {"ok": False, "errno": None, "rc": NOT_SUPPORTED, "error": "GetVgpuSchedulerState: Not Supported"}
        with self.model.lock:
            if call == "vgpu_scheduler_get":
                out: dict[str, Any] = self.get(addr)
                out["capabilities"] = {"policies": [1, 2, 3], "min_timeslice_ns": MIN_TS_NS,
                                       "max_timeslice_ns": MAX_TS_NS, "adaptive": True}
                out["log_entries"] = 0
                return {"ok": True, "rc": 0, "stdout": json.dumps(out)}
            if call == "vgpu_scheduler_set":
                try:
                    policy, arr, ts = (int(a) for a in args[1:4])
                except ValueError:
                    return {"ok": False, "errno": errno.EINVAL, "rc": INVALID_ARGUMENT, "error": "Invalid Argument"}
                if policy not in (1, 2, 3) or arr not in (0, 1, 2) or (ts and not MIN_TS_NS <= ts <= MAX_TS_NS):
                    return {"ok": False, "errno": errno.EINVAL, "rc": INVALID_ARGUMENT, "error": "Invalid Argument"}
                self.state[addr] = {"policy": policy, "arr": 0 if policy == 1 else arr,
                                    "timeslice_ns": 0 if policy == 1 or arr == 2 else ts}
                self.model.bump()
                return {"ok": True, "rc": 0, "stdout": "{}"}
        return {"ok": False, "errno": errno.EINVAL, "rc": INVALID_ARGUMENT, "error": f"unknown NVML call {call!r}"}


def _address(bus_id: str) -> str | None:
    try:
        return str(PciAddress.from_nvml(bus_id))
    except ValueError:
        try:
            return str(PciAddress.parse(bus_id))
        except ValueError:
            return None
