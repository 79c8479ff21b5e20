"""NVML's vGPU migration calls on a simulated host, as the agent's ``nvml`` op asks them (see
``vgpuvirt.host.agent._nvml_migration`` for the real calls):

* ``vgpu_migration_metadata MDEV_UUID``: the vGPU's metadata (``nvmlVgpuInstanceGetMetadata``): its
  ``vgpuVirtualizationCaps`` (bit 0: migration supported), the host driver, and the metadata itself as hex;
* ``vgpu_migration_compat BUS_ID HEX``: this GPU's answer for that vGPU (``nvmlDeviceGetVgpuMetadata`` then
  ``nvmlGetVgpuCompatibility``): the VM compatibility flags (live 8, sleep 4, hibernate 2, cold 1, none 0), the
  limiting factor (host driver 1, guest driver 2, GPU 4, other 0x80000000) and the GPU's caps.

The real metadata is NVIDIA's opaque struct; the simulator's has the same size (468 bytes) and carries what its
answer depends on: the board, the vGPU manager's version, the vGPU type. Its rules follow NVIDIA's documented
ones: another board is not compatible (GPU), an older vGPU manager on the destination is not (host driver), a
host or vGPU with migration off is not (other). Every existing mdev counts as an active vGPU here.
"""

from __future__ import annotations

import json
from typing import Any

from vgpuvirt.model import PciAddress
from vgpuvirt.sim.model import SimModel

MIGRATION_CALLS = ("vgpu_migration_metadata", "vgpu_migration_compat")
VGPU_META_SIZE = 468                   # sizeof(nvmlVgpuMetadata_t)
LIVE, SLEEP, HIBERNATE, COLD, NONE = 8, 4, 2, 1, 0
LIMIT_HOST_DRIVER, LIMIT_GPU, LIMIT_OTHER = 1, 4, 0x80000000
NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND = 3, 2, 6


def _fail(rc: int, text: str) -> dict[str, Any]:
    return {"ok": False, "errno": None, "rc": rc, "error": text}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def _board(model: SimModel, addr: str) -> str:
    d = model.devices[addr]
    phys = model.devices.get(str(d.physfn)) if d.physfn is not None else d
    return f"0x{(phys or d).spec.device:04x}"


def answer(model: SimModel, call: str, args: list[str]) -> dict[str, Any]:
    caps = 1 if model.vgpu_migration else 0
    if call == "vgpu_migration_metadata":
        m = model.mdevs.get(args[0].lower()) if args else None
        if m is None:
            return _fail(NOT_FOUND, f"no active vGPU with mdev UUID {args[:1]}: Not Found")
        info = json.dumps({"board": _board(model, m.parent), "driver": model.driver_version, "type": m.type.name})
        blob = info.encode().ljust(VGPU_META_SIZE, b"\0")
        return {"ok": True, "rc": 0, "stdout": json.dumps({"caps": caps, "host_driver": model.driver_version,
                                                          "guest_driver": "", "blob": blob.hex()})}
    if len(args) != 2:
        return _fail(INVALID_ARGUMENT, "Invalid Argument")
    try:
        addr = str(PciAddress.from_nvml(args[0]))
        raw = bytes.fromhex(args[1])
        src = json.loads(raw.rstrip(b"\0").decode())
    except (ValueError, UnicodeDecodeError):
        return _fail(INVALID_ARGUMENT, "Invalid Argument")
    if addr not in model.devices or model.devices[addr].gpu is None or len(raw) != VGPU_META_SIZE:
        return _fail(NOT_SUPPORTED if addr in model.devices else NOT_FOUND, "Not Supported")
    vm, limit = LIVE | SLEEP | HIBERNATE | COLD, 0
    if _board(model, addr) != src.get("board"):
        vm, limit = NONE, LIMIT_GPU
    elif _version(model.driver_version) < _version(str(src.get("driver", ""))):
        vm, limit = NONE, LIMIT_HOST_DRIVER
    elif not caps:
        vm, limit = NONE, LIMIT_OTHER
    return {"ok": True, "rc": 0, "stdout": json.dumps({"vm": vm, "limit": limit, "pgpu_caps": caps,
                                                      "host_driver": model.driver_version})}
