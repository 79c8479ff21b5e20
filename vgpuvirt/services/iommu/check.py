"""IOMMU pre-flight: can these PCI devices be assigned to a VM? One read, then the kernel's and libvirt's rules.

The rules are listed in :mod:`vgpuvirt.services.iommu.api`'s docstring (and hostdata/iommu_examples.txt).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Host, Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.pci.parsers import parse_driver_override, parse_reset_methods, pci_or_none
from vgpuvirt.xml.refs import domain_device_refs

VFIO = "vfio-pci"
# Drivers that set driver_managed_dma (kernel >= 5.19) or are stubs: they keep a group viable.
DMA_SAFE = frozenset({"vfio-pci", "pci-stub", "pcieport", "xen-pciback"})

CLASS_NAMES = {0x0300: "VGA controller", 0x0302: "3D controller", 0x0380: "display controller",
               0x0403: "audio device", 0x0c03: "USB controller", 0x0c80: "serial bus controller",
               0x0600: "host bridge", 0x0604: "PCI bridge", 0x0200: "Ethernet controller"}


def _dma_safe(driver: str | None) -> bool:
    return driver is None or driver in DMA_SAFE or driver.endswith(("-vfio-pci", "_vfio_pci"))


@dataclass(frozen=True)
class Member:
    address: PciAddress
    driver: str | None
    pci_class: int | None
    role: str        # requested | bridge | companion | free | vfio | blocking
    note: str = ""

    @property
    def is_bridge(self) -> bool:
        return self.pci_class is not None and self.pci_class >> 16 == 0x06

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "driver": self.driver,
                "class": f"0x{self.pci_class:06x}" if self.pci_class is not None else None,
                "class_name": CLASS_NAMES.get((self.pci_class or 0) >> 8), "role": self.role, "note": self.note}


@dataclass(frozen=True)
class DeviceCheck:
    address: PciAddress
    present: bool
    group: int | None = None
    driver: str | None = None
    pci_class: int | None = None
    members: tuple[Member, ...] = ()
    must_include: tuple[PciAddress, ...] = ()
    physfn: PciAddress | None = None
    num_vfs: int | None = None
    vendor_vfio: bool = False                # NVIDIA vGPU 17+ VF: keep driver nvidia, managed='no'
    reset_methods: tuple[str, ...] | None = None
    blocking: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def resettable(self) -> bool:
        return bool(self.reset_methods)

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "present": self.present, "iommu_group": self.group,
                "driver": self.driver, "class": f"0x{self.pci_class:06x}" if self.pci_class is not None else None,
                "members": [m.to_dict() for m in self.members], "must_include": [str(a) for a in self.must_include],
                "physfn": str(self.physfn) if self.physfn else None, "sriov_numvfs": self.num_vfs,
                "vendor_vfio": self.vendor_vfio,
                "reset_methods": list(self.reset_methods) if self.reset_methods is not None else None,
                "resettable": self.resettable, "blocking": list(self.blocking), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class AssignabilityReport:
    host: str
    iommu_enabled: bool
    devices: tuple[DeviceCheck, ...]
    reasons: tuple[str, ...] = ()
    vm_guest: bool = False                   # this OS looks like a VM guest (virtio-pci devices)

    @property
    def assignable(self) -> bool:
        return self.iommu_enabled and not self.reasons

    @property
    def warnings(self) -> list[str]:
        return [f"{d.address}: {w}" for d in self.devices for w in d.warnings]

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "iommu_enabled": self.iommu_enabled, "vm_guest": self.vm_guest,
                "assignable": self.assignable,
                "reasons": list(self.reasons), "warnings": self.warnings,
                "devices": [d.to_dict() for d in self.devices]}


def read_patterns() -> list[str]:
    attrs = ("class", "driver", "iommu_group", "reset_method", "physfn", "sriov_numvfs", "driver_override",
             "nvidia/current_vgpu_type", "boot_vga")
    return [sysfs.IOMMU_GROUPS, f"{sysfs.IOMMU_GROUPS}/*", f"{sysfs.IOMMU_GROUPS}/*/devices/*",
            f"{sysfs.IOMMU_CLASS}/*",
            f"{sysfs.MDEV_DEVICES}/*", *(sysfs.pci("*", a) for a in attrs)]


def domain_users(domains: Iterable[tuple[str, str]] | None, for_domain: str | None) -> dict[PciAddress, list[str]]:
    users: dict[PciAddress, list[str]] = {}
    for name, xml in domains or ():
        if name == for_domain:
            continue
        for a in domain_device_refs(xml).pci:
            users.setdefault(a, []).append(name)
    return users


class _Facts:
    """Parsed view of the snapshot."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.groups: dict[int, list[PciAddress]] = {}
        for link in snap.glob(f"{sysfs.IOMMU_GROUPS}/*/devices/*"):
            parts = link.split("/")
            try:
                g, a = int(parts[4]), PciAddress.parse(parts[6])
            except (ValueError, InvalidSpec):
                continue
            self.groups.setdefault(g, []).append(a)
        self.iommu_enabled = bool(self.groups) or bool(snap.glob(f"{sysfs.IOMMU_CLASS}/*"))
        entry = snap.get(sysfs.IOMMU_GROUPS)
        self.groups_dir = entry.kind if entry is not None else None
        # virtio PCI devices (disks, NICs, balloon) are what a KVM/QEMU guest is made of: the real H100
        # guest had five (tests/fixtures/real/h100-580/raw/sys-attrs.txt)
        self.guest = any(snap.link_name(p) == "virtio-pci" for p in snap.glob(sysfs.pci("*", "driver")))
        self.mdevs: dict[str, int] = {}
        for link in snap.glob(f"{sysfs.MDEV_DEVICES}/*"):
            parent = posixpath.basename(posixpath.dirname((snap.link(link) or "").rstrip("/")))
            self.mdevs[parent] = self.mdevs.get(parent, 0) + 1

    def present(self, a: PciAddress) -> bool:
        return self.snap.has(f"{sysfs.PCI}/{a}/class")

    def pci_class(self, a: PciAddress) -> int | None:
        return self.snap.int(f"{sysfs.PCI}/{a}/class")

    def driver(self, a: PciAddress) -> str | None:
        return self.snap.link_name(f"{sysfs.PCI}/{a}/driver")

    def override(self, a: PciAddress) -> str | None:
        return parse_driver_override(self.snap.text(f"{sysfs.PCI}/{a}/driver_override"))

    def group(self, a: PciAddress) -> int | None:
        name = self.snap.link_name(f"{sysfs.PCI}/{a}/iommu_group")
        if name is not None and name.isdigit():
            return int(name)
        for g, members in self.groups.items():
            if a in members:
                return g
        return None

    def physfn(self, a: PciAddress) -> PciAddress | None:
        return pci_or_none(self.snap.link_name(f"{sysfs.PCI}/{a}/physfn"))

    def num_vfs(self, a: PciAddress) -> int | None:
        return self.snap.int(f"{sysfs.PCI}/{a}/sriov_numvfs")

    def vgpu_type(self, a: PciAddress) -> int | None:
        return self.snap.int(f"{sysfs.PCI}/{a}/nvidia/current_vgpu_type")

    def is_bridge(self, a: PciAddress) -> bool:
        c = self.pci_class(a)
        return c is not None and c >> 16 == 0x06

    def reset_methods(self, a: PciAddress) -> list[str] | None:
        return parse_reset_methods(self.snap.text(f"{sysfs.PCI}/{a}/reset_method"))

    def boot_vga(self, a: PciAddress) -> bool:
        return (self.snap.text(f"{sysfs.PCI}/{a}/boot_vga") or "").strip() == "1"


