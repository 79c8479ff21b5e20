"""Driver binding: move a PCI function to vfio-pci (passthrough) or back to its vendor's driver; the undo moves
it back to the driver it had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import HostFacts, HostStep, Phase
from vgpuvirt.host.base import Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services import sysfs, vfio_binding
from vgpuvirt.services.mutation import Planned


@dataclass(frozen=True)
class BindDriver(HostStep):
    """Bind ``device`` to ``to`` (``vfio-pci``, or a vendor driver such as ``nvidia``). ``current``: its driver
    now (None: no driver; the undo then leaves it bound, there being nothing to go back to)."""

    kind: ClassVar[str] = "bind-driver"
    phase: ClassVar[Phase] = Phase.PREPARE
    rank: ClassVar[int] = 30            # after the VFs went (a PF with VFs cannot unbind), before new VFs come
    host: str
    vm: str
    device: PciAddress
    current: str | None
    to: str

    @property
    def target(self) -> str:
        return str(self.device)

    def describe(self) -> str:
        return f"bind {self.device} to {self.to}"

    def details(self) -> dict[str, str]:
        return {"device": str(self.device), "from": self.current or "", "to": self.to}

    def done_in(self, facts: HostFacts) -> bool:
        return False        # planned from a fresh read of the driver link: a device already bound is not planned

    def item(self, wait_timeout: float) -> Planned:
        return vfio_binding.bind_item(self.host, self.device, self.current, self.to, timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned | None:
        if self.current is None:
            return None
        return vfio_binding.bind_item(self.host, self.device, self.to, self.current, timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.pci(self.device, "driver")

    def happened(self, snap: Snapshot) -> bool:
        return (snap.link(self.state_path()) or "").rstrip("/").endswith("/" + self.to)

    def undone(self) -> str:
        return f"bound {self.device} back to {self.current}"
