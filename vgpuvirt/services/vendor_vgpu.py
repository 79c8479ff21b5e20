"""NVIDIA vGPU 17+ on kernel >= 6.8: a vGPU is a VF whose ``nvidia/current_vgpu_type`` is set.

* assign: check ``creatable_vgpu_types`` lists the type, then write the id; under the lock the
  VF is re-checked to still read 0 (``wait equals 0`` with no wait), so two callers never pick
  the same VF; a lost race re-reads and takes the next free VF.
* release: write 0 and wait until it reads back 0 (the driver is not always ready at once).
* never touch the PF (it has no ``nvidia/`` directory), never rebind the VF from ``nvidia``:
  the nvidia module registers each VF as a VFIO device itself (libvirt: ``managed='no'``).
"""

from __future__ import annotations

import errno as _errno
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import AlreadyExists, DeviceBusy, DeviceNotFound, InvalidSpec, NoCapacity
from vgpuvirt.host.base import Host, Op, Snapshot
from vgpuvirt.model import PciAddress, VgpuTypeId
from vgpuvirt.services.mutation import Change, error_for, first_failure, note
from vgpuvirt.services.parsers import domain_device_refs, parse_creatable_vgpu_types

PCI = "/sys/bus/pci/devices"


@dataclass(frozen=True)
class VendorVf:
    address: PciAddress
    physfn: PciAddress | None
    current_type: int
    creatable: tuple[tuple[int, str], ...] = field(default_factory=tuple)

    @property
    def free(self) -> bool:
        return self.current_type == 0

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "physfn": str(self.physfn) if self.physfn else None,
                "current_type": self.current_type,
                "creatable_types": [{"id": i, "name": n} for i, n in self.creatable]}


def read_patterns(addresses: Iterable[PciAddress] | None = None) -> list[str]:
    globs = [str(a) for a in addresses] if addresses is not None else ["*"]
    out: list[str] = []
    for g in globs:
        out += [f"{PCI}/{g}/nvidia/current_vgpu_type", f"{PCI}/{g}/nvidia/creatable_vgpu_types",
                f"{PCI}/{g}/physfn"]
    return out


def vfs_from_snapshot(snap: Snapshot) -> list[VendorVf]:
    out: list[VendorVf] = []
    for path in snap.glob(f"{PCI}/*/nvidia/current_vgpu_type"):
        dev = path.split("/")[5]
        try:
            addr = PciAddress.parse(dev)
        except InvalidSpec:
            continue
        cur = snap.int(path)
        phys = snap.link(f"{PCI}/{dev}/physfn")
        physfn = None
        if phys:
            try:
                physfn = PciAddress.parse(posixpath.basename(phys.rstrip("/")))
            except InvalidSpec:
                physfn = None
        creatable = tuple(parse_creatable_vgpu_types(snap.raw(f"{PCI}/{dev}/nvidia/creatable_vgpu_types")))
        out.append(VendorVf(addr, physfn, cur if cur is not None else -1, creatable))
    return sorted(out, key=lambda v: v.address)


