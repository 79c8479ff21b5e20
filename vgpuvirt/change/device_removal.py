"""Remove a device vgpuvirt made (an mdev, a VF's vGPU type): the undo of the :class:`DeviceStep` that made it,
run forward, with that step itself as its undo (the device is made again).

One kind for every device kind: what a removal does and how it is undone are the making step's own
``undo_item`` and ``item``, so a new device kind is removable the day it is defined. (A colleague's
RemoveMdev / ClearVfType classes may replace this one; the contract is the same.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import DeviceStep, HostFacts, HostStep, Phase
from vgpuvirt.host.base import Snapshot
from vgpuvirt.services.mutation import Planned


@dataclass(frozen=True)
class RemoveDevice(HostStep):
    """Remove the device ``made`` made. ``remake``: the rollback can make it again (False when what made it is
    not known in full: an mdev found by its name-derived UUID alone, its parent and type unknown)."""

    kind: ClassVar[str] = "remove-device"
    phase: ClassVar[Phase] = Phase.DEVICES
    rank: ClassVar[int] = 10                # removals before what they would block
    host: str
    vm: str
    made: DeviceStep
    remake: bool = True

    @property
    def target(self) -> str:
        return self.made.target

    def describe(self) -> str:
        return f"remove {self.made.target}, made by vgpuvirt for {self.vm}"

    def done_in(self, facts: HostFacts) -> bool:
        return not self.made.done_in(facts)

    def item(self, wait_timeout: float) -> Planned:
        return self.made.undo_item(wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return self.made.item(wait_timeout) if self.remake else None

    def state_path(self) -> str:
        return self.made.state_path()

    def happened(self, snap: Snapshot) -> bool:
        return not self.made.happened(snap)

    def removed(self) -> str:
        """What the removal did, in the words the made step's undo uses ("removed vGPU ...", "reset VF ...")."""
        return self.made.undone()

    def undone(self) -> str:
        return f"made again: {self.made.describe()}"
