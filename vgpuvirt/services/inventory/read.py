"""Host inventory in ONE round trip: GPUs, vGPU types and capacity, SR-IOV, IOMMU groups, mdevs, NVIDIA facts.

:func:`inventory` asks the host once, through :func:`~.host_read.read_host`: ``host.read(INVENTORY_GLOBS)``,
or, when ``nvidia-smi -q -x`` should run too, ``host.apply([exec nvidia-smi], reads_after=INVENTORY_GLOBS)``,
which is still one round trip (one remote exec over SSH). Everything after that is :func:`build_inventory`, a
pure function of the snapshot, so every format is tested without a host. This module reads; the rest lives by concern:
the values in :mod:`.model`, parsing the snapshot in :mod:`.parse`, building in
:mod:`.build`, NVIDIA (nvidia-smi/NVML, vendor VFs) in :mod:`.nvidia`, capacity per type in
:mod:`~vgpuvirt.services.capacity.per_type`; their public names are re-exported here. :meth:`Inventory.to_dict` is the
JSON contract of DESIGN.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpuvirt.errors import HostError
from vgpuvirt.host.base import Host, Snapshot
from vgpuvirt.services.capacity.per_type import TypeCapacity, type_capacity
from vgpuvirt.services.inventory.build import build_inventory
from vgpuvirt.services.inventory.host_read import INVENTORY_GLOBS, Want, read_host
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.inventory.parse import class_name
from vgpuvirt.services.inventory.parts import (
    VENDOR_NAMES,
    Backend,
    Gpu,
    Mdev,
    MdevParent,
    MdevType,
    PciDevice,
    VendorType,
    VendorVf,
)
from vgpuvirt.services.nvidia.kernel_log import DMESG_ARGV
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV, NVIDIA_SMI_LGI_ARGV, NVIDIA_SMI_LGIP_ARGV
from vgpuvirt.services.nvidia.static import StaticFacts
from vgpuvirt.services.pci.sysfs import MDEV_BUS, PCI

__all__ = ["INVENTORY_ARGVS", "INVENTORY_GLOBS", "VENDOR_NAMES", "Backend", "Gpu", "Inventory", "Mdev", "MdevParent",
           "MdevType", "PciDevice", "TypeCapacity", "VendorType", "VendorVf", "build_inventory", "class_name",
           "inventory", "type_capacity"]

#: The programs an inventory runs with its reads (when it runs nvidia-smi), in this order.
INVENTORY_ARGVS: tuple[tuple[str, ...], ...] = (NVIDIA_SMI_ARGV, NVIDIA_SMI_LGI_ARGV, NVIDIA_SMI_LGIP_ARGV, DMESG_ARGV)


#: The wants of an inventory that runs nvidia-smi (:func:`inventory`): the GPU-instance table is what MIG-backed
#: capacity counts, the profiles' free counts what GPU instances could still be created in the free slices;
#: ``dmesg``'s XIDs, with nvidia-smi's ECC / retired-page / PCIe readings, give each GPU's health (placement
#: skips unhealthy GPUs) at no extra round trip.
_TOOLS = frozenset({Want.NVIDIA_SMI, Want.MIG_GPU_INSTANCES, Want.MIG_GI_PROFILES, Want.KERNEL_LOG})


def inventory(host: Host, *, domains: Iterable[tuple[str, str]] | None = None, use_nvml: bool | None = None,
              nvidia_smi: bool | None = None, static: StaticFacts | None = None) -> Inventory:
    """Inventory ``host`` in ONE round trip (:func:`~.host_read.read_host`).

    ``domains``: (name, XML) pairs of the libvirt domains, to join mdevs/PCI devices with the domains that use
    them and flag orphans. ``use_nvml``: None = when the host is this machine and pynvml is installed;
    True = required (``MissingDependency`` without pynvml); False = never. ``nvidia_smi``: run
    ``nvidia-smi -q -x`` in the same round trip; None = when NVML is not used and the host reads its real
    ``/`` (with another sysfs_root the tree is not the machine nvidia-smi would describe). ``static``: the
    ``-q -x`` answers kept from earlier reads (a caller that inventories a host again and again: the exporter,
    a pool): while one is fresh, ``nvidia-smi --query-gpu`` (~25 ms on an H100) replaces ``-q -x`` (108 ms)
    in the round trip (:mod:`~vgpuvirt.services.nvidia.static` says when ``-q -x`` is read again).
    """
    wants = {Want.SYSFS, Want.NVML, Want.NVML_READINGS}   # the readings: each GPU's health where NVML answers
    if nvidia_smi or (nvidia_smi is None and host.sysfs_root == "/"):
        # nvidia-smi runs first, then the sysfs reads, in the same agent request; a missing one (ENOENT,
        # rc 127) is normal. By default NVML, where it answers, gives the same facts without it.
        wants |= _TOOLS | ({Want.TOOLS_ONLY_WITHOUT_NVML} if nvidia_smi is None else set())
    read = read_host(host, wants, static=static, use_nvml=use_nvml)
    _no_sysfs_tree(host, read.snapshot)
    return read.inventory(domains)


def _no_sysfs_tree(host: Host, snap: Snapshot) -> None:
    if not any(path.startswith((f"{PCI}/", f"{MDEV_BUS}/")) for path in snap):
        # A sysfs lists PCI devices (the host bridge at least) or, on hosts without PCI (s390: css/ap parents,
        # mdevctl's own test trees), mdev parents: with neither, the root is not a sysfs tree (an empty or
        # wrong --sysfs-root), not a host with no GPU and the IOMMU off.
        raise HostError(host.name, f"no sysfs tree here: nothing under {host.sysfs_root.rstrip('/')}{PCI} "
                                   f"or {MDEV_BUS} (a sysfs root is the directory that holds sys/, e.g. / or a "
                                   "materialized tree)")
