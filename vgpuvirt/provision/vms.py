"""The VMs of a host with their GPUs: what ``vgpuvirt vm list`` prints.

libvirt knows each domain's devices (mdev UUIDs, PCI hostdevs, hostdev interfaces); the host knows what
they are (an mdev's type and parent, a vGPU 17+ VF's current type, a GPU's product name). This module
joins the two (pure: it takes the domains and the inventory the caller read).

A VM's ``gpus`` are its GPUs only (vGPUs, whole GPUs, GPU VFs); what comes along is listed apart in
``devices`` (a NIC VF, the GPU's HDMI audio function, any other PCI device). A vGPU the domain names but the
host no longer has (an mdev gone after a reboot, a vGPU 17+ VF whose type was cleared) is not a GPU the VM
has: it is listed in ``missing`` (``provision`` again re-creates it). When the host cannot be read at all,
the domain's vgpuvirt metadata stands in and nothing is called missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vgpuvirt.libvirt_conn import DomainInfo
from vgpuvirt.services.inventory.read import Inventory
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
    devices: tuple[VmGpu, ...] = ()    # kind nic-vf | audio | pci: host devices that are not GPUs
    missing: tuple[VmGpu, ...] = ()    # vGPUs the domain names that the host does not have

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "state": self.state, "persistent": self.persistent,
                "vgpuvirt": self.vgpuvirt, "gpus": [g.to_dict() for g in self.gpus],
                "devices": [g.to_dict() for g in self.devices], "missing": [g.to_dict() for g in self.missing]}


class _Names:
    """What the inventory says about devices, by address / UUID."""

    def __init__(self, inv: Inventory | None) -> None:
        self.mdevs = {str(m.uuid): m for m in inv.mdevs} if inv else {}
        self.type_names = {(p.address, t.id): t.name for p in inv.mdev_parents for t in p.types} if inv else {}
        self.vfs = {str(v.address): v for v in inv.vendor_vgpu} if inv else {}
        self.gpus = {str(g.address): g for g in inv.gpus} if inv else {}
        self.pci = {str(d.address): d for d in inv.pci_devices} if inv else {}
        # a GPU's other functions (HDMI audio, USB-C) -> the GPU
        self.companions = {str(f): str(g.address) for g in inv.gpus for f in g.functions
                           if f != g.address} if inv else {}
        self.read = inv is not None


Sorted = tuple[VmGpu, str]      # the device, and where it belongs: gpus | devices | missing

def _mdev(dev: MdevHostdev, names: _Names, meta: dict[str, dict[str, str]]) -> Sorted:
    u = str(dev.uuid)
    m = names.mdevs.get(u)
    if m is not None:
        return VmGpu("mdev", u, m.type, names.type_names.get((str(m.parent), str(m.type))), m.parent), "gpus"
    e = meta.get(u, {})
    return VmGpu("mdev", u, e.get("type"), None, e.get("parent")), "missing" if names.read else "gpus"


def _pci(address: str, names: _Names, meta: dict[str, dict[str, str]]) -> Sorted:
    vf = names.vfs.get(address)
    e = meta.get(address, {})
    if vf is not None:
        parent = str(vf.physfn) if vf.physfn else None
        if not vf.current_type:             # the VF is there, its vGPU type is not (cleared by a reboot)
            return VmGpu("pci", address, e.get("type"), None, parent), "missing"
        name = vf.current_type_name or next((t.name for t in vf.creatable_types if t.id == vf.current_type), None)
        return VmGpu("pci", address, str(vf.current_type), name, parent), "gpus"
    g = names.gpus.get(address)
    if g is not None:
        return VmGpu("pci", address, "passthrough", g.name or g.vendor_name or g.device, None), "gpus"
    d = names.pci.get(address)
    gpu = names.companions.get(address)
    if gpu is not None:
        audio = d is not None and (d.pci_class or "").startswith("0x0403")
        return VmGpu("audio" if audio else "pci", address, None, f"function of GPU {gpu}", gpu), "devices"
    if d is not None and d.physfn is not None:
        # a VF of a GPU (AMD MxGPU, Intel SR-IOV) is a GPU; a VF of anything else (a NIC) is a device
        if str(d.physfn) in names.gpus:
            return VmGpu("pci", address, "vf", None, str(d.physfn)), "gpus"
        return VmGpu("pci", address, "vf", None, str(d.physfn)), "devices"
    if d is not None:
        return VmGpu("pci", address, None, None, None), "devices"
    kind = e.get("type") or e.get("kind")
    # not on the host as read: what vgpuvirt's metadata says it was (a host that could not be read says nothing)
    return VmGpu("pci", address, kind, None, None), "gpus" if kind or not names.read else "devices"


def vm_infos(host: str, domains: Sequence[DomainInfo], inv: Inventory | None) -> list[VmInfo]:
    """One VmInfo per domain, in name order (``inv`` None: the host could not be read)."""
    names = _Names(inv)
    out: list[VmInfo] = []
    for d in sorted(domains, key=lambda x: x.name):
        dom = Domain.from_xml(d.xml)
        prov = Provenance.of_domain(dom)
        meta = {str(e.get("uuid") or e.get("vf") or e.get("address")): dict(e) for e in (prov.gpus if prov else ())}
        found: dict[str, list[VmGpu]] = {"gpus": [], "devices": [], "missing": []}
        for dev in dom.hostdevs():
            if isinstance(dev, MdevHostdev):
                g, where = _mdev(dev, names, meta)
            elif isinstance(dev, HostdevInterface):
                g, where = VmGpu("nic-vf", str(dev.address), "vf", None, str(names.pci[str(dev.address)].physfn)
                                 if str(dev.address) in names.pci else None), "devices"
            else:
                g, where = _pci(str(dev.address), names, meta)
            found[where].append(g)
        out.append(VmInfo(d.name, host, "running" if d.active else "shut off", d.persistent, prov is not None,
                          tuple(found["gpus"]), tuple(found["devices"]), tuple(found["missing"])))
    return out
