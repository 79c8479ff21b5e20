"""The devices that carry a GPU (or a NIC VF) into a guest: mdev vGPUs, PCI hostdevs, hostdev interfaces.

No policy here: which device, which type and whether it is managed are the caller's decisions
(Nova's config.py rule). Output order of attributes and children is fixed, so builds are byte-stable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lxml import etree

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MacAddress, MdevUuid, PciAddress, format_cpulist, parse_cpulist
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
    shape_of,
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
        if self.model != "vfio-pci" and (self.display or self.ramfb):
            raise InvalidSpec("mdev display", self.model, "display and ramfb only with model vfio-pci")
        check_boot_order(self.boot_order)

    def label(self) -> str:
        return f"mdev {self.uuid}"

    @property
    def source_key(self) -> str:
        return f"mdev:{self.uuid}"

    def shape(self) -> tuple[object, ...]:
        return shape_of(self, ("uuid",))

    def stamp(self, el: Element) -> None:
        """Write this instance's UUID into ``el``, which :meth:`to_element` made for an mdev of the same shape."""
        _source_address(el).set("uuid", str(self.uuid))

    def to_element(self) -> Element:
        el = make("hostdev", {"mode": "subsystem", "type": "mdev", "managed": "no", "model": self.model})
        if self.model == "vfio-pci":
            # libvirt supports display (and ramfb) only on vfio-pci mdevs; vfio-ccw/vfio-ap carry neither
            el.set("display", onoff(self.display))
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
    # XML 1.0 cannot carry a control character (lxml raised a bare ValueError for one): refused here, by name
    if path is not None and (not isinstance(path, str) or not path.startswith("/")
                             or any(c < " " or c == "\x7f" for c in path)):
        raise InvalidSpec("ROM file", path, "an absolute path on the host, without control characters")


_ALIAS_RE = re.compile(r"ua-[A-Za-z0-9_-]{1,60}")


def check_alias(what: str, value: str | None) -> None:
    """A user alias as libvirt's QEMU driver takes it in a definition: ``ua-`` and a plain name."""
    if value is not None and (not isinstance(value, str) or not _ALIAS_RE.fullmatch(value)):
        raise InvalidSpec(what, value, "a user alias such as ua-backup0 (ua- then letters, digits, _ or -)")


def _teaming_of(el: Element) -> str | None:
    t = el.find("teaming")
    if t is None:
        return None
    if t.get("type") != "transient" or t.get("persistent") is None:
        raise InvalidSpec("hostdev teaming", t.get("type"), "type='transient' persistent='<partner alias>'")
    return t.get("persistent")


def _check_nodeset(value: frozenset[int]) -> frozenset[int]:
    if not isinstance(value, set | frozenset | list | tuple) or any(
            not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 1024 for n in value):
        raise InvalidSpec("hostdev ACPI nodeset", value, "a set of guest NUMA node numbers")
    return frozenset(value)


