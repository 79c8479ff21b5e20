"""libvirt node-device XML (``virsh nodedev-dumpxml``): PCI GPUs, their mdev types, SR-IOV, mdev children.

Normalized when parsed: ``<bus>59</bus>`` (decimal) and ``bus='0x3b'`` (hex) both become PciAddress values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lxml import etree

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.xml.domain import parse_xml
from vgpuvirt.xml.element import Element, parse_int, pci_from_address

_H = "[0-9a-fA-F]"
_MDEV_NAME_RE = re.compile(rf"mdev_({_H}{{8}}_{_H}{{4}}_{_H}{{4}}_{_H}{{4}}_{_H}{{12}})(?!{_H})")


@dataclass(frozen=True)
class NodedevMdevType:
    """One ``<type id=...>``. ``id`` is kept as libvirt wrote it: libvirt accepts any id (its own tests use
    ``foo1``), while a kernel's are ``<driver>-<name>``; :attr:`type_id` is the typed form when it is one."""

    id: str
    name: str | None
    device_api: str | None
    available_instances: int | None

    @property
    def type_id(self) -> MdevTypeId | None:
        return _typed(self.id)


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
    mdev_type: str | None = None             # as libvirt wrote it (any id, see NodedevMdevType)
    mdev_uuid: MdevUuid | None = None
    mdev_parent: PciAddress | None = None
    mdev_parent_addr: str | None = None      # as libvirt gives it: 0000:3b:00.0, or 0.0.0052 for a css parent
    ccw_address: str | None = None           # a css/ccw device's own cssid.ssid.devno (0.0.0052): what its
                                             # mdevs' parent_addr names
    capabilities: tuple[str, ...] = field(default=())


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


def _parse(el: Element, problems: list[str] | None = None) -> NodeDevice:
    """``problems`` collects what was left out (an mdev type that cannot be read); without it such a type
    is an error."""
    caps: list[str] = []
    strict = problems is None
    problems = [] if problems is None else problems
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
            for sub in cap.iterchildren("capability"):
                stype = sub.get("type", "")
                if stype == "virt_functions":
                    mc = sub.get("maxCount")
                    kw["max_vfs"] = None if mc is None else int(mc)
                    kw["vfs"] = tuple(pci_from_address(a, "VF address") for a in sub.iterchildren("address"))
                elif stype == "phys_function":
                    kw["phys_function"] = pci_from_address(sub.find("address"), "PF address")
        elif ctype in ("css", "ccw"):
            ids = [parse_int(cap.findtext(t), f"{ctype} {t}") for t in ("cssid", "ssid", "devno")]
            kw["ccw_address"] = f"{ids[0]:x}.{ids[1]:x}.{ids[2]:04x}"
        elif ctype == "mdev":
            tid = cap.find("type")
            kw["mdev_type"] = None if tid is None else _type_id(tid.get("id"))
            u = cap.findtext("uuid")
            if u is None:
                # the name carries the UUID: mdev_<uuid with _>[_<parent>] (or another suffix)
                m = _MDEV_NAME_RE.match(str(kw["name"] or ""))
                u = None if m is None else m[1].replace("_", "-")
            kw["mdev_uuid"] = None if u is None else MdevUuid.parse(u)
            pa = cap.findtext("parent_addr")
            kw["mdev_parent_addr"] = pa
            # a PCI parent (a vGPU's GPU); a channel-subsystem or AP parent (0.0.0052) has no PCI address
            kw["mdev_parent"] = _pci_or_none(pa)
        group = cap.find("iommuGroup")
        if group is not None:
            kw["iommu_group"] = parse_int(group.get("number"), "IOMMU group")
            kw["iommu_group_members"] = tuple(pci_from_address(a, "IOMMU group member")
                                              for a in group.iterchildren("address"))
    # mdev types are offered by PCI devices, s390 subchannels (css), the AP matrix, or a top-level
    # mdev_types capability (mtty, sample drivers): read them wherever they are
    types: list[NodedevMdevType] = []
    for top in el.iterchildren("capability"):
        nested = [c for c in top.iterchildren("capability")]
        for c in nested:
            if c is not None and c.get("type", "") not in caps:
                caps.append(c.get("type", ""))
        for holder in [top, *nested]:
            if holder.get("type") != "mdev_types":
                continue
            for t in holder.iterchildren("type"):
                try:
                    types.append(_mdev_type(t))
                except (InvalidSpec, ValueError) as exc:
                    problems.append(f"mdev type {t.get('id')!r}: {exc}")
    if strict and problems:
        raise InvalidSpec("mdev types", problems, "readable <type id=...> entries")
    kw["mdev_types"] = tuple(types)
    kw["capabilities"] = tuple(caps)
    return NodeDevice(**kw)  # type: ignore[arg-type]


def _mdev_type(t: Element) -> NodedevMdevType:
    avail = t.findtext("availableInstances")
    return NodedevMdevType(_type_id(t.get("id")), t.findtext("name"), t.findtext("deviceAPI"),
                           None if avail is None else int(avail))


_ANY_TYPE_ID = re.compile(r"[^\x00-\x20\x7f]{1,128}")


def _type_id(text: str | None) -> str:
    """An mdev type id as libvirt accepts it: any non-empty printable token."""
    if text is None or not _ANY_TYPE_ID.fullmatch(text.strip()):
        raise InvalidSpec("mdev type id", text, "a non-empty id without spaces or control characters")
    return text.strip()


def _typed(text: str) -> MdevTypeId | None:
    try:
        return MdevTypeId.parse(text)
    except InvalidSpec:
        return None


def _pci_or_none(text: str | None) -> PciAddress | None:
    if text is None:
        return None
    try:
        return PciAddress.parse(text)
    except InvalidSpec:
        return None


class NodeDevices(list[NodeDevice]):
    """The devices of a multi-device document, and ``errors``: one line per device (or mdev type) that could
    not be read, naming it. One odd device never costs the others."""

    def __init__(self, devices: list[NodeDevice] = (), errors: list[str] = ()) -> None:  # type: ignore[assignment]
        super().__init__(devices)
        self.errors: list[str] = list(errors)


def parse_nodedevs(text: str | bytes) -> NodeDevices:
    """Every node ``<device>`` in one text (concatenated dumpxml output, or a test-driver node file's
    ``<node>``); comments ignored. A device that cannot be read is left out and reported in
    ``.errors``; only text that is not well-formed XML raises."""
    data = text.encode() if isinstance(text, str) else text
    if data.lstrip().startswith(b"<?xml"):
        data = data.split(b"?>", 1)[1]
    parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True, recover=False)
    try:
        root = etree.fromstring(b"<devices>" + data + b"</devices>", parser)
    except etree.XMLSyntaxError as exc:
        raise XmlError(f"node-device XML is not well-formed: {exc}") from exc
    out = NodeDevices()
    # node devices stand at the top, or in a test-driver node file's <node> (beside domains, pools, networks,
    # whose own <device> elements are something else)
    found = [*root.iterchildren("device"), *(d for n in root.iterchildren("node") for d in n.iterchildren("device"))]
    for el in found:
        name = el.findtext("name") or "?"
        problems: list[str] = []
        try:
            out.append(_parse(el, problems))
        except (InvalidSpec, ValueError) as exc:
            out.errors.append(f"node device {name!r}: {exc}")
            continue
        out.errors.extend(f"node device {name!r}: {p} (left out)" for p in problems)
    return out
