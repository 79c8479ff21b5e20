"""Every sysfs/procfs path the services read or write, from one place.

The paths are the kernel's absolute ones; the Host maps them under its ``sysfs_root`` (the simulator's
tree, a test's tmpdir), so nothing here knows about roots. A service that needs a path builds it with
these constants and helpers instead of spelling the directory itself: a layout change (a new kernel, a
vendor directory) is then one edit.
"""

from __future__ import annotations

PCI = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
DRIVERS_PROBE = "/sys/bus/pci/drivers_probe"
MDEV_BUS = "/sys/class/mdev_bus"
MDEV_DEVICES = "/sys/bus/mdev/devices"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
IOMMU_CLASS = "/sys/class/iommu"
NVIDIA_VERSION = "/sys/module/nvidia/version"
PROC_CMDLINE = "/proc/cmdline"
#: The NVIDIA driver's own procfs directory (version, loaded module parameters, registry, one folder per GPU).
PROC_NVIDIA = "/proc/driver/nvidia"


def pci(device: object, attr: str = "") -> str:
    """``/sys/bus/pci/devices/<device>[/<attr>]``; ``device`` may be a glob (``*``)."""
    return f"{PCI}/{device}/{attr}" if attr else f"{PCI}/{device}"


def vf_type(vf: object) -> str:
    """The file that holds an NVIDIA vGPU 17+ VF's vGPU type (0: none)."""
    return pci(vf, "nvidia/current_vgpu_type")


def vf_creatable(vf: object) -> str:
    return pci(vf, "nvidia/creatable_vgpu_types")


def driver_unbind(driver: object) -> str:
    return f"{PCI_DRIVERS}/{driver}/unbind"


def mdev_parent(parent: object) -> str:
    return f"{MDEV_BUS}/{parent}"


def mdev_types(parent: object) -> str:
    """The directory of the types an mdev parent offers."""
    return f"{MDEV_BUS}/{parent}/mdev_supported_types"


def mdev_type(parent: object, type_id: object) -> str:
    return f"{mdev_types(parent)}/{type_id}"


def mdev(uuid: object, attr: str = "") -> str:
    """An mdev's directory (a link) on the mdev bus, or one of its attributes."""
    return f"{MDEV_DEVICES}/{uuid}/{attr}" if attr else f"{MDEV_DEVICES}/{uuid}"


def iommu_off(groups_dir: str | None) -> str:
    """Why a host has no IOMMU group, in the kernel's terms. ``groups_dir``: the entry kind of
    /sys/kernel/iommu_groups in the snapshot ("dir"), None when the snapshot does not hold it. The folder
    is there but EMPTY when no IOMMU is on (no DMAR/IVRS unit enabled, or a VM guest given no virtual IOMMU:
    the real H100 guest, tests/fixtures/real/h100-580/raw/sys-ls.txt); saying "no folder" then misleads."""
    if groups_dir == "dir":
        return f"{IOMMU_GROUPS} is empty (no IOMMU is on)"
    return f"no {IOMMU_GROUPS}"
