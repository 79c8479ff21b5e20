"""Host inventory in ONE round trip: GPUs, vGPU types and capacity, SR-IOV, IOMMU groups, mdevs, NVIDIA facts.

:func:`inventory` asks the host once: ``host.read(INVENTORY_GLOBS)``, or, when ``nvidia-smi -q -x`` should run
too, ``host.apply([exec nvidia-smi], reads_after=INVENTORY_GLOBS)``, which is still one round trip (one remote
exec over SSH). Everything after that is :func:`build_inventory`, a pure function of the snapshot, so every
format is tested without a host. This module reads; the rest lives by concern: the values in
:mod:`.inventory_model`, parsing the snapshot in :mod:`.inventory_parse`, building in :mod:`.inventory_build`,
NVIDIA (nvidia-smi/NVML, vendor VFs) in :mod:`.inventory_nvidia`, capacity per type in :mod:`.type_capacity`;
their public names are re-exported here. :meth:`Inventory.to_dict` is the JSON contract of DESIGN.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from vgpuvirt.errors import HostError, InvalidSpec
from vgpuvirt.host.base import Host, Op, OpResult, Snapshot
from vgpuvirt.services.cordon import CORDON_FILE
from vgpuvirt.services.host_resources import RESOURCE_GLOBS
from vgpuvirt.services.inventory_build import build_inventory
from vgpuvirt.services.inventory_health import health_inputs
from vgpuvirt.services.inventory_model import Inventory
from vgpuvirt.services.inventory_parse import class_name
from vgpuvirt.services.inventory_parts import (
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
from vgpuvirt.services.kernel_log import DMESG_ARGV
from vgpuvirt.services.nvidia_smi import NVIDIA_SMI_ARGV, NVIDIA_SMI_LGI_ARGV, NVIDIA_SMI_LGIP_ARGV
from vgpuvirt.services.nvidia_static import StaticFacts
from vgpuvirt.services.nvml import NvmlReport
from vgpuvirt.services.query_gpu import QUERY_GPU_ARGV
from vgpuvirt.services.sysfs import IOMMU_CLASS, IOMMU_GROUPS, MDEV_BUS, MDEV_DEVICES, NVIDIA_VERSION, PCI, PROC_CMDLINE
from vgpuvirt.services.type_capacity import TypeCapacity, type_capacity

__all__ = ["INVENTORY_ARGVS", "INVENTORY_GLOBS", "VENDOR_NAMES", "Backend", "Gpu", "Inventory", "Mdev", "MdevParent",
           "MdevType", "PciDevice", "TypeCapacity", "VendorType", "VendorVf", "build_inventory", "class_name",
           "inventory", "type_capacity"]

_PCI_ATTRS = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class", "driver", "driver_override",
              "numa_node", "iommu_group", "reset_method", "local_cpulist", "boot_vga", "sriov_totalvfs",
              "sriov_numvfs", "sriov_offset", "sriov_stride", "physfn", "virtfn*", "nvidia/*")
#: What a vGPU type says about itself: fixed by the GPU and the driver, the same on every VF of one GPU.
_TYPE_STATIC = ("name", "description", "device_api")

#: Every pattern the inventory reads, in ONE host.read() (the agent expands them host-side).
#: A type's static attributes are read on each parent that is not a VF, and on ONE VF per PF (the
#: agent's ``{1?...}`` guard): on an 8 x 32-VF host that is 552 files instead of 17,664; the VFs' own
#: ``available_instances`` are all read, since they differ.
INVENTORY_GLOBS: tuple[str, ...] = (
    f"{PCI}/*",
    *(f"{PCI}/*/{a}" for a in _PCI_ATTRS),
    *(f"{PCI}/*/virtfn*{{1?mdev_supported_types}}/mdev_supported_types/*/{a}" for a in _TYPE_STATIC),
    f"{MDEV_BUS}/*",
    *(f"{MDEV_BUS}/*{{!physfn}}/mdev_supported_types/*/{a}" for a in _TYPE_STATIC),
    f"{MDEV_BUS}/*/mdev_supported_types/*/available_instances",
    f"{MDEV_DEVICES}/*",
    f"{MDEV_DEVICES}/*/mdev_type",
    f"{MDEV_DEVICES}/*/driver",
    f"{MDEV_DEVICES}/*/iommu_group",
    f"{MDEV_DEVICES}/*/nvidia/vgpu_params",
    IOMMU_GROUPS,             # the folder itself: present and empty (IOMMU off) differs from absent
    f"{IOMMU_GROUPS}/*/devices/*",
    f"{IOMMU_CLASS}/*",
    NVIDIA_VERSION,
    PROC_CMDLINE,
    *RESOURCE_GLOBS,          # CPUs and free hugepages: the plan's pre-flight
    CORDON_FILE,              # the host's cordon mark: every controller's placement skips a cordoned host
)

#: The programs an inventory runs with its reads (when it runs nvidia-smi), in this order.
INVENTORY_ARGVS: tuple[tuple[str, ...], ...] = (NVIDIA_SMI_ARGV, NVIDIA_SMI_LGI_ARGV, NVIDIA_SMI_LGIP_ARGV, DMESG_ARGV)


def _nvml_wanted(host: Host, use_nvml: bool | None) -> bool:
    from vgpuvirt.host.local import LocalHost

    local_root = isinstance(host, LocalHost) and host.sysfs_root == "/"
    if use_nvml and not local_root:
        raise InvalidSpec("use_nvml", use_nvml,
                          "NVML only on LocalHost reading the real / (it describes the machine we run on)")
    return local_root if use_nvml is None else use_nvml


def inventory(host: Host, *, domains: Iterable[tuple[str, str]] | None = None, use_nvml: bool | None = None,
              nvidia_smi: bool | None = None, static: StaticFacts | None = None) -> Inventory:
    """Inventory ``host`` in ONE round trip.

    ``domains``: (name, XML) pairs of the libvirt domains, to join mdevs/PCI devices with the domains that use
    them and flag orphans. ``use_nvml``: None = when the host is this machine and pynvml is installed;
    True = required (``MissingDependency`` without pynvml); False = never. ``nvidia_smi``: run
    ``nvidia-smi -q -x`` in the same round trip; None = when NVML is not used and the host reads its real
    ``/`` (with another sysfs_root the tree is not the machine nvidia-smi would describe). ``static``: the
    ``-q -x`` answers kept from earlier reads (a caller that inventories a host again and again: the exporter,
    a pool): while one is fresh, ``nvidia-smi --query-gpu`` (~25 ms on an H100) replaces ``-q -x`` (108 ms)
    in the round trip (:mod:`.nvidia_static` says when ``-q -x`` is read again).
    """
    nvml_report: NvmlReport | None = None
    if _nvml_wanted(host, use_nvml):
        from vgpuvirt.services import nvml as nvml_mod

        module = nvml_mod.load_pynvml(required=bool(use_nvml))
        if module is not None:
            nvml_report = nvml_mod.collect(module)
    if nvidia_smi is None:
        nvidia_smi = host.sysfs_root == "/" and not (nvml_report and nvml_report.available)
    smi: OpResult | None = None
    dmesg: OpResult | None = None
    lgi: OpResult | None = None
    lgip: OpResult | None = None
    if nvidia_smi and static is not None:
        return _with_static(host, static, domains, nvml_report)
    if nvidia_smi:
        # One exec: nvidia-smi first, then the sysfs reads, in the same agent request. A missing
        # nvidia-smi (ENOENT, rc 127) is normal; lock=False because nothing is changed.
        # `mig -lgi` and `-lgip` ride along: the GPU-instance table is what MIG-backed capacity counts, the
        # profiles' free counts what GPU instances could still be created in the free slices.
        # `dmesg` too: its XIDs, with nvidia-smi's ECC / retired-page / PCIe readings, give each GPU's health
        # (placement skips unhealthy GPUs) at no extra round trip.
        batch = host.apply([Op.exec(a, timeout=60.0, read_only=True) for a in INVENTORY_ARGVS], lock=False,
                           on_error="continue", reads_after=INVENTORY_GLOBS)
        snap, smi, lgi, lgip, dmesg = batch.after, batch[0], batch[1], batch[2], batch[3]
    else:
        snap = host.read(INVENTORY_GLOBS)
    _no_sysfs_tree(host, snap)
    return build_inventory(snap, host=host.name, domains=domains, nvidia_smi=smi, nvml=nvml_report, mig_lgi=lgi,
                           mig_lgip=lgip, kernel_log=dmesg)


def _with_static(host: Host, static: StaticFacts, domains: Iterable[tuple[str, str]] | None,
                 nvml_report: NvmlReport | None) -> Inventory:
    """:func:`inventory` with ``--query-gpu`` in the round trip, and ``-q -x`` only when ``static`` says so."""
    now = time.time()
    fresh = static.fresh(host.name, now)
    left_out: set[tuple[str, ...]] = {NVIDIA_SMI_ARGV} if fresh else set()
    mig = {NVIDIA_SMI_LGI_ARGV, NVIDIA_SMI_LGIP_ARGV}
    if fresh and static.mig_off(host.name):
        left_out |= mig
    argvs = [QUERY_GPU_ARGV, *(a for a in INVENTORY_ARGVS if a not in left_out)]
    batch = host.apply([Op.exec(a, timeout=60.0, read_only=True) for a in argvs], lock=False,
                       on_error="continue", reads_after=INVENTORY_GLOBS)
    got = dict(zip(argvs, batch.results, strict=True))
    _no_sysfs_tree(host, batch.after)

    def read_again() -> OpResult:
        # -q -x no longer describes the GPUs: read it, with the MIG listings left out (MIG may be on now)
        again = [NVIDIA_SMI_ARGV, *(a for a in INVENTORY_ARGVS if a in left_out and a != NVIDIA_SMI_ARGV)]
        b = host.apply([Op.exec(a, timeout=60.0, read_only=True) for a in again], lock=False, on_error="continue")
        got.update(zip(again, b.results, strict=True))
        return got[NVIDIA_SMI_ARGV]

    smi, readings = static.resolve(host.name, got[QUERY_GPU_ARGV], got.get(NVIDIA_SMI_ARGV), now, read_again)
    lgi, lgip, dmesg = got.get(NVIDIA_SMI_LGI_ARGV), got.get(NVIDIA_SMI_LGIP_ARGV), got[DMESG_ARGV]
    health = health_inputs(smi if readings is None else None, dmesg)
    if readings is not None:
        health = replace(health, readings=readings)
    return build_inventory(batch.after, host=host.name, domains=domains, nvidia_smi=smi, nvml=nvml_report,
                           mig_lgi=lgi, mig_lgip=lgip, kernel_log=dmesg, health=health)


def _no_sysfs_tree(host: Host, snap: Snapshot) -> None:
    if not any(path.startswith((f"{PCI}/", f"{MDEV_BUS}/")) for path in snap):
        # A sysfs lists PCI devices (the host bridge at least) or, on hosts without PCI (s390: css/ap parents,
        # mdevctl's own test trees), mdev parents: with neither, the root is not a sysfs tree (an empty or
        # wrong --sysfs-root), not a host with no GPU and the IOMMU off.
        raise HostError(host.name, f"no sysfs tree here: nothing under {host.sysfs_root.rstrip('/')}{PCI} "
                                   f"or {MDEV_BUS} (a sysfs root is the directory that holds sys/, e.g. / or a "
                                   "materialized tree)")
