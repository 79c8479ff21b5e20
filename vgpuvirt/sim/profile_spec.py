"""The values a simulator profile holds: frozen specs of devices, SR-IOV, vGPU types and NUMA nodes."""

from __future__ import annotations

import errno as _errno
from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.model import PciAddress

#: "none": the board's table (framebuffer, MIG profiles) on NVIDIA's datacenter driver, which is not the vGPU
#: host driver: no mdev type, no vGPU VF, MIG available (the real H100/H200 captures)
VGPU_MODES = ("mdev", "mdev-sriov", "vendor", "gvtg", "none")
#: the NVIDIA driver of a profile that names none (a vGPU host driver of the 17.x branch)
DRIVER_VERSION = "550.90.05"



class ProfileError(VgpuvirtError, ValueError):
    """A profile file is malformed: carries the file, the key path and the reason."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file = file
        self.key = key
        self.reason = reason
        super().__init__(f"simulator profile {file}: {key or '<top>'}: {reason}")


@dataclass(frozen=True)
class VgpuType:
    """One mdev / vGPU type. ``sysfs_id`` is the type directory name (``nvidia-231``)."""

    sysfs_id: str
    name: str
    number: int | None = None          # NVIDIA numeric id (creatable_vgpu_types, current_vgpu_type)
    framebuffer_mib: int = 0
    num_heads: int = 0
    frl: int = 0
    max_resolution: str = ""
    max_instance: int = 0
    mig_profile: str | None = None     # GPU-instance profile a MIG-backed type consumes
    low_gm: int = 0                    # GVT-g resources (MiB, MiB, fences)
    high_gm: int = 0
    fence: int = 0
    weight: int = 0
    description: str = ""
    device_api: str = "vfio-pci"


@dataclass(frozen=True)
class MigProfile:
    id: int
    name: str
    max: int
    slices: int                        # compute slices
    memory_gib: float = 0.0            # ``-lgip`` Memory GiB (0: derived from the table's framebuffer)
    engines: tuple[int, ...] = ()      # ``-lgip`` SM, DEC, ENC, CE, JPEG, OFA (empty: derived)


@dataclass(frozen=True)
class TypeTable:
    name: str
    driver: str                        # the parent's driver that registers these types
    mdev_driver: str                   # the driver mdev devices bind to
    types: tuple[VgpuType, ...]
    framebuffer_mib: int = 0
    heterogeneous: bool = False        # the hardware supports mixed-size (nvidia-smi vgpu -shm 1)
    mig_profiles: tuple[MigProfile, ...] = ()
    compute_slices: int = 7            # MIG compute slices of one GPU (A100/H100: 7, A30: 4)
    memory_slices: int = 8             # MIG memory slices of one GPU (A100/H100: 8, A30: 4)
    mig_reset: bool = True             # a MIG mode change needs a GPU reset (Ampere); Hopper and later: False
    create_errno: int = _errno.EINVAL  # what a create write fails with when there is no capacity
    fb_total_mib: int = 0              # nvidia-smi's fb_memory_usage/total (0: framebuffer_mib, INFERRED)
    fb_reserved_mib: int = 0           # nvidia-smi's fb_memory_usage/reserved (the driver's and firmware's)

    def get(self, sysfs_id: str) -> VgpuType | None:
        for t in self.types:
            if t.sysfs_id == sysfs_id:
                return t
        return None

    def by_number(self, number: int) -> VgpuType | None:
        for t in self.types:
            if t.number == number:
                return t
        return None


@dataclass(frozen=True)
class GpuInstanceSpec:
    id: int
    profile: str


@dataclass(frozen=True)
class InitialVgpu:
    type: str                          # nvidia-231 / i915-GVTg_V5_4 / 1155 (vendor mode)
    uuid: str | None = None
    vf: int | None = None


@dataclass(frozen=True)
class VgpuSpec:
    mode: str
    table: TypeTable
    heterogeneous: bool = False
    mig_enabled: bool = False
    gpu_instances: tuple[GpuInstanceSpec, ...] = ()
    pool: Mapping[str, int] = field(default_factory=dict)   # GVT-g: low_gm, high_gm, fences available
    vgpus: tuple[InitialVgpu, ...] = ()


@dataclass(frozen=True)
class SriovSpec:
    totalvfs: int
    numvfs: int = 0
    offset: int = 1
    stride: int = 1
    vf_device: int = 0
    vf_driver: str | None = None
    vf_class: int | None = None


@dataclass(frozen=True)
class DeviceSpec:
    address: PciAddress
    parent: PciAddress | None
    vendor: int
    device: int
    pci_class: int
    subsystem_vendor: int = 0
    subsystem_device: int = 0
    revision: int = 0
    driver: str | None = None
    numa_node: int = -1
    iommu_group: int | None = None
    reset_method: str = ""
    product: str = ""
    boot_vga: bool = False
    sriov: SriovSpec | None = None
    vgpu: VgpuSpec | None = None

    @property
    def is_bridge(self) -> bool:
        return (self.pci_class >> 8) == 0x0604


@dataclass(frozen=True)
class NodeSpec:
    id: int
    cpus: frozenset[int]
    memory_mib: int
    hugepages: Mapping[int, int]       # page size kB -> count


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    iommu: bool
    nodes: tuple[NodeSpec, ...]
    threads_per_core: int
    devices: tuple[DeviceSpec, ...]
    drivers: tuple[str, ...]
    source: str = ""
    driver_version: str = DRIVER_VERSION
    #: The OS is itself a VM guest with the GPU passed through (nvidia-smi: Virtualization Mode
    #: ``Pass-Through``; its driver is the datacenter one, not the vGPU host driver), as on the real H100/H200.
    guest: bool = False
    cmdline: str = ""                  # /proc/cmdline ("" -> one that matches ``iommu``)

    def device(self, address: str) -> DeviceSpec | None:
        a = PciAddress.parse(address)
        for d in self.devices:
            if d.address == a:
                return d
        return None


# ---------------------------------------------------------------------------------------------
# loading


def vf_address(pf: PciAddress, sriov: SriovSpec, index: int) -> PciAddress:
    """The routing ID arithmetic of drivers/pci/iov.c (pci_iov_virtfn_bus/devfn)."""
    rid = (pf.bus << 8) | (pf.slot << 3) | pf.function
    rid += sriov.offset + sriov.stride * index
    return PciAddress(pf.domain, (rid >> 8) & 0xFF, (rid >> 3) & 0x1F, rid & 7)
