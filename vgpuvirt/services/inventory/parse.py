"""Parsing the inventory snapshot (pure): one pass that groups entries by what they describe, and
the readers that turn one device's entries into a model value.
"""

from __future__ import annotations

import errno as _errno
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Entry, Snapshot
from vgpuvirt.model import MdevUuid, PciAddress, format_cpulist, parse_cpulist
from vgpuvirt.services.inventory.parts import MdevType, PciDevice
from vgpuvirt.services.pci import parsers as P
from vgpuvirt.services.pci import sysfs
from vgpuvirt.xml.refs import domain_device_refs


class Index:
    """One pass over the snapshot, grouping entries by what they describe."""

    def __init__(self, snap: Snapshot) -> None:
        self.pci: dict[str, dict[str, Entry]] = {}
        # PF address -> type id -> static attribute -> entry, as read on one of the PF's VFs
        self.vf_types: dict[str, dict[str, dict[str, Entry]]] = {}
        self.mdev_bus: dict[str, Entry | None] = {}
        self.types: dict[str, dict[str, dict[str, Entry]]] = {}
        self.mdevs: dict[str, dict[str, Entry]] = {}
        self.groups: dict[str, list[str]] = {}
        self.iommu_units: list[str] = []
        self.nvidia_version: str | None = snap.text(sysfs.NVIDIA_VERSION)
        self.cmdline: str | None = snap.text(sysfs.PROC_CMDLINE)
        groups_entry = snap.get(sysfs.IOMMU_GROUPS)
        #: /sys/kernel/iommu_groups itself ("dir"), None when the snapshot does not hold it (absent, or not
        #: asked for: a snapshot cannot tell these apart, so nothing is claimed then)
        self.iommu_groups_dir: str | None = groups_entry.kind if groups_entry is not None else None
        pci, mdev_bus, mdevs = sysfs.PCI + "/", sysfs.MDEV_BUS + "/", sysfs.MDEV_DEVICES + "/"
        groups = sysfs.IOMMU_GROUPS + "/"
        types_dir, n_types_dir = "mdev_supported_types/", len("mdev_supported_types/")
        last_parent, parent_types = "", {}    # paths come grouped by parent: skip re-finding its dict
        for path, entry in snap.items():
            if path.startswith(mdev_bus):      # the most paths: every type's available_instances
                parent, _, rest = path[len(mdev_bus):].partition("/")
                if not rest:
                    self.mdev_bus[parent] = entry
                elif rest.startswith(types_dir):
                    t, _, name = rest[n_types_dir:].partition("/")
                    if t and name and "/" not in name:
                        if parent != last_parent:
                            self.mdev_bus.setdefault(parent, None)
                            last_parent, parent_types = parent, self.types.setdefault(parent, {})
                        attrs = parent_types.get(t)
                        if attrs is None:
                            attrs = parent_types[t] = {}
                        attrs[name] = entry
            elif path.startswith(pci):
                dev, _, attr = path[len(pci):].partition("/")
                if attr.startswith("virtfn") and types_dir in attr:
                    _vf, _, rest = attr.partition("/")
                    t, _, name = rest[n_types_dir:].partition("/")
                    if rest.startswith(types_dir) and t and name and "/" not in name:
                        self.vf_types.setdefault(dev, {}).setdefault(t, {})[name] = entry
                    continue
                self.pci.setdefault(dev, {})[attr] = entry
            elif path.startswith(mdevs):
                uuid, _, attr = path[len(mdevs):].partition("/")
                self.mdevs.setdefault(uuid, {})[attr] = entry
            elif path.startswith(groups):
                gid, _, rest = path[len(groups):].partition("/")
                kind, _, member = rest.partition("/")
                if kind == "devices" and member and "/" not in member:
                    self.groups.setdefault(gid, []).append(member)
            elif path.startswith(sysfs.IOMMU_CLASS + "/") and path.count("/") == 4:
                self.iommu_units.append(path.rsplit("/", 1)[1])


