"""SR-IOV virtual functions: enable/disable on a PF, wait for the VFs, report VF <-> PF.

The kernel refuses to change a non-zero VF count to another non-zero count (EBUSY), so a change
goes through 0 first, in the same locked batch. VFs in use (bound to vfio-pci, carrying a vGPU
type or mdevs, or named by a domain) are never pulled away unless ``force=True``; a PF that is
passed through whole gets no VFs.

For NVIDIA PFs, ``/usr/lib/nvidia/sriov-manage -e|-d ADDR`` is used when present (it is what the
driver's own service runs); it only ever enables *all* VFs, so another count uses sysfs. The tool
acts on the real /sys, so it is used only when the host's ``sysfs_root`` is ``/``.
"""

from __future__ import annotations

import errno as _errno
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import DeviceBusy, DeviceError, DeviceNotFound, InvalidSpec
from vgpuvirt.host.base import Host, Op, OpResult, Snapshot
from vgpuvirt.model import PciAddress, VfCount
from vgpuvirt.services.mutation import Planned, error_for
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.pci.parsers import parse_hex_id, pci_or_none
from vgpuvirt.xml.refs import domain_device_refs

SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
NVIDIA = "0x10de"
VFIO_DRIVERS = ("vfio-pci",)


@dataclass(frozen=True)
class VfInfo:
    address: PciAddress
    index: int
    driver: str | None
    in_use: str | None = None          # why it is in use, None when free

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "index": self.index, "driver": self.driver, "in_use": self.in_use}


@dataclass(frozen=True)
class PfInfo:
    address: PciAddress
    vendor: str | None
    driver: str | None
    total_vfs: int
    num_vfs: int
    vfs: tuple[VfInfo, ...] = field(default_factory=tuple)
    used_by: tuple[str, ...] = ()      # domains that use the PF itself

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "vendor": self.vendor, "driver": self.driver,
                "sriov_totalvfs": self.total_vfs, "sriov_numvfs": self.num_vfs,
                "vfs": [v.to_dict() for v in self.vfs], "used_by": list(self.used_by)}


def read_patterns(pf: str = "*") -> list[str]:
    base = f"{sysfs.PCI}/{pf}"
    return [f"{base}/sriov_totalvfs", f"{base}/sriov_numvfs", f"{base}/vendor", f"{base}/driver",
            f"{base}/virtfn*", f"{base}/virtfn*/driver", f"{base}/virtfn*/nvidia/current_vgpu_type",
            f"{sysfs.MDEV_DEVICES}/*"]


def _users(domains: Iterable[tuple[str, str]] | None) -> dict[PciAddress, list[str]]:
    users: dict[PciAddress, list[str]] = {}
    for name, xml in domains or ():
        for a in domain_device_refs(xml).pci:
            users.setdefault(a, []).append(name)
    return users


def pfs_from_snapshot(snap: Snapshot, users: dict[PciAddress, list[str]] | None = None) -> list[PfInfo]:
    users = users or {}
    mdev_parents: dict[str, int] = {}
    for link in snap.glob(f"{sysfs.MDEV_DEVICES}/*"):
        target = snap.link(link) or ""
        parent = posixpath.basename(posixpath.dirname(target.rstrip("/")))
        mdev_parents[parent] = mdev_parents.get(parent, 0) + 1
    out: list[PfInfo] = []
    for path in snap.glob(f"{sysfs.PCI}/*/sriov_totalvfs"):
        dev = path.split("/")[5]
        pf = pci_or_none(dev)
        if pf is None:
            continue
        base = f"{sysfs.PCI}/{dev}"
        vfs: list[VfInfo] = []
        for link in snap.glob(f"{base}/virtfn*"):
            m = re.fullmatch(r"virtfn(\d+)", posixpath.basename(link))
            vf = pci_or_none(snap.link_name(link))
            if not m or vf is None:
                continue
            drv = snap.link_name(f"{link}/driver")
            cur = snap.int(f"{link}/nvidia/current_vgpu_type")
            why: str | None = None
            if vf in users:
                why = f"used by domain {', '.join(users[vf])}"
            elif cur:
                why = f"carries vGPU type {cur}"
            elif mdev_parents.get(str(vf)):
                why = f"hosts {mdev_parents[str(vf)]} mdev(s)"
            elif drv in VFIO_DRIVERS:
                why = f"bound to {drv} (passthrough)"
            vfs.append(VfInfo(vf, int(m[1]), drv, why))
        vfs.sort(key=lambda v: v.index)
        out.append(PfInfo(pf, parse_hex_id(snap.text(f"{base}/vendor")), snap.link_name(f"{base}/driver"),
                          snap.int(path) or 0, snap.int(f"{base}/sriov_numvfs") or 0, tuple(vfs),
                          tuple(users.get(pf, ()))))
    return sorted(out, key=lambda p: p.address)


