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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import AlreadyExists, DeviceBusy, DeviceError, DeviceNotFound, NoCapacity
from vgpuvirt.host.base import Host, Op, OpResult, Snapshot
from vgpuvirt.model import PciAddress, VgpuTypeId
from vgpuvirt.services.inventory.parts import VendorType, VendorVf
from vgpuvirt.services.mutation import (
    Change,
    ItemResult,
    Outcome,
    Planned,
    apply_items,
    apply_slots,
    dry_results,
    error_for,
    require_unique,
    result_of,
)
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.pci.parsers import parse_creatable_vgpu_types, pci_or_none
from vgpuvirt.xml.refs import domain_device_refs


def read_patterns(addresses: Iterable[PciAddress] | None = None) -> list[str]:
    globs = [str(a) for a in addresses] if addresses is not None else ["*"]
    out: list[str] = []
    for g in globs:
        out += [sysfs.vf_type(g), sysfs.vf_creatable(g), sysfs.pci(g, "physfn")]
    return out


def vfs_from_snapshot(snap: Snapshot) -> list[VendorVf]:
    out: list[VendorVf] = []
    for path in snap.glob(sysfs.vf_type("*")):
        dev = path.split("/")[5]
        addr = pci_or_none(dev)
        if addr is None:
            continue
        cur = snap.int(path)
        physfn = pci_or_none(snap.link_name(sysfs.pci(dev, "physfn")))
        creatable = [VendorType(i, n) for i, n in parse_creatable_vgpu_types(snap.raw(sysfs.vf_creatable(dev)))]
        out.append(VendorVf(addr, physfn, cur if cur is not None else -1, creatable))
    return sorted(out, key=lambda v: v.address)


def vf_type_path(vf: PciAddress) -> str:
    """The file that holds a VF's vGPU type (0: none)."""
    return sysfs.vf_type(vf)


@dataclass(frozen=True)
class AssignSpec:
    """One vGPU to give a VF: its type, and the VF to use, or a PF (or neither) to pick a free VF from."""

    type: VgpuTypeId
    vf: PciAddress | None = None
    pf: PciAddress | None = None

    @classmethod
    def of(cls, type_id: int | str | VgpuTypeId, *, vf: str | PciAddress | None = None,
           pf: str | PciAddress | None = None) -> AssignSpec:
        return cls(VgpuTypeId.parse(type_id), PciAddress.parse(vf) if vf is not None else None,
                   PciAddress.parse(pf) if pf is not None else None)


def assign_item(host: str, vf: PciAddress, type_id: VgpuTypeId, *, wait_timeout: float,
                data: Mapping[str, Any] | None = None) -> Planned:
    """The locked ops that give one VF a vGPU type. The VF is re-checked to still read 0 under the
    lock (``wait equals 0`` with no wait), so two callers never both take it."""
    t, path, g = type_id, vf_type_path(vf), f"assign:{vf}"
    ops = (Op.wait(path, "equals", "0", timeout=0, group=g),
           Op.write(path, str(t.value), group=g),
           Op.wait(path, "equals", str(t.value), timeout=wait_timeout, group=g))

    def explain(bad: OpResult) -> DeviceError:
        if bad.op == ops[0]:
            return AlreadyExists(host, str(vf), "the VF was configured concurrently")
        return error_for(host, str(vf), bad, what=f"setting vGPU type {t}",
                         overrides={_errno.EIO: NoCapacity, _errno.EINVAL: NoCapacity, _errno.EPERM: AlreadyExists})

    return Planned("vgpu.assign", str(vf), ops, explain,
                   data if data is not None else {"vf": str(vf), "type": t.value},
                   intent=f"set current_vgpu_type {t}", message=f"type {t} set", dry_message=f"would set type {t}")


