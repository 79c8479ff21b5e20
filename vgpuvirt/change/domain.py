"""libvirt domains: define, start, destroy, undefine; hot-plug a device in or out; record what vgpuvirt made in
the domain's metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from vgpuvirt.change.step import DomainStep, HostFacts, Phase
from vgpuvirt.errors import XmlError
from vgpuvirt.xml.domain import Domain, parse_xml
from vgpuvirt.xml.hostdev import GpuDevice, MdevHostdev
from vgpuvirt.xml.provenance import NAMESPACE, Provenance
from vgpuvirt.xml.refs import domain_device_refs

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.libvirt_conn import LibvirtConnection

@dataclass(frozen=True)
class DefineDomain(DomainStep):
    """Define the VM's domain from the XML the plan built (provenance metadata included)."""

    kind: ClassVar[str] = "define"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 1
    host: str
    vm: str
    xml: str = field(repr=False, compare=False)

    def describe(self) -> str:
        return f"define domain {self.vm}"

    def kept(self) -> str:
        return f"domain {self.vm}"

    def done_in(self, facts: HostFacts) -> bool:
        return facts.domain_xml(self.vm) is not None

    def run(self, conn: LibvirtConnection) -> None:
        conn.define(self.xml, name=self.vm)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.undefine(self.vm)
        return f"undefined domain {self.vm}"


@dataclass(frozen=True)
class StartDomain(DomainStep):
    kind: ClassVar[str] = "start"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 2
    host: str
    vm: str

    def describe(self) -> str:
        return f"start domain {self.vm}"

    def kept(self) -> None:
        return None          # a running domain is already listed by its kept define

    def done_in(self, facts: HostFacts) -> bool:
        xml = facts.domain_xml(self.vm)
        if xml is None:
            return False
        try:
            return Domain(parse_xml(xml)).running
        except XmlError:
            return False

    def run(self, conn: LibvirtConnection) -> None:
        conn.start(self.vm)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.destroy(self.vm)
        return f"destroyed domain {self.vm}"


def _holds(xml: str | None, device: GpuDevice) -> bool:
    if xml is None:
        return False
    refs = domain_device_refs(xml)
    return device.uuid in refs.mdevs if isinstance(device, MdevHostdev) else device.address in refs.pci


@dataclass(frozen=True)
class AttachDevice(DomainStep):
    """Hot-plug a device into an existing domain, live and/or into its persistent definition (undo: detach it)."""

    kind: ClassVar[str] = "attach-device"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 3
    host: str
    vm: str
    device: GpuDevice
    live: bool | None = None                # None: live when the domain runs
    config: bool = True

    @property
    def target(self) -> str:
        return self.device.label()

    def describe(self) -> str:
        return f"attach {self.device.label()} to {self.vm}"

    def done_in(self, facts: HostFacts) -> bool:
        return _holds(facts.domain_xml(self.vm), self.device)

    def run(self, conn: LibvirtConnection) -> None:
        conn.attach(self.vm, self.device, live=self.live, config=self.config)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.detach(self.vm, self.device, live=self.live, config=self.config)
        return f"detached {self.device.label()} from {self.vm}"


@dataclass(frozen=True)
class DetachDevice(DomainStep):
    """Take a device out of a domain, live and/or from its persistent definition (undo: attach it again)."""

    kind: ClassVar[str] = "detach-device"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 0                 # before the removal of what the device was
    host: str
    vm: str
    device: GpuDevice
    live: bool | None = None
    config: bool = True

    @property
    def target(self) -> str:
        return self.device.label()

    def describe(self) -> str:
        return f"detach {self.device.label()} from {self.vm}"

    def done_in(self, facts: HostFacts) -> bool:
        return not _holds(facts.domain_xml(self.vm), self.device)

    def run(self, conn: LibvirtConnection) -> None:
        conn.detach(self.vm, self.device, live=self.live, config=self.config)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.attach(self.vm, self.device, live=self.live, config=self.config)
        return f"attached {self.device.label()} to {self.vm} again"


@dataclass(frozen=True)
class SetProvenance(DomainStep):
    """Replace a domain's provenance metadata (the devices vgpuvirt made for it); undo: put the old one back."""

    kind: ClassVar[str] = "set-provenance"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 4
    host: str
    vm: str
    new: Provenance
    old: Provenance
    live: bool | None = None
    config: bool = True

    def describe(self) -> str:
        return f"record {len(self.new.gpus)} device(s) in {self.vm}'s metadata (was {len(self.old.gpus)})"

    def done_in(self, facts: HostFacts) -> bool:
        xml = facts.domain_xml(self.vm)
        return xml is not None and Provenance.read(xml) == self.new

    def _write(self, conn: LibvirtConnection, prov: Provenance) -> None:
        conn.set_metadata(self.vm, prov.metadata_xml(), "vgpuvirt", NAMESPACE, live=self.live, config=self.config)

    def run(self, conn: LibvirtConnection) -> None:
        self._write(conn, self.new)

    def undo(self, conn: LibvirtConnection) -> str:
        self._write(conn, self.old)
        return f"put back {self.vm}'s metadata ({len(self.old.gpus)} device(s))"


@dataclass(frozen=True)
class DestroyDomain(DomainStep):
    """Power a domain off at once (teardown: a running VM holds its vGPUs); undo: start it again."""

    kind: ClassVar[str] = "destroy"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 0
    host: str
    vm: str

    def describe(self) -> str:
        return f"destroy domain {self.vm}"

    def done_in(self, facts: HostFacts) -> bool:
        return not StartDomain(self.host, self.vm).done_in(facts)

    def run(self, conn: LibvirtConnection) -> None:
        conn.destroy(self.vm)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.start(self.vm)
        return f"started domain {self.vm} again"


@dataclass(frozen=True)
class UndefineDomain(DomainStep):
    """Remove a domain's definition (its disk volumes too with ``remove_storage``); undo: define it again from
    the XML it had (deleted disks are not made again)."""

    kind: ClassVar[str] = "undefine"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 9
    host: str
    vm: str
    xml: str = field(repr=False, compare=False)
    remove_storage: bool = False
    #: filled by run(): the disk paths libvirt deleted with the domain
    deleted: list[str] = field(default_factory=list, repr=False, compare=False)

    def describe(self) -> str:
        return f"undefine domain {self.vm}" + (" with its disk volumes" if self.remove_storage else "")

    def done_in(self, facts: HostFacts) -> bool:
        return facts.domain_xml(self.vm) is None

    def run(self, conn: LibvirtConnection) -> None:
        self.deleted[:] = conn.undefine(self.vm, remove_storage=self.remove_storage)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.define(self.xml, name=self.vm)
        return f"defined domain {self.vm} again"