@dataclass(frozen=True)
class PciHostdev:
    """``<hostdev mode='subsystem' type='pci'>``: a whole GPU, one of its functions, or a VF.

    ``managed=True`` lets libvirt bind vfio-pci at start and give the device back at stop; an NVIDIA
    vGPU 17+ VF must stay on ``nvidia`` (vendor-specific VFIO), hence :meth:`vgpu_vf` (``managed=False``).

    What newer libvirt adds for GPU VMs (none of it chosen here, the caller decides):
    ``display``/``ramfb`` give a vGPU 17+ VF desktop a console and a boot display as on an mdev (libvirt
    10.x); ``iommufd`` picks the iommufd VFIO backend (``<driver iommufd='yes'/>``); ``acpi_nodeset`` the
    guest NUMA nodes that expose the device's memory (Grace Hopper's GPU memory nodes); ``teaming`` makes
    the device the transient member of a failover pair whose persistent partner is the virtio NIC with
    that alias (an SR-IOV NIC VF that survives a live migration); ``unassigned`` keeps the device
    assigned to the VM's process but invisible to the guest (``<address type='unassigned'/>``).
    """

    address: PciAddress
    managed: bool = True
    rom_bar: bool | None = None
    rom_file: str | None = None
    guest_address: GuestAddress | None = None
    boot_order: int | None = None
    display: bool = False
    ramfb: bool = False
    iommufd: bool | None = None
    acpi_nodeset: frozenset[int] = frozenset()
    teaming: str | None = None
    unassigned: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", PciAddress.parse(self.address))
        _check_rom_file(self.rom_file)
        check_boot_order(self.boot_order)
        for what, flag in (("hostdev display", self.display), ("hostdev ramfb", self.ramfb),
                           ("hostdev unassigned", self.unassigned)):
            if not isinstance(flag, bool):
                raise InvalidSpec(what, flag, "true or false")
        if self.iommufd is not None and not isinstance(self.iommufd, bool):
            raise InvalidSpec("hostdev iommufd", self.iommufd, "true, false or unset")
        if self.ramfb and not self.display:
            # libvirt: "ramfb device requires display='on'" (the same rule as for an mdev)
            raise InvalidSpec("hostdev ramfb", self.ramfb, "ramfb only with display on")
        object.__setattr__(self, "acpi_nodeset", _check_nodeset(self.acpi_nodeset))
        check_alias("hostdev teaming partner", self.teaming)
        if self.unassigned and self.guest_address is not None:
            raise InvalidSpec("hostdev address", self.guest_address.pci, "a guest address or unassigned, not both")

    @classmethod
    def vgpu_vf(cls, address: PciAddress | str, *, guest_address: GuestAddress | None = None,
                display: bool = False, ramfb: bool = False) -> PciHostdev:
        """An NVIDIA vGPU 17+ VF whose ``nvidia/current_vgpu_type`` is already set."""
        return cls(PciAddress.parse(address), managed=False, guest_address=guest_address, display=display,
                   ramfb=ramfb)

    def label(self) -> str:
        return f"PCI hostdev {self.address}"

    @property
    def source_key(self) -> str:
        return f"pci:{self.address}"

    def shape(self) -> tuple[object, ...]:
        return shape_of(self, ("address",))

    def stamp(self, el: Element) -> None:
        """Write this device's host address into ``el``, made by :meth:`to_element` for one of the same shape."""
        _stamp_pci(_source_address(el), self.address)

    def to_element(self) -> Element:
        el = make("hostdev", {"mode": "subsystem", "type": "pci", "managed": yesno(self.managed)})
        if self.display:
            el.set("display", "on")
        if self.ramfb:
            el.set("ramfb", "on")
        drv = sub(el, "driver", {"name": "vfio"})
        if self.iommufd is not None:
            drv.set("iommufd", yesno(self.iommufd))
        src = sub(el, "source")
        sub(src, "address", self.address.libvirt_attrs())
        if self.teaming is not None:
            sub(el, "teaming", {"type": "transient", "persistent": self.teaming})
        if self.boot_order is not None:
            sub(el, "boot", {"order": str(self.boot_order)})
        if self.rom_bar is not None or self.rom_file is not None:
            rom = sub(el, "rom")
            if self.rom_bar is not None:
                rom.set("bar", onoff(self.rom_bar))
            if self.rom_file is not None:
                rom.set("file", self.rom_file)
        if self.acpi_nodeset:
            sub(el, "acpi", {"nodeset": format_cpulist(self.acpi_nodeset)})
        if self.unassigned:
            sub(el, "address", {"type": "unassigned"})
        elif self.guest_address is not None:
            el.append(self.guest_address.to_element())
        return el

    @classmethod
    def from_element(cls, el: Element) -> PciHostdev:
        expect_tag(el, "hostdev", "pci")
        rom = el.find("rom")
        drv = el.find("driver")
        acpi = el.find("acpi")
        return cls(pci_from_address(el.find("source/address"), "hostdev source address"),
                   managed=parse_flag(el.get("managed"), "hostdev managed"),
                   rom_bar=None if rom is None or rom.get("bar") is None
                   else parse_flag(rom.get("bar"), "rom bar"),
                   rom_file=None if rom is None else rom.get("file"),
                   guest_address=guest_address_of(el), boot_order=boot_order_of(el),
                   display=parse_flag(el.get("display"), "hostdev display"),
                   ramfb=parse_flag(el.get("ramfb"), "hostdev ramfb"),
                   iommufd=None if drv is None or drv.get("iommufd") is None
                   else parse_flag(drv.get("iommufd"), "hostdev iommufd"),
                   acpi_nodeset=frozenset() if acpi is None else parse_cpulist(acpi.get("nodeset", "")),
                   teaming=_teaming_of(el),
                   unassigned=el.find("address[@type='unassigned']") is not None)


