"""The non-GPU pieces a template gets filled with: disk, graphics, TPM, evdev input, virtio NIC, CPU pinning."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MacAddress, format_cpulist, parse_cpulist
from vgpuvirt.xml.element import Element, expect_tag, make, parse_int, shape_of, sub
from vgpuvirt.xml.hostdev import check_alias

_TARGET_RE = re.compile(r"^(vd|sd|hd)[a-z]{1,3}\Z")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}\Z")
DISK_FORMATS = ("qcow2", "raw")
GRAPHICS_KINDS = ("spice", "vnc")


# Control characters (XML 1.0 cannot hold most of them; none belongs in a path libvirt opens) and lone
# surrogates (undecodable bytes from argv).
_UNFIT = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def host_path(what: str, path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or _UNFIT.search(path):
        raise InvalidSpec(what, path, "an absolute path without control characters")
    return path


@dataclass(frozen=True)
class Disk:
    """A virtio disk backed by a file: ``<disk type='file' device='disk'>``."""

    path: str
    format: str = "qcow2"
    target: str = "vda"

    def __post_init__(self) -> None:
        host_path("disk path", self.path)
        if self.format not in DISK_FORMATS:
            raise InvalidSpec("disk format", self.format, " | ".join(DISK_FORMATS))
        if not isinstance(self.target, str) or not _TARGET_RE.match(self.target):
            raise InvalidSpec("disk target", self.target, "a guest device name such as vda")

    def shape(self) -> tuple[object, ...]:
        return shape_of(self, ("path",))

    def stamp(self, el: Element) -> None:
        """Write this disk's path into ``el``, made by :meth:`to_element` for a disk of the same shape."""
        src = el.find("source")
        assert src is not None, "stamped onto an element of another shape"
        src.set("file", self.path)

    def to_element(self) -> Element:
        el = make("disk", {"type": "file", "device": "disk"})
        sub(el, "driver", {"name": "qemu", "type": self.format, "cache": "none", "discard": "unmap"})
        sub(el, "source", {"file": self.path})
        sub(el, "target", {"dev": self.target, "bus": "virtio"})
        return el

    @classmethod
    def from_element(cls, el: Element) -> Disk:
        expect_tag(el, "disk")
        src = el.find("source")
        drv = el.find("driver")
        tgt = el.find("target")
        return cls(path="" if src is None else src.get("file", ""),
                   format="qcow2" if drv is None else drv.get("type", "qcow2"),
                   target="vda" if tgt is None else tgt.get("dev", "vda"))


_CD_TARGET_RE = re.compile(r"^(sd|hd)[a-z]{1,3}$")
CDROM_BUSES = ("sata", "ide", "scsi")


@dataclass(frozen=True)
class CdRom:
    """A read-only CD-ROM backed by an ISO file: ``<disk type='file' device='cdrom'>`` with ``<readonly/>``
    (a cloud-init seed, a config drive). ``bus`` is ``sata`` on q35, ``ide`` on i440fx."""

    path: str
    target: str = "sdb"
    bus: str = "sata"

    def __post_init__(self) -> None:
        host_path("CD-ROM image", self.path)
        if self.bus not in CDROM_BUSES:
            raise InvalidSpec("CD-ROM bus", self.bus, " | ".join(CDROM_BUSES))
        if not isinstance(self.target, str) or not _CD_TARGET_RE.match(self.target):
            raise InvalidSpec("CD-ROM target", self.target, "a guest device name such as sdb or hdc")

    def to_element(self) -> Element:
        el = make("disk", {"type": "file", "device": "cdrom"})
        sub(el, "driver", {"name": "qemu", "type": "raw"})
        sub(el, "source", {"file": self.path})
        sub(el, "target", {"dev": self.target, "bus": self.bus})
        sub(el, "readonly")
        return el

    @classmethod
    def from_element(cls, el: Element) -> CdRom:
        expect_tag(el, "disk")
        if el.get("device") != "cdrom":
            raise InvalidSpec("disk device", el.get("device"), "cdrom")
        src = el.find("source")
        tgt = el.find("target")
        return cls(path="" if src is None else src.get("file", ""),
                   target="sdb" if tgt is None else tgt.get("dev", "sdb"),
                   bus="sata" if tgt is None else tgt.get("bus", "sata"))


