"""Doubles for the layout tests: a change kind that fails, to put last in a layout's plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import HostFacts, HostStep
from vgpuvirt.errors import NoCapacity
from vgpuvirt.host.base import Op
from vgpuvirt.services.mutation import Planned


@dataclass(frozen=True)
class FailingWrite(HostStep):
    """A test kind: the last step of phase 2 (rank 99), a write the kernel refuses (the file does not exist)."""

    kind: ClassVar[str] = "test-layout-failing-write"
    rank: ClassVar[int] = 99
    host: str
    vm: str

    @property
    def target(self) -> str:
        return "x"

    def describe(self) -> str:
        return "an injected failing step"

    def done_in(self, facts: HostFacts) -> bool:
        return False

    def item(self, wait_timeout: float) -> Planned:
        return Planned("test.fail", "x", (Op.write("/sys/bus/pci/devices/0000:3b:00.0/no_such_file", "1"),),
                       lambda r: NoCapacity(self.host, "x", "injected"))

    def undo_item(self, wait_timeout: float) -> None:
        return None

    def undone(self) -> str:
        return "nothing"
