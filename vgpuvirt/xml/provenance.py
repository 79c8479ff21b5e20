"""vgpuvirt's provenance metadata in a domain: which host made the VM and which GPU devices it made for it.

::

    <metadata>
      <vgpuvirt:provision xmlns:vgpuvirt="https://vgpuvirt.dev/xmlns/provision/1" host="node1">
        <vgpuvirt:gpu kind="mdev" uuid="..." parent="0000:3b:00.0" type="nvidia-558"/>
      </vgpuvirt:provision>
    </metadata>

A domain without it was not made by vgpuvirt and is never touched. This module is the only place
that reads or writes the element; each ``<gpu>`` entry is an attribute map whose meaning belongs to the
provisioning step that made the device (``vgpuvirt.provision.steps``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from lxml import etree

from vgpuvirt.errors import XmlError
from vgpuvirt.xml.domain import DOMAIN_ORDER, Domain, insert_ordered, parse_xml
from vgpuvirt.xml.element import Element, make

NAMESPACE = "https://vgpuvirt.dev/xmlns/provision/1"
TAG = f"{{{NAMESPACE}}}provision"
GPU_TAG = f"{{{NAMESPACE}}}gpu"


@dataclass(frozen=True)
class Provenance:
    host: str | None
    gpus: tuple[Mapping[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, host: str, gpus: Sequence[Mapping[str, str]]) -> Provenance:
        return cls(host, tuple(MappingProxyType(dict(g)) for g in gpus))

    def to_element(self) -> Element:
        el = etree.Element(TAG, nsmap={"vgpuvirt": NAMESPACE})
        if self.host is not None:
            el.set("host", self.host)
        for g in self.gpus:
            etree.SubElement(el, GPU_TAG, attrib=dict(g))
        return el

    def metadata_xml(self) -> str:
        """The element for ``virDomainSetMetadata`` (key ``vgpuvirt``, uri :data:`NAMESPACE`): without the
        namespace, which libvirt puts on it and its children itself (it refuses a prefix already declared)."""
        el = etree.Element("provision")
        if self.host is not None:
            el.set("host", self.host)
        for g in self.gpus:
            etree.SubElement(el, "gpu", attrib=dict(g))
        return etree.tostring(el, encoding="unicode")

    @classmethod
    def from_element(cls, el: Element) -> Provenance:
        if el.tag != TAG:
            raise XmlError(f"expected <vgpuvirt:provision>, got <{el.tag}>")
        gpus = [dict(g.attrib) for g in el if g.tag == GPU_TAG]
        return cls(el.get("host"), tuple(MappingProxyType({str(k): str(v) for k, v in g.items()}) for g in gpus))

    @classmethod
    def of_domain(cls, domain: Domain) -> Provenance | None:
        """The domain's provenance, or None when vgpuvirt did not make it."""
        el = domain.root.find(f"metadata/{TAG}")
        return None if el is None else cls.from_element(el)

    @classmethod
    def read(cls, xml: str | bytes) -> Provenance | None:
        """From domain XML text (parsed with the shared safe parser); None when foreign."""
        return cls.of_domain(Domain(parse_xml(xml)))

    def attach(self, domain: Domain) -> None:
        """Put (or replace) this provenance in the domain's ``<metadata>``, where libvirt keeps it."""
        md = domain.root.find("metadata")
        if md is None:
            md = insert_ordered(domain.root, make("metadata"), DOMAIN_ORDER)
        for old in md.findall(TAG):
            md.remove(old)
        md.append(self.to_element())

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "gpus": [dict(g) for g in self.gpus]}
