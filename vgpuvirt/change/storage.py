"""The storage step kind: a VM's linked-clone disk, created through libvirt's storage API before the
domain that uses it is defined, and deleted again by a rollback (see :mod:`.step` for the step contract)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from vgpuvirt.change.step import DomainStep, HostFacts, Phase
from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.xml.storage import Volume

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.libvirt_conn import LibvirtConnection


@dataclass(frozen=True)
class CreateVolume(DomainStep):
    """Create the VM's qcow2 overlay of the golden image in a storage pool (a linked clone)."""

    kind: ClassVar[str] = "create-volume"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 1                 # with the defines, and before its own (plan order)
    host: str
    vm: str
    pool: str
    volume: Volume

    @property
    def target(self) -> str:
        return f"{self.pool}/{self.volume.name}"

    def describe(self) -> str:
        return f"create disk {self.target}: qcow2 linked clone of {self.volume.backing} (for {self.vm})"

    def kept(self) -> str:
        return f"disk {self.target}"

    def details(self) -> dict[str, str]:
        return {"pool": self.pool, "volume": self.volume.name, "backing": str(self.volume.backing)}

    def done_in(self, facts: HostFacts) -> bool:
        # The name is derived from the VM's: a volume of that name was made for this VM (by a cut run).
        return self.volume.name in (facts.volumes(self.pool) or ())

    def run(self, conn: LibvirtConnection) -> None:
        conn.create_volume(self.pool, self.volume)

    def undo(self, conn: LibvirtConnection) -> str:
        gone = conn.delete_volume(self.pool, self.volume.name)
        return f"deleted disk {self.target}" if gone else f"disk {self.target} was already gone"


@dataclass(frozen=True)
class DeleteVolume(DomainStep):
    """Delete a volume of a storage pool (teardown: a VM's license seed). Its data cannot be made again: the
    undo says so (a rollback reports it as not undone)."""

    kind: ClassVar[str] = "delete-volume"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 10
    host: str
    vm: str
    pool: str
    name: str
    #: filled by run(): whether the volume was there to delete
    found: list[bool] = field(default_factory=list, repr=False, compare=False)

    @property
    def target(self) -> str:
        return f"{self.pool}/{self.name}"

    def describe(self) -> str:
        return f"delete volume {self.target} (of {self.vm})"

    def done_in(self, facts: HostFacts) -> bool:
        vols = facts.volumes(self.pool)
        return vols is not None and self.name not in vols

    def run(self, conn: LibvirtConnection) -> None:
        self.found[:] = [conn.delete_volume(self.pool, self.name)]

    def undo(self, conn: LibvirtConnection) -> str:
        raise VgpuvirtError(f"volume {self.target} was deleted: its data cannot be made again")
