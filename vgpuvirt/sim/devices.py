"""The simulated host's objects (GPUs, PCI functions, mdevs).

:class:`SimModel` (:mod:`vgpuvirt.sim.model`) owns these objects and the kernel semantics that change them.
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass, field

from vgpuvirt.sim.profiles import DeviceSpec, TypeTable, VgpuSpec, VgpuType

_UUID_HEX = set("0123456789abcdefABCDEF")


def uuid_is_valid(s: str) -> bool:
    """lib/uuid.c uuid_is_valid(): 36 chars, dashes at 8/13/18/23, hex elsewhere."""
    if len(s) < 36:
        return False
    for i in range(36):
        if i in (8, 13, 18, 23):
            if s[i] != "-":
                return False
        elif s[i] not in _UUID_HEX:
            return False
    return True


@dataclass
class Gpu:
    """A physical GPU: the capacity domain for NVIDIA vGPU rules (PF plus its VFs) or a GVT-g pool."""

    pf: str
    spec: VgpuSpec
    heterogeneous: bool = False
    mig_enabled: bool = False
    gpu_instances: dict[int, str] = field(default_factory=dict)   # GI id -> MIG profile name
    mig_pending: bool | None = None     # a MIG mode set but not in effect until a GPU reset or reboot
    gi_start: dict[int, int] = field(default_factory=dict)        # GI id -> placement start (memory slice)
    compute_instances: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)  # GI -> CI -> (k, start)
    processes: int = 0                  # host processes holding the GPU (CUDA, DCGM...): a reset must wait

    def gi_table(self) -> dict[int, tuple[str, int]]:
        """GI id -> (MIG profile name, placement start)."""
        return {gi: (p, self.gi_start.get(gi, 0)) for gi, p in self.gpu_instances.items()}

    @property
    def table(self) -> TypeTable:
        return self.spec.table

    @property
    def vgpu_host(self) -> bool:
        """On the vGPU host driver (mode "none": the datacenter driver, MIG only)."""
        return self.spec.mode != "none"


@dataclass
class Dev:
    addr: str
    spec: DeviceSpec
    sysfs_dir: str                      # canonical /sys/devices/... path
    driver: str | None
    numa_node: int
    group: int | None
    reset_method: str
    override: str | None = None
    physfn: str | None = None
    vf_index: int | None = None
    numvfs: int = 0
    autoprobe: bool = True
    gpu: Gpu | None = None
    vendor_type: int = 0                # NVIDIA vGPU 17+ current_vgpu_type on a VF
    vendor_gi: int | None = None

    @property
    def native_driver(self) -> str | None:
        if self.physfn is not None:
            return None if self.spec.sriov is None else self.spec.sriov.vf_driver
        return self.spec.driver


@dataclass
class Mdev:
    uuid: str
    parent: str
    type: VgpuType
    group: int
    gi: int | None = None
    vgpu_params: str = ""
    gvt_id: int = 0


def gpu_uuid(addr: str) -> str:
    """The GPU UUID nvidia-smi, NVML and /proc/driver/nvidia report for a simulated GPU (stable per address)."""
    return "GPU-" + str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"vgpuvirt-sim-gpu:{addr}"))
