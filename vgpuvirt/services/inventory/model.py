"""The inventory of one host: the frozen :class:`Inventory` of its parts (:mod:`.parts`), with
``to_dict`` (the JSON contract of DESIGN.md), where each GPU carries its capacity.

Pure: no I/O. :mod:`vgpuvirt.services.inventory.build` makes it from one snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.model import PciAddress
from vgpuvirt.services.capacity.budget import GpuBudget
from vgpuvirt.services.capacity.build import gpu_budgets
from vgpuvirt.services.cordon import Cordon
from vgpuvirt.services.inventory.host_resources import HostResources
from vgpuvirt.services.inventory.parts import Gpu, Mdev, MdevParent, PciDevice, VendorVf
from vgpuvirt.services.pci import parsers as P


@dataclass(frozen=True)
class Inventory:
    host: str
    iommu_enabled: bool
    pci_devices: list[PciDevice]
    iommu_groups: dict[int, list[PciAddress]]
    mdev_parents: list[MdevParent]
    mdevs: list[Mdev]
    vendor_vgpu: list[VendorVf]
    gpus: list[Gpu]
    warnings: list[str]
    iommu_units: list[str] = field(default_factory=list)
    nvidia_driver_version: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    cordon: Cordon | None = None             # the host's cordon mark: placement skips a cordoned host
    # CPUs and free hugepages (the plan's pre-flight); not part of the JSON contract.
    resources: HostResources = field(default_factory=HostResources, compare=False, repr=False)

    # -- lookups -------------------------------------------------------------------------
    def device(self, address: str | PciAddress) -> PciDevice | None:
        a = PciAddress.parse(address)
        return next((d for d in self.pci_devices if d.address == a), None)

    def gpu(self, address: str | PciAddress) -> Gpu | None:
        a = PciAddress.parse(address)
        return next((g for g in self.gpus if g.address == a), None)

    def mdev_parent(self, name: str) -> MdevParent | None:
        a = P.pci_or_none(name)
        key = str(a) if a else name
        return next((p for p in self.mdev_parents if p.address == key), None)

    def capacity(self) -> list[GpuBudget]:
        """One :class:`~vgpuvirt.services.capacity.budget.GpuBudget` per physical GPU (the capacity model)."""
        return gpu_budgets(self)

    def _gpus_with_capacity(self) -> list[dict[str, Any]]:
        budgets = {b.address: b.to_dict() for b in self.capacity()}
        return [{**g.to_dict(), "capacity": budgets.get(g.address)} for g in self.gpus]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "iommu_enabled": self.iommu_enabled,
            "pci_devices": [d.to_dict() for d in self.pci_devices],
            "iommu_groups": {str(g): [str(a) for a in members] for g, members in sorted(self.iommu_groups.items())},
            "mdev_parents": [p.to_dict() for p in self.mdev_parents],
            "mdevs": [m.to_dict() for m in self.mdevs],
            "vendor_vgpu": [v.to_dict() for v in self.vendor_vgpu],
            "gpus": self._gpus_with_capacity(),
            "warnings": list(self.warnings),
            "iommu_units": list(self.iommu_units),
            "nvidia_driver_version": self.nvidia_driver_version,
            "sources": dict(self.sources),
            "cordon": self.cordon.to_dict() if self.cordon is not None else None,
        }
