"""libvirt storage XML: a directory pool and a qcow2 volume backed by a golden image (a linked clone).

Pure lxml, no I/O. The documents follow libvirt's ``storagepool.rng`` / ``storagevol.rng`` (validated by
:func:`vgpuvirt.xml.schema.validate` with those names); ``from_element`` reads what libvirt reports back
(``virsh pool-dumpxml`` / ``vol-dumpxml``), so a pool's directory and a volume's backing chain can be checked.
A linked clone is a qcow2 volume whose ``<backingStore>`` names the golden image: it holds only the blocks
the desktop writes, and the golden image is never written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.xml.document import parse_xml
from vgpuvirt.xml.element import Element, expect_tag, make, parse_int, sub
from vgpuvirt.xml.parts import host_path

# libvirt's volName/poolName: no '/' (a name is one path component), printable; we also refuse leading dots
# and spaces so a name never means "..", a hidden file or a shell surprise.
_NAME_RE = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9_.+:-]{0,199}\Z")
VOLUME_FORMATS = ("qcow2", "raw")
POOL_TYPES = ("dir",)


def check_name(what: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidSpec(what, name, "1-200 characters of A-Z a-z 0-9 _ . + : - (no '/', not starting with '.')")
    return name


@dataclass(frozen=True)
class StoragePool:
    """A libvirt storage pool; we build ``dir`` pools and read any type (``target`` is None where it has none)."""

    name: str
    target: str | None = None
    type: str = "dir"

    def __post_init__(self) -> None:
        check_name("storage pool name", self.name)
        if self.target is not None:
            host_path("storage pool directory", self.target)

    def to_element(self) -> Element:
        if self.type not in POOL_TYPES or self.target is None:
            raise InvalidSpec("storage pool", self, "a 'dir' pool with a target directory")
        el = make("pool", {"type": self.type})
        sub(el, "name", text=self.name)
        sub(sub(el, "target"), "path", text=self.target)
        return el

    def to_xml(self) -> str:
        from lxml import etree
        return etree.tostring(self.to_element(), encoding="unicode", pretty_print=True)

    @classmethod
    def from_element(cls, el: Element) -> StoragePool:
        expect_tag(el, "pool")
        return cls(name=el.findtext("name") or "", target=el.findtext("target/path") or None,
                   type=el.get("type", ""))

    @classmethod
    def from_xml(cls, xml: str | bytes) -> StoragePool:
        return cls.from_element(parse_xml(xml))


@dataclass(frozen=True)
class Volume:
    """A storage volume: its file format and, for a linked clone, the image it is backed by.

    ``capacity_bytes`` None: the backing image's size (libvirt allows leaving it out when there is a
    backing store). ``path`` is what libvirt reports (``<target><path>``); it is not part of a create.
    """

    name: str
    format: str = "qcow2"
    backing: str | None = None
    backing_format: str = "qcow2"
    capacity_bytes: int | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        check_name("volume name", self.name)
        for what, fmt in (("volume format", self.format), ("backing image format", self.backing_format)):
            if fmt not in VOLUME_FORMATS:
                raise InvalidSpec(what, fmt, " | ".join(VOLUME_FORMATS))
        if self.backing is not None:
            host_path("backing image", self.backing)
            if self.format != "qcow2":
                raise InvalidSpec("volume format", self.format, "qcow2 for a volume with a backing image")
        if self.capacity_bytes is not None and (not isinstance(self.capacity_bytes, int)
                                                or isinstance(self.capacity_bytes, bool) or self.capacity_bytes < 1):
            raise InvalidSpec("volume capacity", self.capacity_bytes, "a positive number of bytes")
        if self.backing is None and self.capacity_bytes is None:
            raise InvalidSpec("volume capacity", None, "a size in bytes (or a backing image to take it from)")

    def to_element(self) -> Element:
        el = make("volume", {"type": "file"})
        sub(el, "name", text=self.name)
        if self.capacity_bytes is not None:
            sub(el, "capacity", {"unit": "bytes"}, str(self.capacity_bytes))
        target = sub(el, "target")
        sub(target, "format", {"type": self.format})
        if self.backing is not None:
            back = sub(el, "backingStore")
            sub(back, "path", text=self.backing)
            sub(back, "format", {"type": self.backing_format})
        return el

    def to_xml(self) -> str:
        from lxml import etree
        return etree.tostring(self.to_element(), encoding="unicode", pretty_print=True)

    @classmethod
    def from_element(cls, el: Element) -> Volume:
        expect_tag(el, "volume")
        fmt = el.find("target/format")
        back = el.find("backingStore")
        cap = el.find("capacity")
        unit = (cap.get("unit", "bytes") if cap is not None else "bytes").lower()
        if unit not in ("b", "bytes"):
            raise XmlError(f"volume {el.findtext('name')!r}: capacity in {unit!r}; libvirt reports bytes")
        back_path = back.findtext("path") if back is not None else None
        back_fmt = back.find("format") if back is not None else None
        return cls(name=el.findtext("name") or "", format=fmt.get("type", "raw") if fmt is not None else "raw",
                   backing=back_path or None,
                   backing_format=back_fmt.get("type", "qcow2") if back_fmt is not None else "qcow2",
                   capacity_bytes=parse_int(cap.text, "volume capacity") if cap is not None and cap.text else None,
                   path=el.findtext("target/path") or None)

    @classmethod
    def from_xml(cls, xml: str | bytes) -> Volume:
        return cls.from_element(parse_xml(xml))


@dataclass(frozen=True)
class FirmwareCaps:
    """What ``virConnectGetDomainCapabilities`` says about firmware: the ``<os firmware=...>`` values it can
    autoselect (``efi``) and the loader files it knows (``/usr/share/OVMF/OVMF_CODE_4M.fd``)."""

    firmwares: frozenset[str]
    loaders: frozenset[str]
    #: the loader can be secure (``<enum name='secure'>`` holds ``yes``); None: not said
    secure_boot: bool | None = None
    #: TPM backends it can give (``emulator`` needs swtpm); None: not said (libvirt < 8.x)
    tpm_backends: frozenset[str] | None = None

    @classmethod
    def from_xml(cls, xml: str | bytes) -> FirmwareCaps:
        root = parse_xml(xml)
        if root.tag != "domainCapabilities":
            raise XmlError(f"domain capabilities: root element is <{root.tag}>")
        os_el = root.find("os")
        if os_el is None or os_el.get("supported") == "no":
            return cls(frozenset(), frozenset())
        fw = {v.text for v in os_el.iterfind("enum[@name='firmware']/value") if v.text}
        loaders = {v.text for v in os_el.iterfind("loader/value") if v.text}
        secure = os_el.find("loader/enum[@name='secure']")
        tpm = root.find("devices/tpm")
        backends = None
        if tpm is not None:
            backends = frozenset() if tpm.get("supported") == "no" else frozenset(
                v.text for v in tpm.iterfind("enum[@name='backendModel']/value") if v.text)
        return cls(frozenset(fw), frozenset(loaders),
                   None if secure is None else any(v.text == "yes" for v in secure.iterfind("value")), backends)


def disk_files(domain_xml: str | bytes) -> list[str]:
    """The file paths of a domain's disks (``<disk device='disk'>``; CD-ROMs and other devices are not)."""
    root = parse_xml(domain_xml)
    return [str(d.get("file")) for d in root.iterfind("devices/disk[@device='disk']/source") if d.get("file")]


def backing_chains(domain_xml: str | bytes) -> dict[str, list[str]]:
    """Each file disk of a (live) domain XML -> its chain as libvirt reports it: the disk's own file, then
    each ``<backingStore>`` below it (``{"vda": ["/pool/desk-001.qcow2", "/pool/golden.qcow2"]}``)."""
    out: dict[str, list[str]] = {}
    for disk in parse_xml(domain_xml).iterfind("devices/disk"):
        target = disk.find("target")
        chain: list[str] = []
        node: Element | None = disk
        while node is not None:
            src = node.find("source")
            if src is None or not src.get("file"):
                break
            chain.append(src.get("file", ""))
            node = node.find("backingStore")
        if target is not None and chain:
            out[target.get("dev", "")] = chain
    return out