_NIC_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}")
VIRTUALPORT_TYPES = ("802.1Qbg", "802.1Qbh", "openvswitch", "midonet")
_PARAM_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


@dataclass(frozen=True)
class Virtualport:
    """``<virtualport type=...><parameters .../></virtualport>``: the switch port profile libvirt sets up for
    the VF (802.1Qbh ``profileid``, 802.1Qbg ``managerid``/``typeid``/``typeidversion``/``instanceid``)."""

    type: str
    parameters: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.type not in VIRTUALPORT_TYPES:
            raise InvalidSpec("virtualport type", self.type, " | ".join(VIRTUALPORT_TYPES))
        params = tuple(sorted(dict(self.parameters).items()))
        for k, v in params:
            if not isinstance(k, str) or not _PARAM_RE.fullmatch(k) or not isinstance(v, str) or not v \
                    or len(v) > 128 or any(c in v for c in "\0\n<>&'\""):
                raise InvalidSpec("virtualport parameter", (k, v), "a name and a plain value")
        object.__setattr__(self, "parameters", params)

    def to_element(self) -> Element:
        el = make("virtualport", {"type": self.type})
        if self.parameters:
            sub(el, "parameters", dict(self.parameters))
        return el

    @classmethod
    def from_element(cls, el: Element) -> Virtualport:
        params = el.find("parameters")
        pairs = () if params is None else tuple((str(k), str(v)) for k, v in params.attrib.items())
        return cls(el.get("type", ""), pairs)