def _describe(f: _Facts, a: PciAddress) -> str:
    c = f.pci_class(a)
    kind = CLASS_NAMES.get((c or 0) >> 8, f"class 0x{c:06x}" if c is not None else "device")
    return f"{a} ({kind}, driver {f.driver(a) or 'none'})"


def check_one(f: _Facts, a: PciAddress, requested: set[PciAddress],
               users: Mapping[PciAddress, list[str]]) -> DeviceCheck:
    if not f.present(a):
        return DeviceCheck(a, False, blocking=(f"no PCI device {a} on this host",))
    blocking: list[str] = []
    warnings: list[str] = []
    group = f.group(a)
    vendor_vfio = f.vgpu_type(a) is not None
    if f.is_bridge(a):
        blocking.append("Non-endpoint PCI devices (bridges, root ports) cannot be assigned to guests")
    if f.iommu_enabled and group is None:
        blocking.append("the device has no IOMMU group")
    if a in users:
        blocking.append(f"in use by domain {', '.join(users[a])}")
    if f.mdevs.get(str(a)):
        blocking.append(f"hosts {f.mdevs[str(a)]} mediated device(s) (vGPUs); remove them to pass the GPU whole")
    nvfs = f.num_vfs(a)
    if nvfs:
        blocking.append(f"the PF has {nvfs} SR-IOV VFs enabled; a PF with VFs cannot be passed through whole "
                        "(disable SR-IOV first, or assign VFs)")
    pf = f.physfn(a)
    if pf is not None:
        if pf in requested:
            blocking.append(f"requested together with its PF {pf}: a PF and its VFs are exclusive")
        elif pf in users:
            blocking.append(f"its PF {pf} is assigned to domain {', '.join(users[pf])}")
        elif f.driver(pf) == VFIO:
            blocking.append(f"its PF {pf} is bound to vfio-pci (passed through whole)")
    if vendor_vfio:
        if f.vgpu_type(a) == 0:
            blocking.append("NVIDIA vGPU VF without a vGPU type (current_vgpu_type is 0): assign a type first")
        warnings.append("NVIDIA vGPU 17+ VF: stays bound to nvidia; use <hostdev managed='no'>")
    members: list[Member] = []
    must: list[PciAddress] = []
    for m in sorted(f.groups.get(group, []) if group is not None else []):
        drv = f.driver(m)
        cls = f.pci_class(m)
        if m == a or m in requested:
            members.append(Member(m, drv, cls, "requested"))
            continue
        if f.is_bridge(m):
            members.append(Member(m, drv, cls, "bridge", "bridges and root ports do not block"))
            continue
        if m in users:
            blocking.append(f"group member {_describe(f, m)} is assigned to domain {', '.join(users[m])}; "
                            "a VFIO group can be used by one VM only")
            members.append(Member(m, drv, cls, "blocking", f"used by {', '.join(users[m])}"))
            continue
        if m.device_slot == a.device_slot:
            must.append(m)
            members.append(Member(m, drv, cls, "companion", "same slot: must be passed (or bound to vfio-pci) too"))
            if not _dma_safe(drv):
                warnings.append(f"{_describe(f, m)} shares the slot and IOMMU group: it must go along "
                                "(prepare binds it to vfio-pci)")
            continue
        if _dma_safe(drv):
            members.append(Member(m, drv, cls, "vfio" if drv == VFIO else "free"))
            continue
        blocking.append(f"group {group} also holds {_describe(f, m)}, bound to a host driver that uses DMA; "
                        "pass it through too, unbind it, or move the card to a slot with its own group")
        members.append(Member(m, drv, cls, "blocking", f"host driver {drv}"))
    if f.boot_vga(a):
        # Assignable as far as the IOMMU goes, but the host loses its console, the firmware has already
        # initialised it (its option ROM may be shadowed: a ROM file may be needed), and unbinding the
        # framebuffer driver can hang the host's display stack: the user must mean it.
        warnings.append("boot VGA device (boot_vga=1): the host's console and firmware framebuffer use it; "
                        "passing it through takes the host's display away and may need a ROM file "
                        "(placement takes it only when asked: boot_vga=yes)")
    resets = f.reset_methods(a)
    if not resets:
        warnings.append("no reset method (reset_method absent or empty): the device may keep state between VMs")
    return DeviceCheck(a, True, group, f.driver(a), f.pci_class(a), tuple(members), tuple(must), pf, nvfs,
                       vendor_vfio, tuple(resets) if resets is not None else None, tuple(blocking), tuple(warnings))


