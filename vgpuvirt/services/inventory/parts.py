"""The parts of an inventory: one frozen dataclass per PCI device, mdev type and parent, mdev, vendor vGPU VF
and GPU, each with ``to_dict`` (the JSON contract of DESIGN.md).

Pure: no I/O. Below both :mod:`vgpuvirt.services.inventory.model` (the whole inventory, whose JSON carries each
GPU's capacity) and :mod:`vgpuvirt.services.capacity.build` (the capacity, built from these parts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.services.metrics_model import Health
from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts
from vgpuvirt.services.pci import parsers as P
from vgpuvirt.usage import Backend as Backend  # re-exported: inventory callers import it here

#: The vendors vgpuvirt places GPUs of, by PCI vendor id (requests name them: ``vendor=nvidia``).
VENDOR_KEYS = {"0x10de": "nvidia", "0x8086": "intel", "0x1002": "amd"}
VENDOR_NAMES = {"0x10de": "NVIDIA", "0x8086": "Intel", "0x1002": "AMD", "0x1af4": "Red Hat (virtio)",
                "0x1234": "QEMU"}


@dataclass(frozen=True)
class PciDevice:
    address: PciAddress
    vendor: str | None
    device: str | None
    pci_class: str | None
    driver: str | None
    iommu_group: int | None
    numa_node: int | None
    physfn: PciAddress | None
    virtfns: list[PciAddress]
    sriov_totalvfs: int | None
    sriov_numvfs: int | None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    driver_override: str | None = None
    reset_methods: list[str] | None = None
    local_cpulist: str | None = None
    boot_vga: bool | None = None
    upstream: PciAddress | None = None      # the bridge/root port above it (from the device path)
    domain: str | None = None               # libvirt domain with a <hostdev type='pci'> on it

    @property
    def is_bridge(self) -> bool:
        return (self.pci_class or "").startswith("0x06")

    @property
    def is_gpu(self) -> bool:
        c = self.pci_class or ""
        return c.startswith("0x03") or (c.startswith("0x12") and self.vendor in ("0x10de", "0x1002", "0x8086"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": str(self.address), "vendor": self.vendor, "device": self.device, "class": self.pci_class,
            "driver": self.driver, "iommu_group": self.iommu_group, "numa_node": self.numa_node,
            "physfn": str(self.physfn) if self.physfn else None, "virtfns": [str(v) for v in self.virtfns],
            "sriov_totalvfs": self.sriov_totalvfs, "sriov_numvfs": self.sriov_numvfs,
            "subsystem_vendor": self.subsystem_vendor, "subsystem_device": self.subsystem_device,
            "driver_override": self.driver_override, "reset_methods": self.reset_methods,
            "local_cpulist": self.local_cpulist, "boot_vga": self.boot_vga,
            "upstream": str(self.upstream) if self.upstream else None, "domain": self.domain,
        }


@dataclass(frozen=True)
class MdevType:
    id: str
    name: str | None
    description: str | None
    device_api: str | None
    available_instances: int | None
    framebuffer_mib: int | None = None
    max_instances: int | None = None
    num_heads: int | None = None
    max_resolution: str | None = None
    frl: int | None = None
    series: str | None = None
    mig_backed: bool = False
    gi_profile: str | None = None
    board: str | None = None
    gvtg: P.GvtgDescription | None = None
    instances: int = 0                       # mdevs of this type that exist on this parent

    @property
    def vgpu_type_id(self) -> int | None:
        m = re.fullmatch(r"nvidia-(\d+)", self.id)
        return int(m[1]) if m else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "description": self.description, "device_api": self.device_api,
            "available_instances": self.available_instances, "framebuffer_mib": self.framebuffer_mib,
            "max_instances": self.max_instances, "num_heads": self.num_heads,
            "max_resolution": self.max_resolution, "frl": self.frl, "series": self.series,
            "mig_backed": self.mig_backed, "gi_profile": self.gi_profile, "board": self.board,
            "gvtg": self.gvtg.to_dict() if self.gvtg else None, "instances": self.instances,
        }


@dataclass(frozen=True)
class MdevParent:
    address: str                             # canonical PCI address, or the device name (mtty, matrix)
    types: list[MdevType]
    physfn: PciAddress | None = None

    @property
    def pci(self) -> PciAddress | None:
        return P.pci_or_none(self.address)

    def type(self, type_id: str) -> MdevType | None:
        return next((t for t in self.types if t.id == type_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "types": [t.to_dict() for t in self.types],
                "physfn": str(self.physfn) if self.physfn else None}


@dataclass(frozen=True)
class Mdev:
    uuid: MdevUuid
    parent: str | None
    type: str | None
    domain: str | None = None
    orphan: bool | None = None               # None: no domain list was given, so unknown
    iommu_group: int | None = None
    driver: str | None = None
    vgpu_params: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": str(self.uuid), "parent": self.parent, "type": self.type, "domain": self.domain,
                "orphan": self.orphan, "iommu_group": self.iommu_group, "driver": self.driver,
                "vgpu_params": self.vgpu_params}


@dataclass(frozen=True)
class VendorType:
    id: int
    name: str

    @property
    def classification(self) -> P.VgpuClass:
        return P.classify_vgpu_name(self.name)

    def to_dict(self) -> dict[str, Any]:
        c = self.classification
        return {"id": self.id, "name": self.name, "series": c.series,
                "framebuffer_mib": c.framebuffer_gib * 1024 if c.framebuffer_gib is not None else None,
                "mig_backed": c.mig_backed, "gi_profile": c.gi_profile, "board": c.board}


@dataclass(frozen=True)
class VendorVf:
    address: PciAddress
    physfn: PciAddress | None
    current_type: int
    creatable_types: list[VendorType]
    current_type_name: str | None = None
    domain: str | None = None
    orphan: bool | None = None
    driver: str | None = None
    iommu_group: int | None = None
    read_error: str | None = None            # creatable_vgpu_types could not be read (errno text)

    @property
    def free(self) -> bool:
        return self.current_type == 0

    def offers(self, type_id: int) -> bool:
        return any(t.id == type_id for t in self.creatable_types)

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "physfn": str(self.physfn) if self.physfn else None,
                "current_type": self.current_type, "current_type_name": self.current_type_name,
                "creatable_types": [t.to_dict() for t in self.creatable_types], "domain": self.domain,
                "orphan": self.orphan, "driver": self.driver, "iommu_group": self.iommu_group,
                "read_error": self.read_error}


@dataclass(frozen=True)
class Gpu:
    address: PciAddress
    vendor: str | None
    device: str | None
    driver: str | None
    backend: Backend
    numa_node: int | None
    vfs: list[PciAddress]
    vendor_name: str | None = None
    pci_class: str | None = None
    iommu_group: int | None = None
    group_peers: list[PciAddress] = field(default_factory=list)
    functions: list[PciAddress] = field(default_factory=list)   # other functions of the same card (audio, USB)
    local_cpulist: str | None = None
    reset_methods: list[str] | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    vgpus_in_use: int = 0
    domain: str | None = None
    boot_vga: bool | None = None
    nvidia: NvidiaGpuFacts | None = None
    notes: list[str] = field(default_factory=list)
    health: Health | None = None             # None: not known (no nvidia-smi / kernel log in the round trip)

    @property
    def name(self) -> str | None:
        return self.nvidia.product_name if self.nvidia else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": str(self.address), "vendor": self.vendor, "vendor_name": self.vendor_name,
            "device": self.device, "class": self.pci_class, "name": self.name, "driver": self.driver,
            "backend": self.backend, "numa_node": self.numa_node, "local_cpulist": self.local_cpulist,
            "iommu_group": self.iommu_group, "group_peers": [str(a) for a in self.group_peers],
            "functions": [str(a) for a in self.functions], "reset_methods": self.reset_methods,
            "sriov_totalvfs": self.sriov_totalvfs, "sriov_numvfs": self.sriov_numvfs,
            "vfs": [str(v) for v in self.vfs], "vgpus_in_use": self.vgpus_in_use, "domain": self.domain,
            "boot_vga": self.boot_vga, "nvidia": self.nvidia.to_dict() if self.nvidia else None,
            "notes": list(self.notes),
            "health": ({"healthy": self.health.healthy, "reasons": list(self.health.reasons),
                        "warnings": list(self.health.warnings)} if self.health is not None else None),
        }