def entry_text(e: Entry | None) -> str | None:
    return e.text.strip() if e is not None and e.text is not None else None


def entry_link(e: Entry | None) -> str | None:
    return e.target.rstrip("/").rpartition("/")[2] if e is not None and e.target else None


def entry_int(e: Entry | None) -> int | None:
    t = entry_text(e)
    if t is None:
        return None
    digits = t[1:] if t[:1] == "-" else t
    return int(t) if 0 < len(digits) <= 12 and digits.isascii() and digits.isdigit() else None


def errno_text(e: Entry | None) -> str | None:
    if e is None or e.kind != "error":
        return None
    code = e.errno or 0
    return f"{_errno.errorcode.get(code, str(code))} ({code})"


def _upstream(link: Entry | None, own: PciAddress) -> PciAddress | None:
    if link is None or not link.target:
        return None
    parts = [p for p in link.target.split("/") if p]
    if len(parts) >= 2:
        up = P.pci_or_none(parts[-2])
        if up is not None and up != own:
            return up
    return None


def read_pci_device(addr: PciAddress, attrs: dict[str, Entry]) -> PciDevice:
    virtfns: list[tuple[int, PciAddress]] = []
    for key, e in attrs.items():
        if key.startswith("virtfn") and key[6:].isascii() and key[6:].isdigit():
            vf = P.pci_or_none(entry_link(e))
            if vf is not None:
                virtfns.append((int(key[6:]), vf))
    cpulist = _normal_cpulist(entry_text(attrs.get("local_cpulist")))
    boot_vga = entry_text(attrs.get("boot_vga"))
    return PciDevice(
        address=addr,
        vendor=P.parse_hex_id(entry_text(attrs.get("vendor"))),
        device=P.parse_hex_id(entry_text(attrs.get("device"))),
        pci_class=P.parse_hex_id(entry_text(attrs.get("class"))),
        driver=entry_link(attrs.get("driver")),
        iommu_group=int_name(entry_link(attrs.get("iommu_group"))),
        numa_node=P.parse_numa_node(entry_text(attrs.get("numa_node"))),
        physfn=P.pci_or_none(entry_link(attrs.get("physfn"))),
        virtfns=[vf for _, vf in sorted(virtfns)],
        sriov_totalvfs=entry_int(attrs.get("sriov_totalvfs")),
        sriov_numvfs=entry_int(attrs.get("sriov_numvfs")),
        subsystem_vendor=P.parse_hex_id(entry_text(attrs.get("subsystem_vendor"))),
        subsystem_device=P.parse_hex_id(entry_text(attrs.get("subsystem_device"))),
        driver_override=P.parse_driver_override(entry_text(attrs.get("driver_override"))),
        reset_methods=P.parse_reset_methods(entry_text(attrs.get("reset_method"))),
        local_cpulist=cpulist,
        boot_vga=None if boot_vga is None else boot_vga == "1",
        upstream=_upstream(attrs.get(""), addr),
    )


@lru_cache(maxsize=1024)   # every VF of a GPU has its GPU's local_cpulist
def _normal_cpulist(cpus: str | None) -> str | None:
    try:
        return format_cpulist(parse_cpulist(cpus)) if cpus else None
    except InvalidSpec:
        return cpus


def int_name(name: str | None) -> int | None:
    return int(name) if name is not None and name.isdigit() else None


TypeKey = tuple[str, Entry | None, Entry | None, Entry | None, Entry | None, int]


