"""Which host devices a domain uses: mdev UUIDs and PCI addresses, read leniently.

The inventory, gc, SR-IOV and vendor-VF services join host devices with the domains that use them. A
domain is someone else's document: one malformed device must not hide the others, so each device is
read on its own and skipped when unreadable, and XML that does not parse gives ``error`` instead of
raising. The XML goes through the shared safe parser (:func:`vgpuvirt.xml.document.parse_xml`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.xml.document import parse_xml
from vgpuvirt.xml.element import pci_from_address


@dataclass(frozen=True)
class DomainRefs:
    mdevs: frozenset[MdevUuid] = field(default_factory=frozenset)
    pci: frozenset[PciAddress] = field(default_factory=frozenset)
    error: str | None = None


def domain_device_refs(xml: str | bytes) -> DomainRefs:
    """mdev UUIDs (``<hostdev type='mdev'>``) and PCI addresses (``<hostdev type='pci'>``,
    ``<interface type='hostdev'>``) in a domain's XML. Unparseable XML -> ``error`` set."""
    try:
        root = parse_xml(xml)
    except XmlError as exc:
        return DomainRefs(error=str(exc))
    mdevs: set[MdevUuid] = set()
    pci: set[PciAddress] = set()
    for addr in root.iterfind("devices/hostdev[@type='mdev']/source/address"):
        try:
            mdevs.add(MdevUuid.parse(addr.get("uuid", "")))
        except InvalidSpec:
            continue
    for addr in [*root.iterfind("devices/hostdev[@type='pci']/source/address"),
                 *root.iterfind("devices/interface[@type='hostdev']/source/address")]:
        try:
            pci.add(pci_from_address(addr, "hostdev source address"))
        except InvalidSpec:
            continue
    return DomainRefs(frozenset(mdevs), frozenset(pci))
