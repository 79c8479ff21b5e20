"""libvirt node-device XML (``virsh nodedev-dumpxml``): PCI GPUs, their mdev types, SR-IOV, mdev children.

Normalized when parsed: ``<bus>59</bus>`` (decimal) and ``bus='0x3b'`` (hex) both become PciAddress values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.xml.domain import parse_xml
from vgpuvirt.xml.element import Element, parse_int, pci_from_address


@dataclass(frozen=True)
class NodedevMdevType:
    id: MdevTypeId
    name: str | None
    device_api: str | None
    available_instances: int | None


@dataclass(frozen=True)
class NodeDevice:
    name: str
    path: str | None = None
    parent: str | None = None
    driver: str | None = None
    address: PciAddress | None = None
    pci_class: int | None = None
    vendor_id: int | None = None
    product_id: int | None = None
    numa_node: int | None = None
    iommu_group: int | None = None
    iommu_group_members: tuple[PciAddress, ...] = ()
    mdev_types: tuple[NodedevMdevType, ...] = ()
    max_vfs: int | None = None
    vfs: tuple[PciAddress, ...] = ()
    phys_function: PciAddress | None = None
    mdev_type: MdevTypeId | None = None
    mdev_uuid: MdevUuid | None = None
    mdev_parent: PciAddress | None = None
    capabilities: tuple[str, ...] = field(default=())

    @property
    def is_mdev(self) -> bool:
        return self.mdev_type is not None


def _hex(el: Element | None, attr: str | None = None) -> int | None:
    if el is None:
        return None
    v = el.get(attr) if attr else el.text
    return None if v is None else parse_int(v, "node device field")


def parse_nodedev(doc: str | bytes | Element) -> NodeDevice:
    """One ``<device>`` document."""
    el = parse_xml(doc) if isinstance(doc, (str, bytes)) else doc
    if el.tag != "device":
        raise XmlError(f"expected a node-device <device>, got <{el.tag}>")
    try:
        return _parse(el)
    except (InvalidSpec, ValueError) as exc:
        raise XmlError(f"node device {el.findtext('name')!r}: {exc}") from exc


def _parse(el: Element) -> NodeDevice:
    caps: list[str] = []
    kw: dict[str, object] = {"name": el.findtext("name") or "", "path": el.findtext("path"),
                             "parent": el.findtext("parent"), "driver": el.findtext("driver/name")}
    cap = el.find("capability")
    if cap is not None:
        ctype = cap.get("type", "")
        caps.append(ctype)
        if ctype == "pci":
            kw["address"] = PciAddress(*(int(cap.findtext(t) or "0") for t in ("domain", "bus", "slot", "function")))
            kw["pci_class"] = _hex(cap.find("class"))
            kw["vendor_id"] = _hex(cap.find("vendor"), "id")
            kw["product_id"] = _hex(cap.find("product"), "id")
            numa = cap.find("numa")
            kw["numa_node"] = None if numa is None else parse_int(numa.get("node"), "numa node")
            types: list[NodedevMdevType] = []
            for sub in cap.iterchildren("capability"):
                stype = sub.get("type", "")
                caps.append(stype)
                if stype == "mdev_types":
                    for t in sub.iterchildren("type"):
                        avail = t.findtext("availableInstances")
                        types.append(NodedevMdevType(MdevTypeId.parse(t.get("id", "")), t.findtext("name"),
                                                     t.findtext("deviceAPI"),
                                                     None if avail is None else int(avail)))
                elif stype == "virt_functions":
                    mc = sub.get("maxCount")
                    kw["max_vfs"] = None if mc is None else int(mc)
                    kw["vfs"] = tuple(pci_from_address(a, "VF address") for a in sub.iterchildren("address"))
                elif stype == "phys_function":
                    kw["phys_function"] = pci_from_address(sub.find("address"), "PF address")
            kw["mdev_types"] = tuple(types)
        elif ctype == "mdev":
            tid = cap.find("type")
            kw["mdev_type"] = None if tid is None else MdevTypeId.parse(tid.get("id", ""))
            u = cap.findtext("uuid")
            if u is None and kw["name"] and str(kw["name"]).startswith("mdev_"):
                # the name carries the UUID: mdev_<uuid with _>[_<parent>]
                parts = str(kw["name"])[5:].split("_")
                u = "-".join(parts[:5]) if len(parts) >= 5 else None
            kw["mdev_uuid"] = None if u is None else MdevUuid.parse(u)
            pa = cap.findtext("parent_addr")
            kw["mdev_parent"] = None if pa is None else PciAddress.parse(pa)
        group = cap.find("iommuGroup")
        if group is not None:
            kw["iommu_group"] = parse_int(group.get("number"), "IOMMU group")
            kw["iommu_group_members"] = tuple(pci_from_address(a, "IOMMU group member")
                                              for a in group.iterchildren("address"))
    kw["capabilities"] = tuple(caps)
    return NodeDevice(**kw)  # type: ignore[arg-type]


def parse_nodedevs(text: str | bytes) -> list[NodeDevice]:
    """Several ``<device>`` documents in one text (e.g. concatenated dumpxml output); comments ignored."""
    data = text.encode() if isinstance(text, str) else text
    if data.lstrip().startswith(b"<?xml"):
        data = data.split(b"?>", 1)[1]
    parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True, recover=False)
    try:
        root = etree.fromstring(b"<devices>" + data + b"</devices>", parser)
    except etree.XMLSyntaxError as exc:
        raise XmlError(f"node-device XML is not well-formed: {exc}") from exc
    return [parse_nodedev(el) for el in root.iterchildren("device")]