@dataclass(frozen=True)
class Graphics:
    """An emulated display (SPICE or VNC) listening on an address; needed for mdev ``display='on'``."""

    kind: str = "spice"
    listen: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.kind not in GRAPHICS_KINDS:
            raise InvalidSpec("graphics type", self.kind, " | ".join(GRAPHICS_KINDS))
        if not isinstance(self.listen, str) or not re.fullmatch(r"[0-9a-fA-F.:]{2,45}", self.listen):
            raise InvalidSpec("graphics listen address", self.listen, "an IP address")

    def to_element(self) -> Element:
        el = make("graphics", {"type": self.kind, "autoport": "yes"})
        sub(el, "listen", {"type": "address", "address": self.listen})
        return el

    @classmethod
    def from_element(cls, el: Element) -> Graphics:
        expect_tag(el, "graphics")
        listen = el.find("listen")
        addr = el.get("listen") if listen is None else listen.get("address")
        return cls(kind=el.get("type", ""), listen=addr or "127.0.0.1")


@dataclass(frozen=True)
class Tpm:
    """A TPM 2.0 emulated by swtpm (Windows 11 needs it)."""

    model: str = "tpm-crb"

    def __post_init__(self) -> None:
        if self.model not in ("tpm-crb", "tpm-tis"):
            raise InvalidSpec("TPM model", self.model, "tpm-crb | tpm-tis")

    def to_element(self) -> Element:
        el = make("tpm", {"model": self.model})
        sub(el, "backend", {"type": "emulator", "version": "2.0"})
        return el

    @classmethod
    def from_element(cls, el: Element) -> Tpm:
        expect_tag(el, "tpm")
        return cls(model=el.get("model", "tpm-crb"))


@dataclass(frozen=True)
class EvdevInput:
    """A host input device passed through with evdev (low-latency keyboard/mouse for gaming)."""

    device: str
    grab_all: bool = True

    def __post_init__(self) -> None:
        host_path("evdev device", self.device)
        if not self.device.startswith("/dev/input/"):
            raise InvalidSpec("evdev device", self.device, "a path under /dev/input/")

    def to_element(self) -> Element:
        el = make("input", {"type": "evdev"})
        src = sub(el, "source", {"dev": self.device})
        if self.grab_all:
            src.set("grab", "all")
            src.set("repeat", "on")
        return el

    @classmethod
    def from_element(cls, el: Element) -> EvdevInput:
        expect_tag(el, "input")
        src = el.find("source")
        return cls(device="" if src is None else src.get("dev", ""),
                   grab_all=src is not None and src.get("grab") == "all")


@dataclass(frozen=True)
class VirtioNic:
    """An ordinary virtio NIC on a libvirt network (``kind='network'``), a bridge, or user-mode networking.

    ``teaming=True`` makes it the persistent member of a failover pair (``<teaming type='persistent'/>``):
    the guest's failover driver uses the SR-IOV VF whose ``teaming`` names this NIC's ``alias`` and falls
    back to this NIC while the VF is unplugged for a live migration (libvirt needs the alias for that).
    """

    kind: str = "network"
    source: str | None = "default"
    mac: MacAddress | None = None
    alias: str | None = None
    teaming: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("network", "bridge", "user"):
            raise InvalidSpec("NIC type", self.kind, "network | bridge | user")
        if self.kind == "user":
            object.__setattr__(self, "source", None)
        elif not isinstance(self.source, str) or not _NAME_RE.match(self.source):
            raise InvalidSpec(f"{self.kind} name", self.source, "a libvirt network or bridge name")
        if self.mac is not None:
            object.__setattr__(self, "mac", MacAddress.parse(self.mac))
        check_alias("NIC alias", self.alias)
        if not isinstance(self.teaming, bool):
            raise InvalidSpec("NIC teaming", self.teaming, "true or false")
        if self.teaming and self.alias is None:
            raise InvalidSpec("NIC teaming", self.teaming, "an alias for the VF's teaming to name")

    def to_element(self) -> Element:
        el = make("interface", {"type": self.kind})
        if self.mac is not None:
            sub(el, "mac", {"address": str(self.mac)})
        if self.source is not None:
            sub(el, "source", {self.kind: self.source})
        sub(el, "model", {"type": "virtio"})
        if self.teaming:
            sub(el, "teaming", {"type": "persistent"})
        if self.alias is not None:
            sub(el, "alias", {"name": self.alias})
        return el

    @classmethod
    def from_element(cls, el: Element) -> VirtioNic:
        expect_tag(el, "interface")
        kind = el.get("type", "")
        src = el.find("source")
        mac = el.find("mac")
        alias = el.find("alias")
        teaming = el.find("teaming")
        if teaming is not None and teaming.get("type") != "persistent":
            raise InvalidSpec("NIC teaming", teaming.get("type"), "persistent (transient is the VF's side)")
        return cls(kind=kind, source=None if src is None else src.get(kind),
                   mac=None if mac is None else MacAddress.parse(mac.get("address", "")),
                   alias=None if alias is None else alias.get("name"), teaming=teaming is not None)


