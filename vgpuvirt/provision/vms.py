"""The VMs of a host with their GPUs: what ``vgpuvirt vm list`` prints.

libvirt knows each domain's devices (mdev UUIDs, PCI hostdevs, hostdev interfaces); the host knows what
they are (an mdev's type and parent, a vGPU 17+ VF's current type, a GPU's product name). This module
joins the two (pure: it takes the domains and the inventory the caller read). What the host does not
show (an mdev that is gone, a host that cannot be read) falls back to the domain's vgpuvirt metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vgpuvirt.libvirt_conn import DomainInfo
from vgpuvirt.services.inventory import Inventory
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.hostdev import HostdevInterface, MdevHostdev
from vgpuvirt.xml.provenance import Provenance


@dataclass(frozen=True)
class VmGpu:
    kind: str                    # mdev | pci | nic-vf
    device: str                  # mdev UUID or PCI address
    type: str | None = None      # mdev type id, vGPU 17+ type id, "passthrough", "vf"
    type_name: str | None = None
    parent: str | None = None    # mdev parent / VF's PF

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "type": self.type, "type_name": self.type_name,
                "parent": self.parent}


@dataclass(frozen=True)
class VmInfo:
    name: str
    host: str
    state: str                   # running | shut off
    persistent: bool
    vgpuvirt: bool               # made by vgpuvirt (carries its metadata)
    gpus: tuple[VmGpu, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "state": self.state, "persistent": self.persistent,
                "vgpuvirt": self.vgpuvirt, "gpus": [g.to_dict() for g in self.gpus]}


class _Names:
    """What the inventory says about devices, by address / UUID."""

    def __init__(self, inv: Inventory | None) -> None:
        self.mdevs = {str(m.uuid): m for m in inv.mdevs} if inv else {}
        self.type_names = {(p.address, t.id): t.name for p in inv.mdev_parents for t in p.types} if inv else {}
        self.vfs = {str(v.address): v for v in inv.vendor_vgpu} if inv else {}
        self.gpus = {str(g.address): g for g in inv.gpus} if inv else {}
        self.pci = {str(d.address): d for d in inv.pci_devices} if inv else {}


def _mdev(dev: MdevHostdev, names: _Names, meta: dict[str, dict[str, str]]) -> VmGpu:
    u = str(dev.uuid)
    m = names.mdevs.get(u)
    if m is not None:
        return VmGpu("mdev", u, m.type, names.type_names.get((str(m.parent), str(m.type))), m.parent)
    e = meta.get(u, {})
    return VmGpu("mdev", u, e.get("type"), None, e.get("parent"))


def _pci(address: str, names: _Names, meta: dict[str, dict[str, str]]) -> VmGpu:
    vf = names.vfs.get(address)
    if vf is not None and vf.current_type:
        name = vf.current_type_name or next((t.name for t in vf.creatable_types if t.id == vf.current_type), None)
        return VmGpu("pci", address, str(vf.current_type), name, str(vf.physfn) if vf.physfn else None)
    g = names.gpus.get(address)
    if g is not None:
        return VmGpu("pci", address, "passthrough", g.name or g.vendor_name or g.device, None)
    d = names.pci.get(address)
    if d is not None and d.physfn is not None:
        return VmGpu("pci", address, "vf", None, str(d.physfn))
    e = meta.get(address, {})
    return VmGpu("pci", address, e.get("type") or e.get("kind"), None, None)


def vm_infos(host: str, domains: Sequence[DomainInfo], inv: Inventory | None) -> list[VmInfo]:
    """One VmInfo per domain, in name order (``inv`` None: the host could not be read)."""
    names = _Names(inv)
    out: list[VmInfo] = []
    for d in sorted(domains, key=lambda x: x.name):
        dom = Domain.from_xml(d.xml)
        prov = Provenance.of_domain(dom)
        meta = {str(e.get("uuid") or e.get("vf") or e.get("address")): dict(e) for e in (prov.gpus if prov else ())}
        gpus: list[VmGpu] = []
        for dev in dom.hostdevs():
            if isinstance(dev, MdevHostdev):
                gpus.append(_mdev(dev, names, meta))
            elif isinstance(dev, HostdevInterface):
                gpus.append(VmGpu("nic-vf", str(dev.address), "vf", None,
                                  str(names.pci[str(dev.address)].physfn) if str(dev.address) in names.pci else None))
            else:
                gpus.append(_pci(str(dev.address), names, meta))
        out.append(VmInfo(d.name, host, "running" if d.active else "shut off", d.persistent, prov is not None,
                          tuple(gpus)))
    return out