class VendorVgpuService:
    def __init__(self, host: Host, *, wait_timeout: float = 10.0, max_attempts: int = 8) -> None:
        self.host = host
        self.wait_timeout = wait_timeout
        self.max_attempts = max_attempts

    def vfs(self, pf: str | PciAddress | None = None) -> list[VendorVf]:
        vfs = vfs_from_snapshot(self.host.read(read_patterns()))
        if pf is not None:
            p = PciAddress.parse(pf)
            vfs = [v for v in vfs if v.physfn == p]
        return vfs

    def assign(self, type_id: int | str | VgpuTypeId, *, vf: str | PciAddress | None = None,
               pf: str | PciAddress | None = None, dry_run: bool = False) -> Change:
        """Give one VF the vGPU type: the named ``vf``, or the first free VF (of ``pf``) that
        lists the type. The VF already carrying this type is success, unchanged."""
        t = VgpuTypeId.parse(type_id)
        want_vf = PciAddress.parse(vf) if vf is not None else None
        want_pf = PciAddress.parse(pf) if pf is not None else None
        host = self.host.name
        tried: set[PciAddress] = set()
        for _ in range(self.max_attempts):
            snap = self.host.read(read_patterns([want_vf]) if want_vf else read_patterns())
            vfs = vfs_from_snapshot(snap)
            target = self._choose(snap, vfs, t, want_vf, want_pf, tried)
            data = {"vf": str(target.address), "physfn": str(target.physfn) if target.physfn else None,
                    "type": t.value}
            if target.current_type == t.value:
                return Change(host, "vgpu.assign", str(target.address), changed=False, dry_run=dry_run, data=data,
                              message=f"already type {t}")
            path = f"{PCI}/{target.address}/nvidia/current_vgpu_type"
            g = f"assign:{target.address}"
            ops = [Op.wait(path, "equals", "0", timeout=0, group=g),      # still free, under the lock
                   Op.write(path, str(t.value), group=g),
                   Op.wait(path, "equals", str(t.value), timeout=self.wait_timeout, group=g)]
            if dry_run:
                return Change(host, "vgpu.assign", str(target.address), changed=True, dry_run=True, ops=tuple(ops),
                              data=data, message=f"would set type {t}")
            note(host, "vgpu.assign", str(target.address), f"set current_vgpu_type {t}")
            batch = self.host.apply(ops)
            bad = first_failure(batch)
            if bad is None:
                return Change(host, "vgpu.assign", str(target.address), changed=True, ops=tuple(ops), data=data,
                              message=f"type {t} set")
            if bad.op is ops[0] and want_vf is None:
                tried.add(target.address)      # lost the race for this VF: pick another
                continue
            if bad.op is ops[0]:
                raise AlreadyExists(host, str(target.address), "the VF was configured concurrently")
            raise error_for(host, str(target.address), bad, what=f"setting vGPU type {t}",
                            overrides={_errno.EIO: NoCapacity, _errno.EINVAL: NoCapacity,
                                       _errno.EPERM: AlreadyExists})
        raise NoCapacity(host, str(want_pf or "host"), f"gave up after {self.max_attempts} concurrent races for a "
                                                       f"free VF offering vGPU type {t}")

    def _choose(self, snap: Snapshot, vfs: list[VendorVf], t: VgpuTypeId, want_vf: PciAddress | None,
                want_pf: PciAddress | None, tried: set[PciAddress]) -> VendorVf:
        host = self.host.name
        if want_vf is not None:
            match = [v for v in vfs if v.address == want_vf]
            if not match:
                if snap.has(f"{PCI}/{want_vf}/physfn"):
                    raise DeviceNotFound(host, str(want_vf), "this VF has no nvidia/current_vgpu_type: not in NVIDIA "
                                                             "vendor-specific vGPU mode (vGPU 17+, kernel >= 6.8)")
                raise DeviceNotFound(host, str(want_vf), "not an SR-IOV VF (a PF or no such device); the PF is "
                                                         "never given a vGPU type")
            v = match[0]
            if v.current_type not in (0, t.value):
                raise AlreadyExists(host, str(v.address), f"the VF already carries vGPU type {v.current_type}; "
                                                          "release it first")
            if v.current_type == 0 and t.value not in {i for i, _ in v.creatable}:
                offered = ", ".join(f"{i} ({n})" for i, n in v.creatable) or "nothing"
                raise NoCapacity(host, str(v.address), f"vGPU type {t} is not creatable on this VF now "
                                                       f"(creatable: {offered})")
            return v
        pool = [v for v in vfs if want_pf is None or v.physfn == want_pf]
        if want_pf is not None and not pool:
            raise DeviceNotFound(host, str(want_pf), "no VFs in NVIDIA vendor-specific vGPU mode under this PF "
                                                     "(SR-IOV disabled, or a pre-17 driver using mdev)")
        free = [v for v in pool if v.free and v.address not in tried and t.value in {i for i, _ in v.creatable}]
        if not free:
            where = f"under {want_pf}" if want_pf else "on this host"
            raise NoCapacity(host, str(want_pf or "host"), f"no free VF {where} offers vGPU type {t} "
                                                           f"({sum(v.free for v in pool)} free VFs, "
                                                           f"{len(pool)} VFs in all)")
        return free[0]

    def release(self, vf: str | PciAddress, *, dry_run: bool = False,
                domains: Iterable[tuple[str, str]] | None = None) -> Change:
        """Write 0 and wait until it reads back 0. A VF already at 0 is unchanged."""
        a = PciAddress.parse(vf)
        host = self.host.name
        users = [name for name, xml in (domains or ()) if a in domain_device_refs(xml).pci]
        snap = self.host.read(read_patterns([a]))
        vfs = vfs_from_snapshot(snap)
        if not vfs:
            raise DeviceNotFound(host, str(a), "not a VF in NVIDIA vendor-specific vGPU mode")
        v = vfs[0]
        data = {"vf": str(a), "physfn": str(v.physfn) if v.physfn else None, "type": v.current_type}
        if v.current_type == 0:
            return Change(host, "vgpu.release", str(a), changed=False, dry_run=dry_run, data=data,
                          message="no vGPU type set")
        if users:
            raise DeviceBusy(host, str(a), f"VF is used by domain(s) {', '.join(sorted(users))}")
        path = f"{PCI}/{a}/nvidia/current_vgpu_type"
        ops = [Op.write(path, "0"), Op.wait(path, "equals", "0", timeout=self.wait_timeout)]
        if dry_run:
            return Change(host, "vgpu.release", str(a), changed=True, dry_run=True, ops=tuple(ops), data=data,
                          message="would release")
        note(host, "vgpu.release", str(a), f"release type {v.current_type}")
        batch = self.host.apply(ops)
        bad = first_failure(batch)
        if bad is not None:
            if bad.op is ops[0] and bad.errno == _errno.EPERM:
                # "No vGPU exists on current device": released concurrently; the goal is reached.
                return Change(host, "vgpu.release", str(a), changed=False, data=data, message="already released")
            raise error_for(host, str(a), bad, what="releasing the vGPU (writing 0)",
                            overrides={_errno.EBUSY: DeviceBusy})
        return Change(host, "vgpu.release", str(a), changed=True, ops=tuple(ops), data=data, message="released")