@dataclass(frozen=True)
class HostdevInterface:
    """``<interface type='hostdev'>``: an SR-IOV NIC VF; libvirt sets its MAC and VLAN on the PF first.
    ``teaming`` names the persistent virtio partner (its alias) of a failover pair, as on a PCI hostdev.

    ``model`` is the NIC model the guest is told about (``virtio``, ``e1000e``: libvirt records it, the VF
    stays what it is); ``driver``/``queues`` are ``<driver name= queues=>``; ``virtualport`` the switch
    port profile (802.1Qbh/802.1Qbg); ``boot_order`` makes it a boot device (PXE from the VF's ROM)."""

    address: PciAddress
    mac: MacAddress | None = None
    vlan: int | None = None
    managed: bool = True
    guest_address: GuestAddress | None = None
    model: str | None = None
    boot_order: int | None = None
    driver: str | None = None
    queues: int | None = None
    virtualport: Virtualport | None = None
    teaming: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", PciAddress.parse(self.address))
        if self.mac is not None:
            object.__setattr__(self, "mac", MacAddress.parse(self.mac))
        if self.vlan is not None and (not isinstance(self.vlan, int) or isinstance(self.vlan, bool)
                                      or not 0 <= self.vlan <= 4095):
            raise InvalidSpec("VLAN id", self.vlan, "an integer 0..4095")
        if self.model is not None and (not isinstance(self.model, str) or not _NIC_MODEL_RE.fullmatch(self.model)):
            raise InvalidSpec("NIC model", self.model, "a model name such as virtio or e1000e")
        if self.driver is not None and self.driver != "vfio":
            raise InvalidSpec("hostdev interface driver", self.driver, "vfio")
        if self.queues is not None and (not isinstance(self.queues, int) or isinstance(self.queues, bool)
                                        or not 1 <= self.queues <= 256):
            raise InvalidSpec("queues", self.queues, "an integer 1..256")
        if self.driver is not None and self.queues is not None:
            # libvirt's schema: <driver name='vfio'/> (the hostdev backend) or <driver queues=N/>, not both
            raise InvalidSpec("hostdev interface driver", (self.driver, self.queues), "driver='vfio' or queues, "
                                                                                       "not both")
        check_boot_order(self.boot_order)
        check_alias("interface teaming partner", self.teaming)

    def label(self) -> str:
        return f"NIC VF {self.address}"

    @property
    def source_key(self) -> str:
        return f"pci:{self.address}"

    def shape(self) -> tuple[object, ...]:
        return shape_of(self, ("address", "mac"))

    def stamp(self, el: Element) -> None:
        """Write this VF's address and MAC into ``el``, made by :meth:`to_element` for one of the same shape."""
        _stamp_pci(_source_address(el), self.address)
        if self.mac is not None:
            mac = el.find("mac")
            assert mac is not None, "stamped onto an element of another shape"
            mac.set("address", str(self.mac))

    def to_element(self) -> Element:
        # children in libvirt's own output order (mac, driver, source, vlan, virtualport, model, boot, address)
        el = make("interface", {"type": "hostdev", "managed": yesno(self.managed)})
        if self.mac is not None:
            sub(el, "mac", {"address": str(self.mac)})
        if self.driver is not None or self.queues is not None:
            drv = sub(el, "driver")
            if self.driver is not None:
                drv.set("name", self.driver)
            if self.queues is not None:
                drv.set("queues", str(self.queues))
        src = sub(el, "source")
        sub(src, "address", {"type": "pci", **self.address.libvirt_attrs()})
        if self.vlan is not None:
            sub(sub(el, "vlan"), "tag", {"id": str(self.vlan)})
        if self.virtualport is not None:
            el.append(self.virtualport.to_element())
        if self.model is not None:
            sub(el, "model", {"type": self.model})
        if self.teaming is not None:
            sub(el, "teaming", {"type": "transient", "persistent": self.teaming})
        if self.boot_order is not None:
            sub(el, "boot", {"order": str(self.boot_order)})
        if self.guest_address is not None:
            el.append(self.guest_address.to_element())
        return el

    @classmethod
    def from_element(cls, el: Element) -> HostdevInterface:
        expect_tag(el, "interface", "hostdev")
        mac = el.find("mac")
        tag = el.find("vlan/tag")
        model = el.find("model")
        drv = el.find("driver")
        vport = el.find("virtualport")
        return cls(pci_from_address(el.find("source/address"), "interface source address"),
                   mac=None if mac is None else MacAddress.parse(mac.get("address", "")),
                   vlan=None if tag is None else parse_int(tag.get("id"), "VLAN id"),
                   managed=parse_flag(el.get("managed"), "interface managed"),
                   guest_address=guest_address_of(el),
                   model=None if model is None else model.get("type"),
                   boot_order=boot_order_of(el),
                   driver=None if drv is None else drv.get("name"),
                   queues=None if drv is None or drv.get("queues") is None
                   else parse_int(drv.get("queues"), "queues"),
                   virtualport=None if vport is None else Virtualport.from_element(vport),
                   teaming=_teaming_of(el))


GpuDevice = MdevHostdev | PciHostdev | HostdevInterface


_SOURCE_ADDRESS = etree.XPath("source/address")   # compiled once: half the cost of find()'s path per call


def _source_address(el: Element) -> Element:
    found = _SOURCE_ADDRESS(el)
    assert isinstance(found, list) and found, "stamped onto an element of another shape"
    a = found[0]
    assert isinstance(a, etree._Element)
    return a


def _stamp_pci(a: Element, address: PciAddress) -> None:
    for k, v in address.libvirt_attrs().items():
        a.set(k, v)


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
