"""A layout plan's step: one change of the change engine (:mod:`vgpuvirt.change`: its kind owns its phase, rank,
ops, undo and line) and what only a layout asks of it (pure).

The layout adds: the GPU the step is for (plans and diffs are per GPU), the vGPUs it takes away (the drain asks
which domains use them) and the devices it takes away (the drain and the plan's warnings), and, where a kind's own
line does not name what a layout reader knows (a type's short name, the VM a re-made mdev is for), the plan line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vgpuvirt.change.step import HostStep, Phase
from vgpuvirt.layout.observe import Vgpu
from vgpuvirt.model import PciAddress

#: How long a layout's ops wait for the kernel (VFs to appear, mdevs to go): a phase of a big host takes a while.
WAIT = 30.0


@dataclass(frozen=True)
class LayoutStep:
    """One change on one GPU of one host, as a layout plans it."""

    gpu: PciAddress
    change: HostStep
    removes: tuple[Vgpu, ...] = ()               # vGPUs it takes away (the drain looks at their domains)
    touches: tuple[str, ...] = ()                # devices it takes away (mdev UUIDs, PCI addresses)
    label: str | None = None                     # the plan line, where it says more than the kind's own

    @property
    def host(self) -> str:
        return self.change.host

    @property
    def phase(self) -> int:
        """1: preparation (run, then the host is read again); 2: the devices made on what phase 1 left."""
        return 1 if self.change.phase == Phase.PREPARE else 2

    @property
    def text(self) -> str:
        return self.label or self.change.describe()

    @property
    def reload_pending(self) -> bool:
        """It takes effect only at the next load of the driver (a scheduler registry key)."""
        return self.change.reload_pending

    def sort_key(self) -> tuple[int, PciAddress, str]:
        return self.change.rank, self.gpu, self.change.target

    def to_dict(self) -> dict[str, Any]:
        item = self.change.item(WAIT)
        return {"host": self.host, "gpu": str(self.gpu), "phase": self.phase, "step": item.action,
                "target": item.target, "text": self.text, "pending_driver_reload": self.reload_pending}