def read_mdev_type(type_id: str, attrs: dict[str, Entry], shared: dict[str, Entry] | None, instances: int,
               seen: dict[TypeKey, MdevType]) -> MdevType:
    """A type from its own attributes; the static ones it lacks come from ``shared`` (its PF's sampled VF).

    Entries are tuples, so equal reads share one frozen MdevType through ``seen`` (one build's memo):
    the 32 VFs of a GPU mostly agree.
    """
    get = attrs.get
    name, desc, api = get("name"), get("description"), get("device_api")
    if shared is not None:
        name = name or shared.get("name")
        desc = desc or shared.get("description")
        api = api or shared.get("device_api")
    key = (type_id, name, desc, api, get("available_instances"), instances)
    t = seen.get(key)
    if t is None:
        fields = _type_static(type_id, entry_text(name), entry_text(desc) or None, entry_text(api))
        t = seen[key] = MdevType(**fields, available_instances=entry_int(key[4]), instances=instances)
    return t


@lru_cache(maxsize=4096)
def _type_static(type_id: str, name: str | None, desc: str | None, device_api: str | None) -> dict[str, Any]:
    # One GPU's 32 VFs show the same 20 types: each distinct description is parsed once.
    nv = P.parse_nvidia_description(desc)
    gv = P.parse_gvtg_description(desc) if desc and "low_gm_size" in desc else P.GvtgDescription()
    cls = P.classify_vgpu_name(name) if type_id.startswith("nvidia-") else P.VgpuClass()
    return {
        "id": type_id, "name": name, "description": desc, "device_api": device_api,
        "framebuffer_mib": nv.framebuffer_mib, "max_instances": nv.max_instances, "num_heads": nv.num_heads,
        "max_resolution": nv.max_resolution or gv.resolution, "frl": nv.frl, "series": cls.series,
        "mig_backed": cls.mig_backed, "gi_profile": cls.gi_profile, "board": cls.board,
        "gvtg": gv if gv.recognised else None,
    }


_CLASS_NAMES = (("0x0200", "network controller (NIC)"), ("0x02", "network controller (NIC)"),
                ("0x0300", "GPU"), ("0x0302", "GPU"), ("0x03", "display controller"),
                ("0x0403", "audio device"), ("0x04", "multimedia device"), ("0x0c03", "USB controller"),
                ("0x0c80", "serial bus controller"), ("0x01", "storage controller"), ("0x06", "bridge"))


def class_name(pci_class: str | None) -> str:
    c = pci_class or ""
    return next((n for prefix, n in _CLASS_NAMES if c.startswith(prefix)), f"device class {c or 'unknown'}")


@dataclass
class Usage:
    """Which domain uses which mdev / PCI address, from the domains' XML."""

    given: bool = False
    mdev: dict[MdevUuid, str] = field(default_factory=dict)
    pci: dict[PciAddress, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_domains(cls, domains: Iterable[tuple[str, str]] | None) -> Usage:
        u = cls()
        if domains is None:
            return u
        u.given = True
        for name, xml in domains:
            refs = domain_device_refs(xml)
            if refs.error:
                u.warnings.append(f"domain {name}: its XML could not be parsed ({refs.error}); its devices are "
                                  "not counted")
                continue
            for m in refs.mdevs:
                if m in u.mdev and u.mdev[m] != name:
                    u.warnings.append(f"mdev {m} is referenced by two domains: {u.mdev[m]} and {name}")
                u.mdev.setdefault(m, name)
            for a in refs.pci:
                if a in u.pci and u.pci[a] != name:
                    u.warnings.append(f"PCI device {a} is referenced by two domains: {u.pci[a]} and {name}")
                u.pci.setdefault(a, name)
        return u



def pci_key(idx: Index, addr: PciAddress) -> str:
    s = str(addr)
    if s in idx.pci:
        return s
    return next((k for k in idx.pci if P.pci_or_none(k) == addr), s)


def parent_sort_key(name: str) -> tuple[int, Any]:
    a = P.pci_or_none(name)
    return (0, a) if a is not None else (1, name)


@lru_cache(maxsize=4096)
def type_sort_key(type_id: str) -> tuple[str, int, str]:
    # nvidia-36 before nvidia-155 (numeric), unlike mdevctl's plain string order.
    m = re.fullmatch(r"(.*?)(\d+)", type_id)
    return (m[1], int(m[2]), type_id) if m else (type_id, -1, type_id)

