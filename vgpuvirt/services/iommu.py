"""IOMMU pre-flight (can these PCI devices be assigned to a VM?) and vfio-pci binding.

:func:`check_assignable` reads the host ONCE (groups, and class/driver/reset/SR-IOV facts of every
PCI function) and applies the kernel's and libvirt's rules (see hostdata/iommu_examples.txt):

* a group is viable when every endpoint in it is unbound or bound to a driver that does not use
  the kernel DMA API (vfio-pci and its variants, pci-stub); bridges and root ports (class 0x06)
  never block;
* functions of the same slot in the same group (the GPU's HDMI audio, USB-C, UCSI) must go along;
* a group member used by another domain blocks (a VFIO group lives in one VM only);
* a PF with VFs enabled is not passed whole; a VF is not passed with (or under) its PF;
* a GPU hosting mdevs is not passed whole; a vGPU 17+ VF needs its vGPU type set first and keeps
  its ``nvidia`` driver (libvirt ``managed='no'``).

:func:`prepare` binds every endpoint of the groups to vfio-pci (``driver_override`` + unbind +
``drivers_probe``, never ``new_id``, which would grab every device with that id), waits until
bound, and returns a :class:`BindingRecord` of the original drivers; :func:`release` restores them.
The record is the caller's to keep (``vgpuvirt iommu prepare --json`` prints it).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import DeviceBusy, DeviceError, InvalidSpec, NotAssignable
from vgpuvirt.host.base import Host, Op, Snapshot
from vgpuvirt.model import DriverName, PciAddress
from vgpuvirt.services import sysfs
from vgpuvirt.services.mutation import Change, error_for, note
from vgpuvirt.services.parsers import parse_driver_override, parse_reset_methods, pci_or_none
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

    @property
    def assignable(self) -> bool:
        return self.iommu_enabled and not self.reasons

    @property
    def warnings(self) -> list[str]:
        return [f"{d.address}: {w}" for d in self.devices for w in d.warnings]

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "iommu_enabled": self.iommu_enabled, "assignable": self.assignable,
                "reasons": list(self.reasons), "warnings": self.warnings,
                "devices": [d.to_dict() for d in self.devices]}


def read_patterns() -> list[str]:
    attrs = ("class", "driver", "iommu_group", "reset_method", "physfn", "sriov_numvfs", "driver_override",
             "nvidia/current_vgpu_type")
    return [f"{sysfs.IOMMU_GROUPS}/*", f"{sysfs.IOMMU_GROUPS}/*/devices/*", f"{sysfs.IOMMU_CLASS}/*",
            f"{sysfs.MDEV_DEVICES}/*", *(sysfs.pci("*", a) for a in attrs)]


def _users(domains: Iterable[tuple[str, str]] | None, for_domain: str | None) -> dict[PciAddress, list[str]]:
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


def _describe(f: _Facts, a: PciAddress) -> str:
    c = f.pci_class(a)
    kind = CLASS_NAMES.get((c or 0) >> 8, f"class 0x{c:06x}" if c is not None else "device")
    return f"{a} ({kind}, driver {f.driver(a) or 'none'})"


def _check_one(f: _Facts, a: PciAddress, requested: set[PciAddress],
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
    resets = f.reset_methods(a)
    if not resets:
        warnings.append("no reset method (reset_method absent or empty): the device may keep state between VMs")
    return DeviceCheck(a, True, group, f.driver(a), f.pci_class(a), tuple(members), tuple(must), pf, nvfs,
                       vendor_vfio, tuple(resets) if resets is not None else None, tuple(blocking), tuple(warnings))


def _parse_addresses(addresses: Iterable[str | PciAddress]) -> list[PciAddress]:
    if isinstance(addresses, (str, PciAddress)):
        addresses = [addresses]
    out = [PciAddress.parse(a) for a in addresses]
    if not out:
        raise InvalidSpec("PCI addresses", [], "at least one address")
    return list(dict.fromkeys(out))


def _report(host: Host, snap: Snapshot, reqs: list[PciAddress], users: Mapping[PciAddress, list[str]]
            ) -> tuple[AssignabilityReport, _Facts]:
    f = _Facts(snap)
    checks = tuple(_check_one(f, a, set(reqs), users) for a in reqs)
    reasons: list[str] = []
    if not f.iommu_enabled:
        reasons.append("the IOMMU is disabled (no /sys/kernel/iommu_groups): enable VT-d/AMD-Vi in firmware and "
                       "boot with intel_iommu=on or amd_iommu=on")
    reasons += [f"{d.address}: {r}" for d in checks for r in d.blocking]
    return AssignabilityReport(host.name, f.iommu_enabled, checks, tuple(reasons)), f


def check_assignable(host: Host, addresses: Iterable[str | PciAddress], *,
                     domains: Iterable[tuple[str, str]] | None = None,
                     for_domain: str | None = None) -> AssignabilityReport:
    """Can ``addresses`` be given to one VM? ``domains`` ((name, xml) pairs) makes devices used by
    other domains block; ``for_domain`` names the VM the devices are for (its own use is fine)."""
    reqs = _parse_addresses(addresses)
    users = _users(domains, for_domain)
    return _report(host, host.read(read_patterns()), reqs, users)[0]


# ---------------------------------------------------------------------------------- binding


@dataclass(frozen=True)
class Binding:
    address: PciAddress
    original_driver: str | None
    original_override: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "original_driver": self.original_driver,
                "original_override": self.original_override}


@dataclass(frozen=True)
class BindingRecord:
    """What :func:`prepare` changed: keep it and hand it to :func:`release`."""

    host: str
    bindings: tuple[Binding, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "bindings": [b.to_dict() for b in self.bindings]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BindingRecord:
        try:
            out = []
            for b in data["bindings"]:
                drv = b.get("original_driver")
                ov = b.get("original_override")
                out.append(Binding(PciAddress.parse(b["address"]),
                                   str(DriverName(drv)) if drv else None, str(DriverName(ov)) if ov else None))
            return cls(str(data.get("host", "")), tuple(out))
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidSpec("binding record", data, "the JSON that `iommu prepare` printed") from exc


def _bind_ops(a: PciAddress, driver: str | None, timeout: float) -> list[Op]:
    g = f"bind:{a}"
    ops = [Op.write(f"{sysfs.PCI}/{a}/driver_override", VFIO, group=g)]
    if driver is not None:
        ops.append(Op.write(sysfs.driver_unbind(DriverName(driver)), str(a), group=g))
    ops += [Op.write(sysfs.DRIVERS_PROBE, str(a), group=g),
            Op.wait(f"{sysfs.PCI}/{a}/driver", "link_endswith", VFIO, timeout=timeout, group=g)]
    return ops


def _release_ops(a: PciAddress, current: str | None, b: Binding, timeout: float) -> list[Op]:
    g = f"release:{a}"
    ops = [Op.write(f"{sysfs.PCI}/{a}/driver_override", (b.original_override or "") + "\n", group=g)]
    if current is not None:
        ops.append(Op.write(sysfs.driver_unbind(DriverName(current)), str(a), group=g))
    if b.original_driver is not None:
        ops += [Op.write(sysfs.DRIVERS_PROBE, str(a), group=g),
                Op.wait(f"{sysfs.PCI}/{a}/driver", "link_endswith", b.original_driver, timeout=timeout, group=g)]
    return ops


def prepare(host: Host, addresses: Iterable[str | PciAddress], *, domains: Iterable[tuple[str, str]] | None = None,
            for_domain: str | None = None, dry_run: bool = False, timeout: float = 10.0
            ) -> tuple[Change, BindingRecord]:
    """Bind every endpoint of the devices' IOMMU groups to vfio-pci; refuse (NotAssignable) when the
    pre-flight says no. Returns the change and the record of original drivers."""
    reqs = _parse_addresses(addresses)
    users = _users(domains, for_domain)
    report, f = _report(host, host.read(read_patterns()), reqs, users)
    if not report.assignable:
        raise NotAssignable(host.name, ", ".join(str(a) for a in reqs), list(report.reasons), report)
    targets: list[PciAddress] = []
    for d in report.devices:
        for m in d.members:
            if m.is_bridge or m.address in targets:
                continue
            if f.vgpu_type(m.address) is not None:
                continue      # a vGPU 17+ VF is already a VFIO device under nvidia: never rebind it
            targets.append(m.address)
    bindings: list[Binding] = []
    ops: list[Op] = []
    for a in targets:
        drv = f.driver(a)
        if drv == VFIO:
            continue
        bindings.append(Binding(a, drv, f.override(a)))
        ops += _bind_ops(a, drv, timeout)
    record = BindingRecord(host.name, tuple(bindings))
    data = {"devices": [str(a) for a in reqs], "bind": [b.to_dict() for b in bindings], "report": report}
    target = ",".join(str(a) for a in reqs)
    if not ops:
        return Change(host.name, "iommu.prepare", target, changed=False, dry_run=dry_run, data=data,
                      message="every endpoint is already bound to vfio-pci"), record
    if dry_run:
        return Change(host.name, "iommu.prepare", target, changed=True, dry_run=True, ops=tuple(ops), data=data,
                      message=f"would bind {len(bindings)} device(s) to vfio-pci"), record
    note(host.name, "iommu.prepare", target, "bind " + ", ".join(f"{b.address} (from {b.original_driver})"
                                                                  for b in bindings))
    batch = host.apply(ops, on_error="continue")
    failed = [r for r in batch.results if not r.ok and not r.skipped]
    if failed:
        # Undo the devices that did move (and the half-moved one): a failure leaves the host as it was.
        bad_groups = {r.op.group for r in failed}
        undo: list[Op] = []
        for b in bindings:
            now = VFIO if f"bind:{b.address}" not in bad_groups else None
            undo += _release_ops(b.address, now, b, timeout)
        if undo:
            note(host.name, "iommu.prepare", target, "rolling back the vfio-pci binding")
            host.apply(undo, on_error="continue")
        raise error_for(host.name, failed[0].op.path or target, failed[0], what="binding to vfio-pci")
    return Change(host.name, "iommu.prepare", target, changed=True, ops=tuple(ops), data=data,
                  message=f"bound {len(bindings)} device(s) to vfio-pci"), record


def release(host: Host, record: BindingRecord | Sequence[str | PciAddress], *,
            domains: Iterable[tuple[str, str]] | None = None, dry_run: bool = False,
            timeout: float = 10.0) -> Change:
    """Give devices back to their original drivers (from the record). Without a record (a list
    of addresses) the override is cleared and the kernel probes the device's default driver."""
    if isinstance(record, BindingRecord):
        bindings = list(record.bindings)
        probe_default = False
    else:
        bindings = [Binding(a, None) for a in _parse_addresses(record)]
        probe_default = True
    users = _users(domains, None)
    snap = host.read([f"{sysfs.PCI}/{b.address}/{x}" for b in bindings for x in ("driver", "driver_override", "class")])
    ops: list[Op] = []
    done: list[str] = []
    for b in bindings:
        a = b.address
        if not snap.has(f"{sysfs.PCI}/{a}/class"):
            raise DeviceError(host.name, str(a), "no such PCI device (was it removed?)")
        if a in users:
            raise DeviceBusy(host.name, str(a), f"still used by domain {', '.join(users[a])}")
        cur = snap.link_name(f"{sysfs.PCI}/{a}/driver")
        ov = parse_driver_override(snap.text(f"{sysfs.PCI}/{a}/driver_override"))
        if probe_default:
            if cur != VFIO and ov != VFIO:
                continue
            g = f"release:{a}"
            ops.append(Op.write(f"{sysfs.PCI}/{a}/driver_override", "\n", group=g))
            if cur is not None:
                ops.append(Op.write(sysfs.driver_unbind(DriverName(cur)), str(a), group=g))
            ops.append(Op.write(sysfs.DRIVERS_PROBE, str(a), group=g))
        else:
            if cur == b.original_driver and ov == b.original_override:
                continue
            ops += _release_ops(a, cur, b, timeout)
        done.append(str(a))
    target = ",".join(str(b.address) for b in bindings)
    data = {"devices": done}
    if not ops:
        return Change(host.name, "iommu.release", target, changed=False, dry_run=dry_run, data=data,
                      message="already on the original drivers")
    if dry_run:
        return Change(host.name, "iommu.release", target, changed=True, dry_run=True, ops=tuple(ops), data=data,
                      message=f"would release {len(done)} device(s)")
    note(host.name, "iommu.release", target, "restore " + ", ".join(done))
    batch = host.apply(ops, on_error="continue")
    failed = [r for r in batch.results if not r.ok and not r.skipped]
    if failed:
        raise error_for(host.name, failed[0].op.path or target, failed[0], what="restoring the original driver")
    return Change(host.name, "iommu.release", target, changed=True, ops=tuple(ops), data=data,
                  message=f"released {len(done)} device(s)")
