"""Small helpers shared by the element classes: building children, reading on/off flags, guest addresses.

Every class in this package is a frozen dataclass with ``to_element()`` and ``from_element()``; values are
normalized when parsed (``0x3b`` and ``59`` both become the integer 59), so two parses compare equal.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypeVar

from lxml import etree

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress

Element = etree._Element

T = TypeVar("T", bound="XmlElement")


class XmlElement(Protocol):
    def to_element(self) -> Element: ...


def sub(parent: Element, tag: str, attrs: dict[str, str] | None = None, text: str | None = None) -> Element:
    """Append ``<tag attrs>text</tag>``; attributes keep the order given (our fixed output order)."""
    el = etree.SubElement(parent, tag)
    _fill(el, attrs, text)
    return el


def _fill(el: Element, attrs: dict[str, str] | None, text: str | None) -> None:
    # lxml refuses what XML 1.0 cannot hold (control characters, NUL, lone surrogates) with a bare
    # ValueError; the builders validate their values first, this is the last line for anything they missed.
    what = ""
    try:
        for what, v in (attrs or {}).items():
            el.set(what, v)
        if text is not None:
            what = "text"
            el.text = text
    except ValueError as exc:
        value = (attrs or {}).get(what, text)
        raise InvalidSpec(f"<{el.tag}> {what}", value, "XML text: no control characters") from exc


def make(tag: str, attrs: dict[str, str] | None = None) -> Element:
    el = etree.Element(tag)
    _fill(el, attrs, None)
    return el


def shape_of(device: Any, identity: tuple[str, ...]) -> tuple[object, ...]:
    """Every field of ``device`` but those that name the host device (``identity``: of these only whether
    each is set, which decides whether its element exists). Two devices of one shape make the same element
    but for what their ``stamp`` writes: a build makes the element once per shape and stamps each VM's."""
    cls = type(device)
    getters = _SHAPE_GETTERS.get(cls)
    if getters is None:
        # every field is read: a field added to a device class later is part of its shape without a word here.
        # (One name more than needed: attrgetter of a single name returns the value, not a 1-tuple.)
        rest = [f.name for f in fields(cls) if f.name not in identity]
        getters = _SHAPE_GETTERS[cls] = (operator.attrgetter(*rest, rest[0]),
                                         operator.attrgetter(*identity, identity[0]))
    rest_of, identity_of = getters
    return (cls, rest_of(device), *(v is None for v in identity_of(device)))


_SHAPE_GETTERS: dict[type, tuple[Any, Any]] = {}


def onoff(flag: bool) -> str:
    return "on" if flag else "off"


def yesno(flag: bool) -> str:
    return "yes" if flag else "no"


def parse_flag(value: str | None, what: str, default: bool = False) -> bool:
    """libvirt's tri-spelled booleans: on/off, yes/no."""
    if value is None:
        return default
    v = value.strip().lower()
    if v in ("on", "yes"):
        return True
    if v in ("off", "no"):
        return False
    raise InvalidSpec(what, value, "on/off or yes/no")


def parse_int(value: str | None, what: str) -> int:
    if value is None:
        raise InvalidSpec(what, value, "an integer")
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise InvalidSpec(what, value, "an integer") from None


def expect_tag(el: Element, tag: str, type_: str | None = None, what: str | None = None) -> None:
    """``el`` is a ``<tag>`` (and, with ``type_``, has ``type='type_'``; ``what`` names that attribute in the error)."""
    if el.tag != tag:
        raise InvalidSpec("XML element", el.tag, f"<{tag}>")
    if type_ is not None and el.get("type") != type_:
        raise InvalidSpec(what or f"{tag} type", el.get("type"), type_)


def pci_from_address(el: Element | None, what: str) -> PciAddress:
    """A PCI address from an ``<address domain= bus= slot= function=>`` element (hex or decimal)."""
    if el is None:
        raise InvalidSpec(what, None, "an <address domain= bus= slot= function=> element")
    return PciAddress.from_libvirt(el.get("domain", "0"), el.get("bus", "0"), el.get("slot", "0"),
                                   el.get("function", "0"))


@dataclass(frozen=True)
class GuestAddress:
    """Where a device appears in the guest: ``<address type='pci' ... [multifunction='on']/>``."""

    pci: PciAddress
    multifunction: bool = False

    def to_element(self) -> Element:
        el = make("address", {"type": "pci", **self.pci.libvirt_attrs()})
        if self.multifunction:
            el.set("multifunction", "on")
        return el

    @classmethod
    def from_element(cls, el: Element) -> GuestAddress:
        expect_tag(el, "address", "pci", "guest address type")
        return cls(pci_from_address(el, "guest PCI address"),
                   multifunction=parse_flag(el.get("multifunction"), "multifunction"))

    @classmethod
    def parse(cls, text: str | PciAddress, multifunction: bool = False) -> GuestAddress:
        return cls(PciAddress.parse(text), multifunction)


def guest_address_of(el: Element) -> GuestAddress | None:
    """The device's own guest ``<address type='pci'>`` (a direct child), if any."""
    for child in el.iterchildren("address"):
        if child.get("type") == "pci":
            return GuestAddress.from_element(child)
    return None


def source_key_of(el: Element) -> str | None:
    """``mdev:<uuid>`` or ``pci:<address>`` of a hostdev/hostdev-interface element, read without full parsing."""
    # only PCI and mdev sources: a USB hostdev's <address bus= device=> is no PCI address
    if el.tag == "hostdev" and el.get("type") not in ("pci", "mdev"):
        return None
    a = el.find("source/address")
    if a is None or (el.tag == "interface" and a.get("type", "pci") != "pci"):
        return None
    uuid = a.get("uuid")
    if uuid is not None:
        return f"mdev:{uuid.lower()}"
    bus = a.get("bus")
    if bus is None:
        return None
    return _pci_key(a.get("domain", "0"), bus, a.get("slot", "0"), a.get("function", "0"))


@functools.lru_cache(maxsize=4096)
def _pci_key(domain: str, bus: str, slot: str, function: str) -> str | None:
    # the same host devices' address strings come back in every domain a fleet's plan builds and lints
    try:
        return "pci:" + str(PciAddress.from_libvirt(domain, bus, slot, function))
    except InvalidSpec:
        return None


def boot_order_of(el: Element) -> int | None:
    boot = el.find("boot")
    return None if boot is None else parse_int(boot.get("order"), "boot order")


def check_boot_order(value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidSpec("boot order", value, "a positive integer")


def describe(obj: Any) -> str:
    """Short device label used in lint messages and errors."""
    label = getattr(obj, "label", None)
    return str(label() if callable(label) else obj)
