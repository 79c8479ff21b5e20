"""A libvirt domain document: parse, inspect GPU devices, edit without losing anything, hot-plug XML.

:class:`Domain` keeps the whole parsed tree and touches only the elements it is asked to change, so
metadata, vendor namespaces and elements this package does not know survive an edit untouched.
New elements go where libvirt itself writes them (fixed order), so output is stable. The parser and
that order are in :mod:`.document`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lxml import etree

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import DomainName, MdevUuid, PciAddress
from vgpuvirt.xml.document import DEVICE_ORDER, DOMAIN_ORDER, insert_ordered, parse_xml
from vgpuvirt.xml.element import Element, make, source_key_of, sub
from vgpuvirt.xml.hostdev import GpuDevice, HostdevInterface, MdevHostdev, PciHostdev, device_from_element
from vgpuvirt.xml.parts import CpuPinning, Disk, EvdevInput, Graphics, Tpm, VirtioNic

__all__ = ["DEVICE_ORDER", "DOMAIN_ORDER", "DeviceKey", "Domain", "GpuDevices", "device_xml",
           "insert_ordered", "parse_xml"]

_UNITS = {"b": 1, "bytes": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
          "g": 1024**3, "gib": 1024**3, "gb": 1000**3, "t": 1024**4, "tib": 1024**4, "tb": 1000**4}

DeviceKey = PciAddress | MdevUuid | MdevHostdev | PciHostdev | HostdevInterface


def _key_of(key: DeviceKey) -> str:
    if isinstance(key, PciAddress):
        return f"pci:{key}"
    if isinstance(key, MdevUuid):
        return f"mdev:{key}"
    return key.source_key


def device_xml(device: GpuDevice) -> str:
    """Device XML for ``virDomainAttachDeviceFlags`` / ``DetachDeviceFlags``."""
    return etree.tostring(device.to_element(), encoding="unicode", pretty_print=True)


@dataclass(frozen=True)
class GpuDevices:
    """The GPU-related devices of a domain, in document order."""

    mdev_uuids: list[MdevUuid]
    pci_addresses: list[PciAddress]
    interfaces: list[PciAddress]

    def to_dict(self) -> dict[str, Any]:
        return {"mdev_uuids": [str(u) for u in self.mdev_uuids],
                "pci_addresses": [str(a) for a in self.pci_addresses],
                "interfaces": [str(a) for a in self.interfaces]}


class Domain:
    """One ``<domain>`` tree. ``Domain.from_xml(text)`` / ``to_xml()``; edits happen in place.

    Below: the tree and its top-level children, CPU/memory/feature tuning, then parsing, values and devices.
    """

    # -- the tree and its top-level children ------------------------------------------------------------------
    def __init__(self, root: Element) -> None:
        if root.tag != "domain":
            raise XmlError(f"expected a <domain> document, got <{root.tag}>")
        self.root = root

    def child(self, tag: str, create: bool = False) -> Element | None:
        # a plain tag is a direct child: iterchildren skips find()'s path parsing (~16 calls per build)
        el = next(self.root.iterchildren(tag), None) if tag.isidentifier() else self.root.find(tag)
        if el is None and create:
            el = insert_ordered(self.root, make(tag), DOMAIN_ORDER)
        return el

    def _ensure(self, tag: str) -> Element:
        el = self.child(tag, create=True)
        assert el is not None
        return el

    @property
    def devices(self) -> Element:
        return self._ensure("devices")

    # -- tuning: CPU pinning, NUMA, hugepages, CPU model and topology, features, secure boot -----------------
    def set_cpu_pinning(self, pinning: CpuPinning | None) -> None:
        tune = self.child("cputune")
        if tune is not None:
            for el in list(tune):
                if el.tag in ("vcpupin", "emulatorpin"):
                    tune.remove(el)
        if pinning is None:
            if tune is not None and len(tune) == 0:
                self.root.remove(tune)
            return
        tune = self._ensure("cputune")
        new = pinning.to_element()
        for i, el in enumerate(new):
            tune.insert(i, el)

    def cpu_pinning(self) -> CpuPinning | None:
        tune = self.child("cputune")
        if tune is None or tune.find("vcpupin") is None:
            return None
        return CpuPinning.from_element(tune)

    def set_numa_node(self, node: int | None, mode: str = "strict") -> None:
        old = self.child("numatune")
        if old is not None:
            self.root.remove(old)
        if node is None:
            return
        if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node <= 1023:
            raise InvalidSpec("NUMA node", node, "an integer 0..1023")
        if mode not in ("strict", "preferred", "interleave", "restrictive"):
            raise InvalidSpec("numatune mode", mode, "strict | preferred | interleave | restrictive")
        tune = self._ensure("numatune")
        sub(tune, "memory", {"mode": mode, "nodeset": str(node)})

    def set_hugepages(self, on: bool) -> None:
        backing = self.child("memoryBacking")
        if backing is not None:
            for el in backing.findall("hugepages"):
                backing.remove(el)
        if on:
            sub(self._ensure("memoryBacking"), "hugepages")
        elif backing is not None and len(backing) == 0:
            self.root.remove(backing)

    def set_cpu_mode(self, host_passthrough: bool) -> None:
        cpu = self._ensure("cpu")
        if host_passthrough:
            for k, v in (("mode", "host-passthrough"), ("check", "none"), ("migratable", "off")):
                cpu.set(k, v)
        else:
            cpu.attrib.clear()
            cpu.set("mode", "host-model")
            cpu.set("check", "partial")
            for el in list(cpu):
                if el.tag in ("cache", "feature"):
                    cpu.remove(el)

    def set_topology(self, vcpus: int, threads: int = 1) -> None:
        if not isinstance(threads, int) or threads < 1 or vcpus % threads:
            raise InvalidSpec("threads per core", threads, f"a divisor of the vCPU count {vcpus}")
        cpu = self._ensure("cpu")
        topo = cpu.find("topology")
        if topo is None:
            topo = make("topology")
            cpu.insert(0, topo)
        for k, v in (("sockets", "1"), ("dies", "1"), ("cores", str(vcpus // threads)), ("threads", str(threads))):
            topo.set(k, v)

    def set_cpu_feature(self, name: str, policy: str | None) -> None:
        cpu = self._ensure("cpu")
        for el in cpu.findall(f"feature[@name='{name}']"):
            cpu.remove(el)
        if policy is not None:
            sub(cpu, "feature", {"policy": policy, "name": name})

    def features(self) -> Element:
        return self._ensure("features")

    def set_hyperv(self, on: bool, vendor_id: str | None = None) -> None:
        """Hyper-V enlightenments on/off (the template's list is kept), plus an optional vendor_id."""
        feats = self.features()
        hv = feats.find("hyperv")
        if not on:
            if hv is not None:
                feats.remove(hv)
            if vendor_id is not None:
                raise InvalidSpec("hyperv_vendor_id", vendor_id, "Hyper-V enabled (hyperv=True)")
            self._set_hypervclock(False)
            return
        if hv is None:
            hv = sub(feats, "hyperv", {"mode": "custom"})
            for name in ("relaxed", "vapic", "vpindex", "synic", "stimer", "frequencies"):
                sub(hv, name, {"state": "on"})
        for el in hv.findall("vendor_id"):
            hv.remove(el)
        if vendor_id is not None:
            sub(hv, "vendor_id", {"state": "on", "value": vendor_id})
        self._set_hypervclock(True)

    def _set_hypervclock(self, on: bool) -> None:
        clock = self.child("clock")
        if clock is None:
            if not on:
                return
            clock = self._ensure("clock")
            clock.set("offset", "localtime")
        for el in clock.findall("timer[@name='hypervclock']"):
            clock.remove(el)
        if on:
            sub(clock, "timer", {"name": "hypervclock", "present": "yes"})

    def set_kvm_hidden(self, hidden: bool) -> None:
        feats = self.features()
        for el in feats.findall("kvm"):
            feats.remove(el)
        if hidden:
            sub(sub(feats, "kvm"), "hidden", {"state": "on"})

    def set_secure_boot(self, on: bool) -> None:
        """UEFI with firmware auto-selection; secure boot with Microsoft keys enrolled needs SMM."""
        os_el = self._ensure("os")
        os_el.set("firmware", "efi")
        fw = os_el.find("firmware")
        if fw is None:
            fw = make("firmware")
            t = os_el.find("type")
            os_el.insert(0 if t is None else os_el.index(t) + 1, fw)
        for el in list(fw):
            fw.remove(el)
        sub(fw, "feature", {"enabled": "yes" if on else "no", "name": "secure-boot"})
        if on:
            sub(fw, "feature", {"enabled": "yes", "name": "enrolled-keys"})
        feats = self.features()
        for el in feats.findall("smm"):
            feats.remove(el)
        if on:
            sub(feats, "smm", {"state": "on"})

    # -- parse / build ------------------------------------------------------------------------------------
    @classmethod
    def from_xml(cls, text: str | bytes) -> Domain:
        return cls(parse_xml(text))

    @classmethod
    def from_element(cls, el: Element) -> Domain:
        return cls(el)

    def to_element(self) -> Element:
        return self.root

    def to_xml(self) -> str:
        return etree.tostring(self.root, encoding="unicode", pretty_print=True)

    def copy(self) -> Domain:
        return Domain(_deepcopy(self.root))

    # -- plain values ---------------------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        return self.root.findtext("name")

    @property
    def running(self) -> bool:
        """Live XML of a running domain carries its id (``<domain id='3'>``); inactive XML has none."""
        return self.root.get("id") not in (None, "-1")

    def set_name(self, name: DomainName | str) -> None:
        self._ensure("name").text = str(DomainName.parse(name))

    @property
    def uuid(self) -> MdevUuid | None:
        text = self.root.findtext("uuid")
        return None if text is None else MdevUuid.parse(text)

    def set_uuid(self, uuid: MdevUuid | str) -> None:
        self._ensure("uuid").text = str(MdevUuid.parse(uuid))

    @property
    def memory_mib(self) -> int | None:
        el = self.root.find("memory")
        if el is None or el.text is None:
            return None
        unit = el.get("unit", "KiB").lower()
        if unit not in _UNITS:
            raise InvalidSpec("memory unit", unit, "a libvirt unit (KiB, MiB, GiB, ...)")
        return int(el.text) * _UNITS[unit] // 1024**2

    def set_memory_mib(self, mib: int) -> None:
        if not isinstance(mib, int) or isinstance(mib, bool) or not 16 <= mib <= 2**32:
            raise InvalidSpec("memory (MiB)", mib, "an integer of at least 16")
        for tag in ("memory", "currentMemory"):
            el = self._ensure("memory") if tag == "memory" else self.child(tag)
            if el is not None:
                el.set("unit", "MiB")
                el.text = str(mib)

    @property
    def vcpus(self) -> int | None:
        text = self.root.findtext("vcpu")
        return None if text is None else int(text)

    def set_vcpus(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 4096:
            raise InvalidSpec("vCPU count", n, "an integer 1..4096")
        el = self._ensure("vcpu")
        el.set("placement", "static")
        el.text = str(n)
        topo = self.root.find("cpu/topology")
        if topo is not None:
            threads = int(topo.get("threads", "1"))
            self.set_topology(n, threads)

    @property
    def machine(self) -> str | None:
        t = self.root.find("os/type")
        return None if t is None else t.get("machine")

    def set_machine(self, machine: str) -> None:
        t = self.root.find("os/type")
        if t is None:
            raise XmlError("the domain has no <os><type>; cannot set the machine type")
        t.set("machine", machine)

    # -- devices ---------------------------------------------------------------------------------------------
    def add_element(self, el: Element) -> Element:
        return insert_ordered(self.devices, el, DEVICE_ORDER)

    def _remove_all(self, xpath: str) -> int:
        found = _xpath(xpath)(self.devices)
        assert isinstance(found, list)
        for el in found:
            assert isinstance(el, etree._Element)
            el.getparent().remove(el)  # type: ignore[union-attr]
        return len(found)

    def iter_gpu_elements(self) -> Iterator[tuple[Element, GpuDevice]]:
        for el in self.devices:
            if el.tag in ("hostdev", "interface"):
                dev = device_from_element(el)
                if dev is not None:
                    yield el, dev

    def hostdevs(self) -> list[GpuDevice]:
        """mdev vGPUs, PCI hostdevs and hostdev interfaces, in document order."""
        return [dev for _, dev in self.iter_gpu_elements()]

    def gpu_devices(self) -> GpuDevices:
        mdevs: list[MdevUuid] = []
        pcis: list[PciAddress] = []
        nics: list[PciAddress] = []
        for dev in self.hostdevs():
            if isinstance(dev, MdevHostdev):
                mdevs.append(dev.uuid)
            elif isinstance(dev, PciHostdev):
                pcis.append(dev.address)
            else:
                nics.append(dev.address)
        return GpuDevices(mdevs, pcis, nics)

    def find_device(self, key: DeviceKey) -> Element | None:
        """The element whose source is ``key`` (a PCI address, an mdev UUID or a device value)."""
        want = _key_of(key)
        for el, dev in self.iter_gpu_elements():
            if dev.source_key == want:
                return el
        return None

    def add_device(self, device: GpuDevice, *, sources: set[str] | None = None) -> Element:
        """Append a GPU device; refuses a second device with the same source. A caller adding several keeps
        the domain's sources in ``sources`` (from :meth:`device_sources`; updated here) instead of having each
        addition read every device again."""
        self.claim_source(device, self.device_sources() if sources is None else sources)
        return self.add_element(device.to_element())

    def claim_source(self, device: GpuDevice, sources: set[str]) -> None:
        """Add ``device``'s source to ``sources`` (the domain's, see :meth:`device_sources`), or refuse a second
        device with the same source."""
        want = device.source_key
        if want in sources:
            raise XmlError(f"{device.label()}: already in domain {self.name!r}",
                           [f"duplicate-hostdev: {device.label()} is already attached"])
        sources.add(want)

    def device_sources(self) -> set[str]:
        """The source keys (``mdev:<uuid>``, ``pci:<address>``) of the domain's hostdevs and interfaces."""
        keys = (source_key_of(el) for el in self.devices if el.tag in ("hostdev", "interface"))
        return {k for k in keys if k is not None}

    def remove_device(self, key: DeviceKey) -> Element:
        el = self.find_device(key)
        if el is None:
            raise XmlError(f"{_key_of(key)}: no such device in domain {self.name!r}")
        self.devices.remove(el)
        return el

    def detach_xml(self, key: DeviceKey) -> str:
        """The domain's own element for ``key`` (with its guest address), for a detach call."""
        el = self.find_device(key)
        if el is None:
            raise XmlError(f"{_key_of(key)}: no such device in domain {self.name!r}")
        return etree.tostring(el, encoding="unicode", pretty_print=True)

    # -- edits the builder uses (no policy: each does what its name says) -------------------------------------
    def set_graphics(self, graphics: Graphics | None) -> None:
        """Replace the emulated display; ``None`` = headless (no graphics, ``<video model='none'>``)."""
        self._remove_all("graphics")
        if graphics is None:
            self._remove_all("video")
            video = make("video")
            sub(video, "model", {"type": "none"})
            self.add_element(video)
            self._remove_all("input[@type='tablet']")
        else:
            self.add_element(graphics.to_element())
            if not _xpath("video")(self.devices):
                video = make("video")
                sub(video, "model", {"type": "virtio", "heads": "1", "primary": "yes"})
                self.add_element(video)

    def graphics(self) -> list[Graphics]:
        return [Graphics.from_element(g) for g in self.devices.iterchildren("graphics")]

    def set_tpm(self, tpm: Tpm | None) -> None:
        self._remove_all("tpm")
        if tpm is not None:
            self.add_element(tpm.to_element())

    def add_disk(self, disk: Disk) -> Element:
        """Add ``disk``; a disk already on its target (the template's ``vda``) is replaced, not doubled."""
        self._remove_all(f"disk[target/@dev='{disk.target}']")   # target: validated ([a-z]+)
        return self.add_element(disk.to_element())

    def set_virtio_nics(self, nics: Sequence[VirtioNic]) -> None:
        """Replace the ordinary (non-hostdev) NICs."""
        self._remove_all("interface[@type!='hostdev']")
        for nic in nics:
            self.add_element(nic.to_element())

    def set_virtio_input(self, on: bool) -> None:
        self._remove_all("input[@bus='virtio'][@type='keyboard' or @type='mouse']")
        if on:
            self.add_element(make("input", {"type": "keyboard", "bus": "virtio"}))
            self.add_element(make("input", {"type": "mouse", "bus": "virtio"}))

    def add_evdev(self, evdev: EvdevInput) -> None:
        self.add_element(evdev.to_element())

    def add_pcie_root_port(self) -> int:
        """Add a ``pcie-root-port`` controller at the next free PCI controller index and return that index."""
        used = [int(c.get("index", "0")) for c in self.devices.iterchildren("controller") if c.get("type") == "pci"]
        used += [int(a.get("bus", "0"), 0) for a in _xpath("*/address[@type='pci']")(self.devices)]  # type: ignore[union-attr]
        index = max([0, *used]) + 1
        self.add_element(make("controller", {"type": "pci", "index": str(index), "model": "pcie-root-port"}))
        return index

    def used_guest_slots(self, bus: int = 0) -> set[int]:
        slots: set[int] = set()
        for a in _xpath("*/address[@type='pci']")(self.devices):  # type: ignore[union-attr]
            assert isinstance(a, etree._Element)
            if int(a.get("bus", "0"), 0) == bus:
                slots.add(int(a.get("slot", "0"), 0))
        return slots


@functools.lru_cache(maxsize=256)
def _xpath(expr: str) -> etree.XPath:
    """``expr`` compiled once (``el.xpath(expr)`` compiles it on every call: a build makes several such calls)."""
    return etree.XPath(expr)


def _deepcopy(el: Element) -> Element:
    return copy.deepcopy(el)