def release_item(host: str, vf: PciAddress, *, wait_timeout: float, data: Mapping[str, Any] | None = None,
                 intent: str = "release") -> Planned:
    """The locked ops that take a VF's vGPU away: write 0, then wait until it reads back 0 (the
    driver is not always ready at once)."""
    path, g = vf_type_path(vf), f"release:{vf}"
    ops = (Op.write(path, "0", group=g), Op.wait(path, "equals", "0", timeout=wait_timeout, group=g))

    def explain(bad: OpResult) -> DeviceError:
        return error_for(host, str(vf), bad, what="releasing the vGPU (writing 0)",
                         overrides={_errno.EBUSY: DeviceBusy})

    return Planned("vgpu.release", str(vf), ops, explain, data if data is not None else {"vf": str(vf)},
                   intent=intent, message="released", dry_message="would release")


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
        return self.assign_many([AssignSpec.of(type_id, vf=vf, pf=pf)], dry_run=dry_run)[0].unwrap()

    def assign_many(self, specs: Sequence[AssignSpec], *, dry_run: bool = False) -> list[ItemResult]:
        """Give several VFs a vGPU type: per round ONE read and ONE locked batch (a group per VF,
        every VF attempted). A refusal in the first round raises before anything is written; an
        item that lost the race for an auto-picked VF takes the next free one in another round."""
        require_unique("VFs", (s.vf for s in specs if s.vf is not None))
        host = self.host.name
        named = {s.vf for s in specs if s.vf is not None}
        tried: set[PciAddress] = set()
        results: dict[int, ItemResult] = {}
        for attempt in range(self.max_attempts):
            pending = [i for i in range(len(specs)) if i not in results]
            if not pending:
                break
            wanted = [specs[i].vf for i in pending]
            snap = self.host.read(read_patterns([v for v in wanted if v is not None])
                                  if None not in wanted else read_patterns())
            vfs = vfs_from_snapshot(snap)
            busy = tried | named      # never auto-pick a VF another item names or a race took
            planned: dict[int, Planned] = {}
            for i in pending:
                s = specs[i]
                try:
                    target = self._choose(snap, vfs, s.type, s.vf, s.pf, busy)
                except DeviceError as exc:
                    if attempt == 0:
                        raise
                    results[i] = ItemResult(str(s.vf or s.pf or "host"), error=exc)
                    continue
                busy.add(target.address)
                data = {"vf": str(target.address), "physfn": str(target.physfn) if target.physfn else None,
                        "type": s.type.value}
                if target.current_type == s.type.value:
                    results[i] = ItemResult(str(target.address), change=Change(
                        host, "vgpu.assign", str(target.address), changed=False, dry_run=dry_run, data=data,
                        message=f"already type {s.type}"))
                else:
                    planned[i] = assign_item(host, target.address, s.type, wait_timeout=self.wait_timeout, data=data)
            if dry_run or not planned:
                results.update(zip(planned, dry_results(host, list(planned.values())), strict=True))
                continue
            outcomes = apply_items(self.host, list(planned.values()), on_error="continue")
            for (i, item), o in zip(planned.items(), outcomes, strict=True):
                bad = o.failure
                if bad is not None and bad.op == item.ops[0] and specs[i].vf is None:
                    tried.add(PciAddress.parse(item.target))     # lost the race for this VF: pick another
                else:
                    results[i] = result_of(host, o)
        for i, s in enumerate(specs):
            if i not in results:
                results[i] = ItemResult(str(s.pf or "host"), error=NoCapacity(
                    host, str(s.pf or "host"), f"gave up after {self.max_attempts} concurrent races for a free VF "
                                               f"offering vGPU type {s.type}"))
        return [results[i] for i in range(len(specs))]

    def _choose(self, snap: Snapshot, vfs: list[VendorVf], t: VgpuTypeId, want_vf: PciAddress | None,
                want_pf: PciAddress | None, tried: set[PciAddress]) -> VendorVf:
        host = self.host.name
        if want_vf is not None:
            match = [v for v in vfs if v.address == want_vf]
            if not match:
                if snap.has(sysfs.pci(want_vf, "physfn")):
                    raise DeviceNotFound(host, str(want_vf), "this VF has no nvidia/current_vgpu_type: not in NVIDIA "
                                                             "vendor-specific vGPU mode (vGPU 17+, kernel >= 6.8)")
                raise DeviceNotFound(host, str(want_vf), "not an SR-IOV VF (a PF or no such device); the PF is "
                                                         "never given a vGPU type")
            v = match[0]
            if v.current_type not in (0, t.value):
                raise AlreadyExists(host, str(v.address), f"the VF already carries vGPU type {v.current_type}; "
                                                          "release it first")
            if v.current_type == 0 and not v.offers(t.value):
                offered = ", ".join(f"{c.id} ({c.name})" for c in v.creatable_types) or "nothing"
                raise NoCapacity(host, str(v.address), f"vGPU type {t} is not creatable on this VF now "
                                                       f"(creatable: {offered})")
            return v
        pool = [v for v in vfs if want_pf is None or v.physfn == want_pf]
        if want_pf is not None and not pool:
            raise DeviceNotFound(host, str(want_pf), "no VFs in NVIDIA vendor-specific vGPU mode under this PF "
                                                     "(SR-IOV disabled, or a pre-17 driver using mdev)")
        free = [v for v in pool if v.free and v.address not in tried and v.offers(t.value)]
        if not free:
            where = f"under {want_pf}" if want_pf else "on this host"
            raise NoCapacity(host, str(want_pf or "host"), f"no free VF {where} offers vGPU type {t} "
                                                           f"({sum(v.free for v in pool)} free VFs, "
                                                           f"{len(pool)} VFs in all)")
        return free[0]

    def release(self, vf: str | PciAddress, *, dry_run: bool = False,
                domains: Iterable[tuple[str, str]] | None = None) -> Change:
        """Write 0 and wait until it reads back 0. A VF already at 0 is unchanged."""
        return self.release_many([vf], dry_run=dry_run, domains=domains)[0].unwrap()

    def release_many(self, vfs: Iterable[str | PciAddress], *, dry_run: bool = False,
                     domains: Iterable[tuple[str, str]] | None = None) -> list[ItemResult]:
        """Release several VFs: ONE read, ONE locked batch (a group per VF, every VF attempted).
        A VF a domain uses is refused (DeviceBusy) before anything is written."""
        addrs = [PciAddress.parse(v) for v in vfs]
        require_unique("VFs", addrs)
        host = self.host.name
        refs = [(name, domain_device_refs(xml).pci) for name, xml in (domains or ())]
        found = {v.address: v for v in vfs_from_snapshot(self.host.read(read_patterns(addrs)))}
        slots: list[Planned | ItemResult] = []
        for a in addrs:
            v = found.get(a)
            if v is None:
                raise DeviceNotFound(host, str(a), "not a VF in NVIDIA vendor-specific vGPU mode")
            data = {"vf": str(a), "physfn": str(v.physfn) if v.physfn else None, "type": v.current_type}
            if v.current_type == 0:
                slots.append(ItemResult(str(a), change=Change(host, "vgpu.release", str(a), changed=False,
                                                              dry_run=dry_run, data=data, message="no vGPU type set")))
                continue
            users = sorted(name for name, pci in refs if a in pci)
            if users:
                raise DeviceBusy(host, str(a), f"VF is used by domain(s) {', '.join(users)}")
            slots.append(release_item(host, a, wait_timeout=self.wait_timeout, data=data,
                                      intent=f"release type {v.current_type}"))
        return apply_slots(self.host, slots, self._released, dry_run=dry_run)

    def _released(self, o: Outcome) -> ItemResult:
        bad = o.failure
        if bad is not None and bad.op == o.item.ops[0] and bad.errno == _errno.EPERM:
            # "No vGPU exists on current device": released concurrently; the goal is reached.
            return ItemResult(o.item.target, change=Change(self.host.name, "vgpu.release", o.item.target,
                                                           changed=False, data=o.item.data,
                                                           message="already released"))
        return result_of(self.host.name, o)
