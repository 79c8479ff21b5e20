"""Garbage collection: vGPUs no libvirt domain references.

An orphan is an active mdev whose UUID no domain's ``<hostdev type='mdev'>`` names, or a vGPU 17+
VF with a vGPU type set that no domain's PCI hostdev names. Dry run by default: :func:`collect`
only lists them unless ``dry_run=False``; removal is one locked batch (one group per orphan, so
one failure does not stop the rest). Domains whose XML cannot be parsed stop the collection:
deleting on partial knowledge would remove devices that are in use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Host, Op
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.services.mutation import Change, note
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.vgpu import mdev_state
from vgpuvirt.services.vgpu import vendor as vendor_vgpu
from vgpuvirt.xml.refs import domain_device_refs


@dataclass(frozen=True)
class Orphan:
    kind: str            # "mdev" | "vf"
    id: str              # UUID or VF address
    parent: str          # mdev parent or the VF's PF
    type: str            # mdev type id or vGPU type id

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "parent": self.parent, "type": self.type}


def _refs(domains: Iterable[tuple[str, str]]) -> tuple[set[MdevUuid], set[PciAddress]]:
    mdevs: set[MdevUuid] = set()
    pci: set[PciAddress] = set()
    for name, xml in domains:
        r = domain_device_refs(xml)
        if r.error:
            raise InvalidSpec(f"XML of domain {name!r}", r.error, "well-formed domain XML (nothing was removed)")
        mdevs |= r.mdevs
        pci |= r.pci
    return mdevs, pci


def find_orphans(host: Host, domains: Iterable[tuple[str, str]]) -> list[Orphan]:
    """One read: every active mdev and every vendor VF, minus what the domains reference."""
    used_mdevs, used_pci = _refs(domains)
    snap = host.read([f"{sysfs.MDEV_DEVICES}/*", f"{sysfs.MDEV_DEVICES}/*/mdev_type",
                      *vendor_vgpu.read_patterns()])
    out: list[Orphan] = []
    for u, (parent, type_) in sorted(mdev_state.active_from_snapshot(snap).items(), key=lambda kv: str(kv[0])):
        if u not in used_mdevs:
            out.append(Orphan("mdev", str(u), parent, type_))
    for vf in vendor_vgpu.vfs_from_snapshot(snap):
        if vf.current_type > 0 and vf.address not in used_pci:
            out.append(Orphan("vf", str(vf.address), str(vf.physfn or ""), str(vf.current_type)))
    return out


def collect(host: Host, domains: Iterable[tuple[str, str]], *, dry_run: bool = True,
            wait_timeout: float = 10.0) -> Change:
    """Remove orphans (``dry_run=False``) or list what would go (default)."""
    orphans = find_orphans(host, list(domains))
    ops: list[Op] = []
    for o in orphans:
        g = f"gc:{o.id}"
        if o.kind == "mdev":
            dev = f"{sysfs.MDEV_DEVICES}/{o.id}"
            ops += [Op.write(f"{dev}/remove", "1", group=g), Op.wait(dev, "absent", timeout=wait_timeout, group=g)]
        else:
            path = sysfs.vf_type(o.id)
            ops += [Op.write(path, "0", group=g), Op.wait(path, "equals", "0", timeout=wait_timeout, group=g)]
    data: dict[str, Any] = {"orphans": [o.to_dict() for o in orphans]}
    if not ops:
        return Change(host.name, "gc", "host", changed=False, dry_run=dry_run, data=data, message="no orphans")
    if dry_run:
        return Change(host.name, "gc", "host", changed=True, dry_run=True, ops=tuple(ops), data=data,
                      message=f"would remove {len(orphans)} orphan(s)")
    note(host.name, "gc", "host", "removing " + ", ".join(o.id for o in orphans))
    batch = host.apply(ops, on_error="continue")
    failed: dict[str, str] = {}
    for r in batch.results:
        if not r.ok and not r.skipped and r.op.group:
            failed.setdefault(r.op.group[3:], r.error or "failed")
    removed = [o.id for o in orphans if o.id not in failed]
    data.update(removed=removed, failed=failed)
    return Change(host.name, "gc", "host", changed=bool(removed), ops=tuple(ops), data=data,
                  message=f"removed {len(removed)}, failed {len(failed)}")
