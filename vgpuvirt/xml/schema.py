"""Validation against libvirt's own RelaxNG schema (``domain.rng``), compiled once per process."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from lxml import etree

from vgpuvirt.errors import MissingDependency, VgpuvirtError, XmlError
from vgpuvirt.xml.element import Element

DEFAULT_SCHEMA_DIR = Path("/usr/share/libvirt/schemas")


class SchemaMissing(MissingDependency):
    """libvirt's schema files are not installed on this machine."""

    def __init__(self, path: Path) -> None:
        self.module = "libvirt schemas"
        self.extra = ""
        self.schema_file = path
        msg = (f"libvirt's RelaxNG schema {path} is missing: install the package that ships "
               "/usr/share/libvirt/schemas (Debian/Ubuntu: libvirt0 or libvirt-dev; Fedora: libvirt-libs), "
               "or point VGPUVIRT_LIBVIRT_SCHEMAS at a copy")
        VgpuvirtError.__init__(self, msg)


def schema_path(name: str = "domain.rng") -> Path:
    return Path(os.environ.get("VGPUVIRT_LIBVIRT_SCHEMAS", str(DEFAULT_SCHEMA_DIR))) / name


@functools.lru_cache(maxsize=4)
def _compiled(path: Path) -> etree.RelaxNG:
    if not path.is_file():
        raise SchemaMissing(path)
    return etree.RelaxNG(etree.parse(str(path)))


def schema(name: str = "domain.rng") -> etree.RelaxNG:
    """The compiled schema (cached: compiling follows ~30 includes and takes ~10 ms)."""
    return _compiled(schema_path(name))


def validate(doc: str | bytes | Element | object, name: str = "domain.rng") -> None:
    """Raise :class:`XmlError` with lxml's messages if ``doc`` (text, element or ``Domain``) is invalid."""
    el = getattr(doc, "root", doc)
    if isinstance(el, (str, bytes)):
        from vgpuvirt.xml.domain import parse_xml
        el = parse_xml(el)
    if not isinstance(el, etree._Element):
        raise TypeError(f"cannot validate {type(doc).__name__}")
    rng = schema(name)
    if not rng.validate(el):
        lines = [f"line {e.line}: {e.message}" for e in rng.error_log]  # type: ignore[attr-defined]
        raise XmlError(f"{name} rejects the XML: " + "; ".join(lines[:5]), lines)
