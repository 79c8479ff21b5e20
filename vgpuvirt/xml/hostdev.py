"""The devices that carry a GPU (or a NIC VF) into a guest: mdev vGPUs, PCI hostdevs, hostdev interfaces.

No policy here: which device, which type and whether it is managed are the caller's decisions
(Nova's config.py rule). Output order of attributes and children is fixed, so builds are byte-stable.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MacAddress, MdevUuid, PciAddress
from vgpuvirt.xml.element import (
    Element,
    GuestAddress,
    boot_order_of,
    check_boot_order,
    expect_tag,
    guest_address_of,
    make,
    onoff,
    parse_flag,
    parse_int,
    pci_from_address,
    sub,
    yesno,
)

MDEV_MODELS = ("vfio-pci", "vfio-ccw", "vfio-ap")


@dataclass(frozen=True)
class MdevHostdev:
    """``<hostdev mode='subsystem' type='mdev' model='vfio-pci'>``: one mediated vGPU instance.

    ``display`` exposes the vGPU's framebuffer to a libvirt graphics device; ``ramfb`` adds a boot display
    (firmware/early boot). libvirt allows ramfb on one vGPU per domain and needs display for it.
    """

    uuid: MdevUuid
    display: bool = False
    ramfb: bool = False
    guest_address: GuestAddress | None = None
    boot_order: int | None = None
    model: str = "vfio-pci"

    def __post_init__(self) -> None:
        object.__setattr__(self, "uuid", MdevUuid.parse(self.uuid))
        if self.model not in MDEV_MODELS:
            raise InvalidSpec("mdev model", self.model, " | ".join(MDEV_MODELS))
        check_boot_order(self.boot_order)

    def label(self) -> str:
        return f"mdev {self.uuid}"

    @property
    def source_key(self) -> str:
        return f"mdev:{self.uuid}"

    def to_element(self) -> Element:
        el = make("hostdev", {"mode": "subsystem", "type": "mdev", "managed": "no", "model": self.model,
                              "display": onoff(self.display)})
        if self.ramfb:
            el.set("ramfb", "on")
        src = sub(el, "source")
        sub(src, "address", {"uuid": str(self.uuid)})
        if self.boot_order is not None:
            sub(el, "boot", {"order": str(self.boot_order)})
        if self.guest_address is not None:
            el.append(self.guest_address.to_element())
        return el

    @classmethod
    def from_element(cls, el: Element) -> MdevHostdev:
        expect_tag(el, "hostdev", "mdev")
        addr = el.find("source/address")
        if addr is None or addr.get("uuid") is None:
            raise InvalidSpec("mdev hostdev", "no <source><address uuid=...>", "a source UUID")
        return cls(MdevUuid.parse(addr.get("uuid", "")),
                   display=parse_flag(el.get("display"), "hostdev display"),
                   ramfb=parse_flag(el.get("ramfb"), "hostdev ramfb"),
                   guest_address=guest_address_of(el), boot_order=boot_order_of(el),
                   model=el.get("model", "vfio-pci"))


def _check_rom_file(path: str | None) -> None:
    if path is not None and (not isinstance(path, str) or not path.startswith("/") or "\0" in path
                             or "\n" in path):
        raise InvalidSpec("ROM file", path, "an absolute path on the host")


@dataclass(frozen=True)
class PciHostdev:
    """``<hostdev mode='subsystem' type='pci'>``: a whole GPU, one of its functions, or a VF.

    ``managed=True`` lets libvirt bind vfio-pci at start and give the device back at stop; an NVIDIA
    vGPU 17+ VF must stay on ``nvidia`` (vendor-specific VFIO), hence :meth:`vgpu_vf` (``managed=False``).
    """

    address: PciAddress
    managed: bool = True
    rom_bar: bool | None = None
    rom_file: str | None = None
    guest_address: GuestAddress | None = None
    boot_order: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", PciAddress.parse(self.address))
        _check_rom_file(self.rom_file)
        check_boot_order(self.boot_order)

    @classmethod
    def vgpu_vf(cls, address: PciAddress | str, *, guest_address: GuestAddress | None = None) -> PciHostdev:
        """An NVIDIA vGPU 17+ VF whose ``nvidia/current_vgpu_type`` is already set."""
        return cls(PciAddress.parse(address), managed=False, guest_address=guest_address)

    def label(self) -> str:
        return f"PCI hostdev {self.address}"

    @property
    def source_key(self) -> str:
        return f"pci:{self.address}"

    def to_element(self) -> Element:
        el = make("hostdev", {"mode": "subsystem", "type": "pci", "managed": yesno(self.managed)})
        sub(el, "driver", {"name": "vfio"})
        src = sub(el, "source")
        sub(src, "address", self.address.libvirt_attrs())
        if self.boot_order is not None:
            sub(el, "boot", {"order": str(self.boot_order)})
        if self.rom_bar is not None or self.rom_file is not None:
            rom = sub(el, "rom")
            if self.rom_bar is not None:
                rom.set("bar", onoff(self.rom_bar))
            if self.rom_file is not None:
                rom.set("file", self.rom_file)
        if self.guest_address is not None:
            el.append(self.guest_address.to_element())
        return el

    @classmethod
    def from_element(cls, el: Element) -> PciHostdev:
        expect_tag(el, "hostdev", "pci")
        rom = el.find("rom")
        return cls(pci_from_address(el.find("source/address"), "hostdev source address"),
                   managed=parse_flag(el.get("managed"), "hostdev managed"),
                   rom_bar=None if rom is None or rom.get("bar") is None
                   else parse_flag(rom.get("bar"), "rom bar"),
                   rom_file=None if rom is None else rom.get("file"),
                   guest_address=guest_address_of(el), boot_order=boot_order_of(el))


@dataclass(frozen=True)
class HostdevInterface:
    """``<interface type='hostdev'>``: an SR-IOV NIC VF; libvirt sets its MAC and VLAN on the PF first."""

    address: PciAddress
    mac: MacAddress | None = None
    vlan: int | None = None
    managed: bool = True
    guest_address: GuestAddress | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", PciAddress.parse(self.address))
        if self.mac is not None:
            object.__setattr__(self, "mac", MacAddress.parse(self.mac))
        if self.vlan is not None and (not isinstance(self.vlan, int) or isinstance(self.vlan, bool)
                                      or not 0 <= self.vlan <= 4095):
            raise InvalidSpec("VLAN id", self.vlan, "an integer 0..4095")

    def label(self) -> str:
        return f"NIC VF {self.address}"

    @property
    def source_key(self) -> str:
        return f"pci:{self.address}"

    def to_element(self) -> Element:
        el = make("interface", {"type": "hostdev", "managed": yesno(self.managed)})
        if self.mac is not None:
            sub(el, "mac", {"address": str(self.mac)})
        src = sub(el, "source")
        sub(src, "address", {"type": "pci", **self.address.libvirt_attrs()})
        if self.vlan is not None:
            sub(sub(el, "vlan"), "tag", {"id": str(self.vlan)})
        if self.guest_address is not None:
            el.append(self.guest_address.to_element())
        return el

    @classmethod
    def from_element(cls, el: Element) -> HostdevInterface:
        expect_tag(el, "interface", "hostdev")
        mac = el.find("mac")
        tag = el.find("vlan/tag")
        return cls(pci_from_address(el.find("source/address"), "interface source address"),
                   mac=None if mac is None else MacAddress.parse(mac.get("address", "")),
                   vlan=None if tag is None else parse_int(tag.get("id"), "VLAN id"),
                   managed=parse_flag(el.get("managed"), "interface managed"),
                   guest_address=guest_address_of(el))


GpuDevice = MdevHostdev | PciHostdev | HostdevInterface


def device_from_element(el: Element) -> GpuDevice | None:
    """The typed view of a ``<hostdev>``/``<interface type='hostdev'>``, or None for other devices."""
    if el.tag == "hostdev" and el.get("mode", "subsystem") == "subsystem":
        if el.get("type") == "mdev":
            return MdevHostdev.from_element(el)
        if el.get("type") == "pci":
            return PciHostdev.from_element(el)
    if el.tag == "interface" and el.get("type") == "hostdev":
        return HostdevInterface.from_element(el)
    return None
