"""libvirt domains: define, start."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from vgpuvirt.change.step import DomainStep, HostFacts, Phase
from vgpuvirt.errors import XmlError
from vgpuvirt.xml.domain import Domain, parse_xml

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

    @property
    def target(self) -> str:
        return self.vm

    def describe(self) -> str:
        return f"define domain {self.vm}"

    def kept(self) -> str:
        return f"domain {self.vm}"

    def done_in(self, facts: HostFacts) -> bool:
        return facts.domain_xml(self.vm) is not None

    def run(self, conn: LibvirtConnection) -> None:
        conn.define(self.xml)

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

    @property
    def target(self) -> str:
        return self.vm

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
