"""The IOMMU pre-flight of :mod:`.api` over an inventory instead of a fresh read (pure).

Placement checks every passthrough candidate with the very rules ``vgpuvirt iommu check`` applies
(one function, :func:`vgpuvirt.services.iommu.check._check_one`), fed from the inventory it already holds:
the plan never proposes a GPU that ``iommu check`` would call BLOCKED.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vgpuvirt.model import PciAddress
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.inventory.parts import PciDevice
from vgpuvirt.services.iommu.check import DeviceCheck, check_one


class InventoryFacts:
    """The fact interface :func:`check_one` reads, answered from an :class:`Inventory`."""

    def __init__(self, inv: Inventory) -> None:
        self.devices: dict[PciAddress, PciDevice] = {d.address: d for d in inv.pci_devices}
        self.groups: dict[int, list[PciAddress]] = {g: list(m) for g, m in inv.iommu_groups.items()}
        self.iommu_enabled = inv.iommu_enabled
        self.mdevs: dict[str, int] = {}
        for m in inv.mdevs:
            if m.parent:
                self.mdevs[m.parent] = self.mdevs.get(m.parent, 0) + 1
        self._vf_type = {v.address: v.current_type for v in inv.vendor_vgpu}

    def present(self, a: PciAddress) -> bool:
        return a in self.devices

    def pci_class(self, a: PciAddress) -> int | None:
        d = self.devices.get(a)
        try:
            return int(d.pci_class, 16) if d is not None and d.pci_class else None
        except ValueError:
            return None

    def driver(self, a: PciAddress) -> str | None:
        d = self.devices.get(a)
        return d.driver if d is not None else None

    def group(self, a: PciAddress) -> int | None:
        d = self.devices.get(a)
        return d.iommu_group if d is not None else None

    def physfn(self, a: PciAddress) -> PciAddress | None:
        d = self.devices.get(a)
        return d.physfn if d is not None else None

    def num_vfs(self, a: PciAddress) -> int | None:
        d = self.devices.get(a)
        return d.sriov_numvfs if d is not None else None

    def vgpu_type(self, a: PciAddress) -> int | None:
        return self._vf_type.get(a)

    def is_bridge(self, a: PciAddress) -> bool:
        c = self.pci_class(a)
        return c is not None and c >> 16 == 0x06

    def reset_methods(self, a: PciAddress) -> list[str] | None:
        d = self.devices.get(a)
        return d.reset_methods if d is not None else None

    def boot_vga(self, a: PciAddress) -> bool:
        d = self.devices.get(a)
        return bool(d is not None and d.boot_vga)


def check_from_inventory(inv: Inventory, addresses: Iterable[PciAddress],
                         users: Mapping[PciAddress, list[str]]) -> list[DeviceCheck]:
    """:func:`vgpuvirt.services.iommu.api.check_assignable`'s per-device verdicts, from ``inv``."""
    facts = InventoryFacts(inv)
    reqs = list(dict.fromkeys(addresses))
    return [check_one(facts, a, set(reqs), users) for a in reqs]  # type: ignore[arg-type]