@dataclass(frozen=True)
class CpuPinning:
    """vCPU *i* runs on host CPU ``vcpu_cpus[i]``; the emulator threads on ``emulator_cpus``."""

    vcpu_cpus: tuple[int, ...]
    emulator_cpus: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not isinstance(self.vcpu_cpus, list | tuple):
            raise InvalidSpec("vCPU pinning", self.vcpu_cpus, "a non-empty list of host CPU numbers")
        if not isinstance(self.emulator_cpus, set | frozenset | list | tuple) or any(
                not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in self.emulator_cpus):
            raise InvalidSpec("emulator pinning", self.emulator_cpus, "a set of host CPU numbers")
        cpus = tuple(self.vcpu_cpus)
        if not cpus or any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in cpus):
            raise InvalidSpec("vCPU pinning", self.vcpu_cpus, "a non-empty list of host CPU numbers")
        if len(set(cpus)) != len(cpus):
            raise InvalidSpec("vCPU pinning", self.vcpu_cpus, "each host CPU at most once")
        object.__setattr__(self, "vcpu_cpus", cpus)
        object.__setattr__(self, "emulator_cpus", frozenset(self.emulator_cpus))

    @classmethod
    def from_cpulist(cls, vcpus: str, emulator: str = "") -> CpuPinning:
        """``from_cpulist("2-5", emulator="0-1")``: vCPUs 0..3 on host CPUs 2..5 in order."""
        return cls(tuple(sorted(parse_cpulist(vcpus))), parse_cpulist(emulator))

    @property
    def all_cpus(self) -> frozenset[int]:
        return frozenset(self.vcpu_cpus) | self.emulator_cpus

    def to_element(self) -> Element:
        el = make("cputune")
        for i, cpu in enumerate(self.vcpu_cpus):
            sub(el, "vcpupin", {"vcpu": str(i), "cpuset": str(cpu)})
        if self.emulator_cpus:
            sub(el, "emulatorpin", {"cpuset": format_cpulist(self.emulator_cpus)})
        return el

    @classmethod
    def from_element(cls, el: Element) -> CpuPinning:
        expect_tag(el, "cputune")
        pins: dict[int, int] = {}
        for pin in el.iterchildren("vcpupin"):
            cpus = parse_cpulist(pin.get("cpuset", ""))
            if len(cpus) != 1:
                raise InvalidSpec("vcpupin cpuset", pin.get("cpuset"), "exactly one host CPU per vCPU")
            pins[parse_int(pin.get("vcpu"), "vcpupin vcpu")] = next(iter(cpus))
        if sorted(pins) != list(range(len(pins))):
            raise InvalidSpec("vcpupin", sorted(pins), "one entry per vCPU 0..n-1")
        emu = el.find("emulatorpin")
        return cls(tuple(pins[i] for i in range(len(pins))),
                   parse_cpulist(emu.get("cpuset", "")) if emu is not None else frozenset())