def parse_addresses(addresses: Iterable[str | PciAddress]) -> list[PciAddress]:
    if isinstance(addresses, (str, PciAddress)):
        addresses = [addresses]
    out = [PciAddress.parse(a) for a in addresses]
    if not out:
        raise InvalidSpec("PCI addresses", [], "at least one address")
    return list(dict.fromkeys(out))


def assignability(host: Host, snap: Snapshot, reqs: list[PciAddress], users: Mapping[PciAddress, list[str]]
                  ) -> tuple[AssignabilityReport, _Facts]:
    f = _Facts(snap)
    checks = tuple(check_one(f, a, set(reqs), users) for a in reqs)
    reasons: list[str] = []
    if not f.iommu_enabled:
        if f.guest:
            reasons.append(f"the IOMMU is off ({sysfs.iommu_off(f.groups_dir)}) and this OS looks like a VM guest "
                           "(its devices are virtio-pci): a guest has an IOMMU only when its hypervisor gives it "
                           "a virtual one; assign GPUs to VMs on the hypervisor host, not inside a guest")
        else:
            reasons.append(f"the IOMMU is off ({sysfs.iommu_off(f.groups_dir)}): enable VT-d/AMD-Vi in firmware "
                           "and boot with intel_iommu=on or amd_iommu=on")
    reasons += [f"{d.address}: {r}" for d in checks for r in d.blocking]
    return AssignabilityReport(host.name, f.iommu_enabled, checks, tuple(reasons), f.guest), f


def check_assignable(host: Host, addresses: Iterable[str | PciAddress], *,
                     domains: Iterable[tuple[str, str]] | None = None,
                     for_domain: str | None = None) -> AssignabilityReport:
    """Can ``addresses`` be given to one VM? ``domains`` ((name, xml) pairs) makes devices used by
    other domains block; ``for_domain`` names the VM the devices are for (its own use is fine)."""
    reqs = parse_addresses(addresses)
    users = domain_users(domains, for_domain)
    return assignability(host, host.read(read_patterns()), reqs, users)[0]


# ---------------------------------------------------------------------------------- binding