class VendorToolMissing(DeviceError):
    """sriov-manage is not installed on the host (exit 127): the sysfs way is used instead."""


@dataclass(frozen=True)
class VfPlan:
    """A PF's VF count from ``current`` to ``want`` (``changed`` False: it has them already); ``via_tool``: through
    NVIDIA's sriov-manage rather than sysfs."""

    pf: PciAddress
    current: int
    want: int
    total: int
    changed: bool
    via_tool: bool = False

    @property
    def data(self) -> dict[str, Any]:
        return {"pf": str(self.pf), "from": self.current, "to": self.want, "total": self.total,
                "via": "sriov-manage" if self.via_tool else "sysfs"}


class SriovService:
    def __init__(self, host: Host, *, wait_timeout: float = 30.0, vendor_tool: bool | None = None) -> None:
        """``vendor_tool``: None = use sriov-manage for NVIDIA PFs when sysfs_root is /; False = never."""
        self.host = host
        self.wait_timeout = wait_timeout
        self.vendor_tool = vendor_tool

    def report(self, pf: str | PciAddress | None = None,
               domains: Iterable[tuple[str, str]] | None = None) -> list[PfInfo]:
        glob = str(PciAddress.parse(pf)) if pf is not None else "*"
        return pfs_from_snapshot(self.host.read(read_patterns(glob)), _users(domains))

    def _pf(self, pf: PciAddress, domains: Iterable[tuple[str, str]] | None) -> PfInfo:
        snap = self.host.read(read_patterns(str(pf)))
        found = pfs_from_snapshot(snap, _users(domains))
        if not found:
            raise DeviceNotFound(self.host.name, str(pf), "not an SR-IOV capable PF (no sriov_totalvfs)")
        return found[0]

    def plan_count(self, pf: str | PciAddress, count: int | str | VfCount | None = None, *, force: bool = False,
                   domains: Iterable[tuple[str, str]] | None = None) -> VfPlan:
        """What setting the PF's VF count (``None`` = all it supports; 0 disables) takes (one read); refuses
        (nothing changed) a count above sriov_totalvfs, a PF without a driver, a PF passed through whole, and
        VFs in use unless ``force``. The change itself is the change engine's (``vgpuvirt.change.sriov``)."""
        a = PciAddress.parse(pf)
        n = VfCount.parse(count) if count is not None else None
        info = self._pf(a, domains)
        host = self.host.name
        want = info.total_vfs if n is None else n.value
        if want > info.total_vfs:
            raise InvalidSpec("VF count", want, f"0..{info.total_vfs} (sriov_totalvfs of {a})")
        if want == info.num_vfs and (want == 0 or len(info.vfs) >= want):
            return VfPlan(a, info.num_vfs, want, info.total_vfs, changed=False)
        if info.driver is None:
            raise DeviceError(host, str(a), "no driver bound to the PF; the kernel cannot configure SR-IOV (ENOENT)")
        if want and (info.used_by or info.driver in VFIO_DRIVERS):
            why = f"used by domain {', '.join(info.used_by)}" if info.used_by else f"bound to {info.driver}"
            raise DeviceBusy(host, str(a), f"the PF is passed through whole ({why}); it cannot also have VFs")
        busy = [v for v in info.vfs if v.in_use]
        if info.num_vfs and busy and not force:
            lst = "; ".join(f"{v.address} {v.in_use}" for v in busy[:8])
            raise DeviceBusy(host, str(a), f"{len(busy)} VF(s) in use ({lst}); changing the VF count would remove "
                                           "them (pass force=True to do it anyway)")
        return VfPlan(a, info.num_vfs, want, info.total_vfs, changed=True, via_tool=self._use_tool(info, want))

    def _use_tool(self, info: PfInfo, want: int) -> bool:
        if self.vendor_tool is False or info.vendor != NVIDIA:
            return False
        if self.vendor_tool is None and self.host.sysfs_root != "/":
            return False
        return want in (0, info.total_vfs)


