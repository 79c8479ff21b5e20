"""The one door for domain XML: the safe parser and libvirt's element order.

:func:`parse_xml` is the only way domain XML is parsed in this package (no entities, no network).
:func:`insert_ordered` puts a new element where libvirt itself writes it, so output is stable.
The tree itself is edited by :class:`~vgpuvirt.xml.domain.Domain`.
"""

from __future__ import annotations

import threading

from lxml import etree

from vgpuvirt.errors import XmlError
from vgpuvirt.xml.element import Element

# The order libvirt formats a domain in; we insert new elements at their place in it.
DOMAIN_ORDER = ("name", "uuid", "genid", "title", "description", "metadata", "maxMemory", "memory",
                "currentMemory", "blkiotune", "memtune", "memoryBacking", "vcpu", "vcpus", "iothreads",
                "iothreadids", "cputune", "numatune", "resource", "sysinfo", "bootloader", "bootloader_args",
                "os", "idmap", "features", "cpu", "clock", "on_poweroff", "on_reboot", "on_crash", "pm", "perf",
                "devices", "seclabel", "keywrap", "launchSecurity")
DEVICE_ORDER = ("emulator", "disk", "controller", "lease", "filesystem", "interface", "smartcard", "serial",
                "parallel", "console", "channel", "input", "tpm", "graphics", "sound", "audio", "video", "hostdev",
                "redirdev", "redirfilter", "hub", "watchdog", "memballoon", "rng", "panic", "shmem", "memory",
                "iommu", "vsock", "crypto", "pstore")

# One parser per thread: the plan of several hosts parses each host's domains in its own thread, and one
# parser shared by those threads corrupted the heap ("double free or corruption", one `plan` in ten under load).
_PARSERS = threading.local()


def _parser() -> etree.XMLParser:
    parser: etree.XMLParser | None = getattr(_PARSERS, "parser", None)
    if parser is None:
        parser = _PARSERS.parser = etree.XMLParser(remove_blank_text=True, resolve_entities=False, no_network=True)
    return parser

_RANKS: dict[tuple[str, ...], dict[str, int]] = {o: {t: i for i, t in enumerate(o)}
                                                 for o in (DOMAIN_ORDER, DEVICE_ORDER)}


def insert_ordered(parent: Element, child: Element, order: tuple[str, ...]) -> Element:
    """Insert ``child`` after the last sibling that libvirt writes before (or with) it."""
    ranks = _RANKS.get(order) or {t: i for i, t in enumerate(order)}
    last = len(order)
    r = ranks.get(child.tag, last) if isinstance(child.tag, str) else last
    # from the end: the place is after the last sibling ranked at or before it (a device list is mostly
    # added to at its end, so the scan stops at once instead of reading every device)
    pos = len(parent)
    for existing in reversed(parent):
        tag = existing.tag
        if isinstance(tag, str) and ranks.get(tag, last) <= r:
            break
        pos -= 1
    parent.insert(pos, child)
    return child

def parse_xml(text: str | bytes) -> Element:
    """Parse XML text safely (no entities, no network); a syntax error becomes an XmlError."""
    try:
        data = text.encode() if isinstance(text, str) else text
        return etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise XmlError(f"not well-formed XML: {exc}") from exc