def count_item(host: str, pf: PciAddress, current: int, want: int, *, wait_timeout: float = 30.0) -> Planned:
    """The locked sysfs ops that take a PF from ``current`` to ``want`` VFs (through 0: the kernel refuses
    one non-zero count to another), as one batch item; the layouts put it in their batch."""
    path, g = f"{sysfs.PCI}/{pf}/sriov_numvfs", f"sriov:{pf}"
    ops: list[Op] = []
    if current:
        ops += [Op.write(path, "0", group=g), Op.wait(f"{sysfs.PCI}/{pf}/virtfn0", "absent", timeout=wait_timeout,
                                                      group=g)]
    if want:
        ops += [Op.write(path, str(VfCount(want)), group=g),
                Op.wait(f"{sysfs.PCI}/{pf}/virtfn{want - 1}", "exists", timeout=wait_timeout, group=g)]

    def explain(bad: OpResult) -> DeviceError:
        return error_for(host, str(pf), bad, what=f"setting {want} VFs on {pf}", overrides={_errno.ERANGE: DeviceError})

    return Planned("sriov.enable" if want else "sriov.disable", str(pf), tuple(ops), explain,
                   {"pf": str(pf), "from": current, "to": want}, intent=f"{current} -> {want} VFs",
                   message=f"{want} VFs", dry_message=f"would set {want} VFs")


def tool_item(host: str, pf: PciAddress, current: int, want: int, *, wait_timeout: float = 30.0) -> Planned:
    """NVIDIA's own ``sriov-manage`` (what the driver's service runs; it only ever enables ALL VFs) taking a PF from
    ``current`` to ``want`` (0 or all) VFs, as one batch item. A host without the tool answers exit 127: the item's
    error is then :class:`VendorToolMissing`."""
    g = f"sriov:{pf}"
    ops: list[Op] = []
    if want:
        if current:
            ops.append(Op.exec([SRIOV_MANAGE, "-d", str(pf)], timeout=wait_timeout, group=g))
        ops += [Op.exec([SRIOV_MANAGE, "-e", str(pf)], timeout=wait_timeout, group=g),
                Op.wait(f"{sysfs.PCI}/{pf}/virtfn{want - 1}", "exists", timeout=wait_timeout, group=g)]
    else:
        ops += [Op.exec([SRIOV_MANAGE, "-d", str(pf)], timeout=wait_timeout, group=g),
                Op.wait(f"{sysfs.PCI}/{pf}/virtfn0", "absent", timeout=wait_timeout, group=g)]

    def explain(bad: OpResult) -> DeviceError:
        if bad.op.op == "exec" and (bad.rc == 127 or bad.errno == _errno.ENOENT):
            return VendorToolMissing(host, str(pf), f"{SRIOV_MANAGE} is not installed")
        return error_for(host, str(pf), bad, what=f"setting {want} VFs on {pf}", overrides={_errno.ERANGE: DeviceError})

    return Planned("sriov.enable" if want else "sriov.disable", str(pf), tuple(ops), explain,
                   {"pf": str(pf), "from": current, "to": want, "via": "sriov-manage"},
                   intent=f"{current} -> {want} VFs", message=f"{want} VFs", dry_message=f"would set {want} VFs")
