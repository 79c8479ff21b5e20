"""Host inventory in ONE round trip: GPUs, vGPU types and capacity, SR-IOV, IOMMU groups, mdevs, NVIDIA facts.

:func:`inventory` asks the host once: ``host.read(INVENTORY_GLOBS)``, or, when ``nvidia-smi -q -x`` should run
too, ``host.apply([exec nvidia-smi], reads_after=INVENTORY_GLOBS)``, which is still one round trip (one remote
exec over SSH). Everything after that is :func:`build_inventory`, a pure function of the snapshot, so every
format is tested without a host. :meth:`Inventory.to_dict` is the JSON contract of DESIGN.md.
"""

from __future__ import annotations

import errno as _errno
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Entry, Host, Op, OpResult, Snapshot
from vgpuvirt.model import MdevUuid, PciAddress, format_cpulist, parse_cpulist
from vgpuvirt.services import parsers as P
from vgpuvirt.services.nvidia_smi import NVIDIA_SMI_ARGV, NvidiaGpuFacts, parse_nvidia_smi_xml
from vgpuvirt.services.nvml import NvmlReport

PCI = "/sys/bus/pci/devices"
MDEV_BUS = "/sys/class/mdev_bus"
MDEVS = "/sys/bus/mdev/devices"
GROUPS = "/sys/kernel/iommu_groups"
IOMMU_CLASS = "/sys/class/iommu"

_PCI_ATTRS = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class", "driver", "driver_override",
              "numa_node", "iommu_group", "reset_method", "local_cpulist", "boot_vga", "sriov_totalvfs",
              "sriov_numvfs", "sriov_offset", "sriov_stride", "physfn", "virtfn*", "nvidia/*")
#: What a vGPU type says about itself: fixed by the GPU and the driver, the same on every VF of one GPU.
_TYPE_STATIC = ("name", "description", "device_api")

#: Every pattern the inventory reads, in ONE host.read() (the agent expands them host-side).
#: A type's static attributes are read on each parent that is not a VF, and on ONE VF per PF (the
#: agent's ``{1?...}`` guard): on an 8 x 32-VF host that is 552 files instead of 17,664; the VFs' own
#: ``available_instances`` are all read, since they differ.
INVENTORY_GLOBS: tuple[str, ...] = (
    f"{PCI}/*",
    *(f"{PCI}/*/{a}" for a in _PCI_ATTRS),
    *(f"{PCI}/*/virtfn*{{1?mdev_supported_types}}/mdev_supported_types/*/{a}" for a in _TYPE_STATIC),
    f"{MDEV_BUS}/*",
    *(f"{MDEV_BUS}/*{{!physfn}}/mdev_supported_types/*/{a}" for a in _TYPE_STATIC),
    f"{MDEV_BUS}/*/mdev_supported_types/*/available_instances",
    f"{MDEVS}/*",
    f"{MDEVS}/*/mdev_type",
    f"{MDEVS}/*/driver",
    f"{MDEVS}/*/iommu_group",
    f"{MDEVS}/*/nvidia/vgpu_params",
    f"{GROUPS}/*/devices/*",
    f"{IOMMU_CLASS}/*",
    "/sys/module/nvidia/version",
    "/proc/cmdline",
)

Backend = Literal["mdev", "mdev-sriov", "vendor-vfio", "passthrough", "gvtg", "sriov-vf"]

VENDOR_NAMES = {"0x10de": "NVIDIA", "0x8086": "Intel", "0x1002": "AMD", "0x1af4": "Red Hat (virtio)",
                "0x1234": "QEMU"}


# ============================================================================================
# The model
# ============================================================================================


@dataclass(frozen=True)
class PciDevice:
    address: PciAddress
    vendor: str | None
    device: str | None
    pci_class: str | None
    driver: str | None
    iommu_group: int | None
    numa_node: int | None
    physfn: PciAddress | None
    virtfns: list[PciAddress]
    sriov_totalvfs: int | None
    sriov_numvfs: int | None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    driver_override: str | None = None
    reset_methods: list[str] | None = None
    local_cpulist: str | None = None
    boot_vga: bool | None = None
    upstream: PciAddress | None = None      # the bridge/root port above it (from the device path)
    domain: str | None = None               # libvirt domain with a <hostdev type='pci'> on it

    @property
    def is_bridge(self) -> bool:
        return (self.pci_class or "").startswith("0x06")

    @property
    def is_gpu(self) -> bool:
        c = self.pci_class or ""
        return c.startswith("0x03") or (c.startswith("0x12") and self.vendor in ("0x10de", "0x1002", "0x8086"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": str(self.address), "vendor": self.vendor, "device": self.device, "class": self.pci_class,
            "driver": self.driver, "iommu_group": self.iommu_group, "numa_node": self.numa_node,
            "physfn": str(self.physfn) if self.physfn else None, "virtfns": [str(v) for v in self.virtfns],
            "sriov_totalvfs": self.sriov_totalvfs, "sriov_numvfs": self.sriov_numvfs,
            "subsystem_vendor": self.subsystem_vendor, "subsystem_device": self.subsystem_device,
            "driver_override": self.driver_override, "reset_methods": self.reset_methods,
            "local_cpulist": self.local_cpulist, "boot_vga": self.boot_vga,
            "upstream": str(self.upstream) if self.upstream else None, "domain": self.domain,
        }


@dataclass(frozen=True)
class MdevType:
    id: str
    name: str | None
    description: str | None
    device_api: str | None
    available_instances: int | None
    framebuffer_mib: int | None = None
    max_instances: int | None = None
    num_heads: int | None = None
    max_resolution: str | None = None
    frl: int | None = None
    series: str | None = None
    mig_backed: bool = False
    gi_profile: str | None = None
    board: str | None = None
    gvtg: P.GvtgDescription | None = None
    instances: int = 0                       # mdevs of this type that exist on this parent

    @property
    def vgpu_type_id(self) -> int | None:
        m = re.fullmatch(r"nvidia-(\d+)", self.id)
        return int(m[1]) if m else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "description": self.description, "device_api": self.device_api,
            "available_instances": self.available_instances, "framebuffer_mib": self.framebuffer_mib,
            "max_instances": self.max_instances, "num_heads": self.num_heads,
            "max_resolution": self.max_resolution, "frl": self.frl, "series": self.series,
            "mig_backed": self.mig_backed, "gi_profile": self.gi_profile, "board": self.board,
            "gvtg": self.gvtg.to_dict() if self.gvtg else None, "instances": self.instances,
        }


@dataclass(frozen=True)
class MdevParent:
    address: str                             # canonical PCI address, or the device name (mtty, matrix)
    types: list[MdevType]
    physfn: PciAddress | None = None

    @property
    def pci(self) -> PciAddress | None:
        return P.pci_or_none(self.address)

    def type(self, type_id: str) -> MdevType | None:
        return next((t for t in self.types if t.id == type_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "types": [t.to_dict() for t in self.types],
                "physfn": str(self.physfn) if self.physfn else None}


@dataclass(frozen=True)
class Mdev:
    uuid: MdevUuid
    parent: str | None
    type: str | None
    domain: str | None = None
    orphan: bool | None = None               # None: no domain list was given, so unknown
    iommu_group: int | None = None
    driver: str | None = None
    vgpu_params: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": str(self.uuid), "parent": self.parent, "type": self.type, "domain": self.domain,
                "orphan": self.orphan, "iommu_group": self.iommu_group, "driver": self.driver,
                "vgpu_params": self.vgpu_params}


@dataclass(frozen=True)
class VendorType:
    id: int
    name: str

    @property
    def classification(self) -> P.VgpuClass:
        return P.classify_vgpu_name(self.name)

    def to_dict(self) -> dict[str, Any]:
        c = self.classification
        return {"id": self.id, "name": self.name, "series": c.series,
                "framebuffer_mib": c.framebuffer_gib * 1024 if c.framebuffer_gib is not None else None,
                "mig_backed": c.mig_backed, "gi_profile": c.gi_profile, "board": c.board}


@dataclass(frozen=True)
class VendorVf:
    address: PciAddress
    physfn: PciAddress | None
    current_type: int
    creatable_types: list[VendorType]
    current_type_name: str | None = None
    domain: str | None = None
    orphan: bool | None = None
    driver: str | None = None
    iommu_group: int | None = None
    read_error: str | None = None            # creatable_vgpu_types could not be read (errno text)

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "physfn": str(self.physfn) if self.physfn else None,
                "current_type": self.current_type, "current_type_name": self.current_type_name,
                "creatable_types": [t.to_dict() for t in self.creatable_types], "domain": self.domain,
                "orphan": self.orphan, "driver": self.driver, "iommu_group": self.iommu_group,
                "read_error": self.read_error}


@dataclass(frozen=True)
class Gpu:
    address: PciAddress
    vendor: str | None
    device: str | None
    driver: str | None
    backend: Backend
    numa_node: int | None
    vfs: list[PciAddress]
    vendor_name: str | None = None
    pci_class: str | None = None
    iommu_group: int | None = None
    group_peers: list[PciAddress] = field(default_factory=list)
    functions: list[PciAddress] = field(default_factory=list)   # other functions of the same card (audio, USB)
    local_cpulist: str | None = None
    reset_methods: list[str] | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    vgpus_in_use: int = 0
    domain: str | None = None
    boot_vga: bool | None = None
    nvidia: NvidiaGpuFacts | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str | None:
        return self.nvidia.product_name if self.nvidia else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": str(self.address), "vendor": self.vendor, "vendor_name": self.vendor_name,
            "device": self.device, "class": self.pci_class, "name": self.name, "driver": self.driver,
            "backend": self.backend, "numa_node": self.numa_node, "local_cpulist": self.local_cpulist,
            "iommu_group": self.iommu_group, "group_peers": [str(a) for a in self.group_peers],
            "functions": [str(a) for a in self.functions], "reset_methods": self.reset_methods,
            "sriov_totalvfs": self.sriov_totalvfs, "sriov_numvfs": self.sriov_numvfs,
            "vfs": [str(v) for v in self.vfs], "vgpus_in_use": self.vgpus_in_use, "domain": self.domain,
            "boot_vga": self.boot_vga, "nvidia": self.nvidia.to_dict() if self.nvidia else None,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Inventory:
    host: str
    iommu_enabled: bool
    pci_devices: list[PciDevice]
    iommu_groups: dict[int, list[PciAddress]]
    mdev_parents: list[MdevParent]
    mdevs: list[Mdev]
    vendor_vgpu: list[VendorVf]
    gpus: list[Gpu]
    warnings: list[str]
    iommu_units: list[str] = field(default_factory=list)
    nvidia_driver_version: str | None = None
    sources: dict[str, str] = field(default_factory=dict)

    # -- lookups -------------------------------------------------------------------------
    def device(self, address: str | PciAddress) -> PciDevice | None:
        a = PciAddress.parse(address)
        return next((d for d in self.pci_devices if d.address == a), None)

    def gpu(self, address: str | PciAddress) -> Gpu | None:
        a = PciAddress.parse(address)
        return next((g for g in self.gpus if g.address == a), None)

    def mdev_parent(self, name: str) -> MdevParent | None:
        a = P.pci_or_none(name)
        key = str(a) if a else name
        return next((p for p in self.mdev_parents if p.address == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "iommu_enabled": self.iommu_enabled,
            "pci_devices": [d.to_dict() for d in self.pci_devices],
            "iommu_groups": {str(g): [str(a) for a in members] for g, members in sorted(self.iommu_groups.items())},
            "mdev_parents": [p.to_dict() for p in self.mdev_parents],
            "mdevs": [m.to_dict() for m in self.mdevs],
            "vendor_vgpu": [v.to_dict() for v in self.vendor_vgpu],
            "gpus": [g.to_dict() for g in self.gpus],
            "warnings": list(self.warnings),
            "iommu_units": list(self.iommu_units),
            "nvidia_driver_version": self.nvidia_driver_version,
            "sources": dict(self.sources),
        }


# ============================================================================================
# Reading the host (the only I/O: one round trip)
# ============================================================================================


def _nvml_wanted(host: Host, use_nvml: bool | None) -> bool:
    from vgpuvirt.host.local import LocalHost

    local_root = isinstance(host, LocalHost) and host.sysfs_root == "/"
    if use_nvml and not local_root:
        raise InvalidSpec("use_nvml", use_nvml,
                          "NVML only on LocalHost reading the real / (it describes the machine we run on)")
    return local_root if use_nvml is None else use_nvml


def inventory(host: Host, *, domains: Iterable[tuple[str, str]] | None = None, use_nvml: bool | None = None,
              nvidia_smi: bool | None = None) -> Inventory:
    """Inventory ``host`` in ONE round trip.

    ``domains``: (name, XML) pairs of the libvirt domains, to join mdevs/PCI devices with the domains that use
    them and flag orphans. ``use_nvml``: None = when the host is this machine and pynvml is installed;
    True = required (``MissingDependency`` without pynvml); False = never. ``nvidia_smi``: run
    ``nvidia-smi -q -x`` in the same round trip; None = when NVML is not used and the host reads its real
    ``/`` (with another sysfs_root the tree is not the machine nvidia-smi would describe).
    """
    nvml_report: NvmlReport | None = None
    if _nvml_wanted(host, use_nvml):
        from vgpuvirt.services import nvml as nvml_mod

        module = nvml_mod.load_pynvml(required=bool(use_nvml))
        if module is not None:
            nvml_report = nvml_mod.collect(module)
    if nvidia_smi is None:
        nvidia_smi = host.sysfs_root == "/" and not (nvml_report and nvml_report.available)
    smi: OpResult | None = None
    if nvidia_smi:
        # One exec: nvidia-smi first, then the sysfs reads, in the same agent request. A missing
        # nvidia-smi (ENOENT, rc 127) is normal; lock=False because nothing is changed.
        batch = host.apply([Op.exec(NVIDIA_SMI_ARGV, timeout=60.0, read_only=True)], lock=False, on_error="continue",
                           reads_after=INVENTORY_GLOBS)
        snap, smi = batch.after, batch[0]
    else:
        snap = host.read(INVENTORY_GLOBS)
    return build_inventory(snap, host=host.name, domains=domains, nvidia_smi=smi, nvml=nvml_report)


# ============================================================================================
# Parsing the snapshot (pure)
# ============================================================================================


class _Index:
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
        self.nvidia_version: str | None = snap.text("/sys/module/nvidia/version")
        self.cmdline: str | None = snap.text("/proc/cmdline")
        pci, mdev_bus, mdevs, groups = PCI + "/", MDEV_BUS + "/", MDEVS + "/", GROUPS + "/"
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
            elif path.startswith(IOMMU_CLASS + "/") and path.count("/") == 4:
                self.iommu_units.append(path.rsplit("/", 1)[1])


def _text(e: Entry | None) -> str | None:
    return e.text.strip() if e is not None and e.text is not None else None


def _link_name(e: Entry | None) -> str | None:
    return e.target.rstrip("/").rpartition("/")[2] if e is not None and e.target else None


def _int(e: Entry | None) -> int | None:
    t = _text(e)
    if t is None:
        return None
    digits = t[1:] if t[:1] == "-" else t
    return int(t) if 0 < len(digits) <= 12 and digits.isascii() and digits.isdigit() else None


def _errno_text(e: Entry | None) -> str | None:
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


def _pci_device(addr: PciAddress, attrs: dict[str, Entry]) -> PciDevice:
    virtfns: list[tuple[int, PciAddress]] = []
    for key, e in attrs.items():
        if key.startswith("virtfn") and key[6:].isascii() and key[6:].isdigit():
            vf = P.pci_or_none(_link_name(e))
            if vf is not None:
                virtfns.append((int(key[6:]), vf))
    cpulist = _normal_cpulist(_text(attrs.get("local_cpulist")))
    boot_vga = _text(attrs.get("boot_vga"))
    return PciDevice(
        address=addr,
        vendor=P.parse_hex_id(_text(attrs.get("vendor"))),
        device=P.parse_hex_id(_text(attrs.get("device"))),
        pci_class=P.parse_hex_id(_text(attrs.get("class"))),
        driver=_link_name(attrs.get("driver")),
        iommu_group=_int_name(_link_name(attrs.get("iommu_group"))),
        numa_node=P.parse_numa_node(_text(attrs.get("numa_node"))),
        physfn=P.pci_or_none(_link_name(attrs.get("physfn"))),
        virtfns=[vf for _, vf in sorted(virtfns)],
        sriov_totalvfs=_int(attrs.get("sriov_totalvfs")),
        sriov_numvfs=_int(attrs.get("sriov_numvfs")),
        subsystem_vendor=P.parse_hex_id(_text(attrs.get("subsystem_vendor"))),
        subsystem_device=P.parse_hex_id(_text(attrs.get("subsystem_device"))),
        driver_override=P.parse_driver_override(_text(attrs.get("driver_override"))),
        reset_methods=P.parse_reset_methods(_text(attrs.get("reset_method"))),
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


def _int_name(name: str | None) -> int | None:
    return int(name) if name is not None and name.isdigit() else None


_TypeKey = tuple[str, Entry | None, Entry | None, Entry | None, Entry | None, int]


def _mdev_type(type_id: str, attrs: dict[str, Entry], shared: dict[str, Entry] | None, instances: int,
               seen: dict[_TypeKey, MdevType]) -> MdevType:
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
        fields = _type_static(type_id, _text(name), _text(desc) or None, _text(api))
        t = seen[key] = MdevType(**fields, available_instances=_int(key[4]), instances=instances)
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
class _Usage:
    """Which domain uses which mdev / PCI address, from the domains' XML."""

    given: bool = False
    mdev: dict[MdevUuid, str] = field(default_factory=dict)
    pci: dict[PciAddress, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_domains(cls, domains: Iterable[tuple[str, str]] | None) -> _Usage:
        u = cls()
        if domains is None:
            return u
        u.given = True
        for name, xml in domains:
            refs = P.domain_device_refs(xml)
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


def _smi_facts(result: OpResult | None, warnings: list[str], sources: dict[str, str]
               ) -> tuple[dict[PciAddress, NvidiaGpuFacts], str | None]:
    if result is None:
        sources["nvidia_smi"] = "not run"
        return {}, None
    if result.rc == 127 or result.errno == _errno.ENOENT:
        sources["nvidia_smi"] = "not installed"
        return {}, None
    if not result.ok:
        tail = (result.stderr or result.stdout or result.error or "").strip().splitlines()[-1:]
        sources["nvidia_smi"] = f"failed (exit {result.rc})"
        warnings.append(f"nvidia-smi -q -x failed (exit {result.rc}): {' '.join(tail) or 'no output'}")
        return {}, None
    report = parse_nvidia_smi_xml(result.stdout)
    if report.error:
        sources["nvidia_smi"] = "unreadable"
        warnings.append(f"nvidia-smi -q -x: {report.error}")
        return {}, None
    sources["nvidia_smi"] = "ok"
    return {g.address: g for g in report.gpus if g.address is not None}, report.driver_version


def build_inventory(snap: Snapshot, *, host: str = "", domains: Iterable[tuple[str, str]] | None = None,
                    nvidia_smi: OpResult | None = None, nvml: NvmlReport | None = None) -> Inventory:
    """The whole inventory from one snapshot (pure: no host access)."""
    idx = _Index(snap)
    usage = _Usage.from_domains(domains)
    warnings: list[str] = list(usage.warnings)
    sources: dict[str, str] = {"sysfs": "ok"}

    # -- PCI devices -----------------------------------------------------------------------
    devices: dict[PciAddress, PciDevice] = {}
    for name, attrs in idx.pci.items():
        addr = P.pci_or_none(name)
        if addr is None:
            continue
        dev = _pci_device(addr, attrs)
        if dev.address in usage.pci:
            dev = _replace(dev, domain=usage.pci[dev.address])
        devices[addr] = dev
    # physfn (VF -> PF) and virtfnN (PF -> VF) describe the same relation; fill each side from the other.
    for dev in list(devices.values()):
        for vf in dev.virtfns:
            if vf in devices and devices[vf].physfn is None:
                devices[vf] = _replace(devices[vf], physfn=dev.address)
    listed_vfs = {(dev.address, vf) for dev in devices.values() for vf in dev.virtfns}
    for dev in list(devices.values()):
        if dev.physfn is not None and dev.physfn in devices and (dev.physfn, dev.address) not in listed_vfs:
            pf = devices[dev.physfn]
            devices[pf.address] = _replace(pf, virtfns=sorted([*pf.virtfns, dev.address]))

    # -- IOMMU -----------------------------------------------------------------------------
    groups: dict[int, list[PciAddress]] = {}
    for g, members in idx.groups.items():
        gid = _int_name(g)
        pci_members = sorted(a for a in (P.pci_or_none(m) for m in members) if a is not None)
        if gid is not None and pci_members:
            groups[gid] = pci_members
    iommu_enabled = bool(idx.groups) or bool(idx.iommu_units)
    if not iommu_enabled:
        hint = ""
        if idx.cmdline is not None and not re.search(r"\b(intel_iommu=on|amd_iommu=on|iommu=pt)\b", idx.cmdline):
            hint = " (the kernel command line has no intel_iommu=on / amd_iommu=on)"
        warnings.append("IOMMU off: no IOMMU groups" + hint + "; no device can be assigned to a VM with VFIO "
                        "(enable VT-d/AMD-Vi in the firmware and the IOMMU on the kernel command line)")

    # -- mdev types and instances ----------------------------------------------------------
    mdevs: list[Mdev] = []
    for uuid_s, attrs in sorted(idx.mdevs.items()):
        try:
            uuid = MdevUuid.parse(uuid_s)
        except InvalidSpec:
            continue
        link = attrs.get("")
        parent = None
        if link is not None and link.target:
            parts = [p for p in link.target.split("/") if p]
            parent = parts[-2] if len(parts) >= 2 else None
        parent = str(P.pci_or_none(parent)) if P.pci_or_none(parent) else parent
        domain = usage.mdev.get(uuid)
        mdevs.append(Mdev(
            uuid=uuid, parent=parent, type=_link_name(attrs.get("mdev_type")), domain=domain,
            orphan=(domain is None) if usage.given else None,
            iommu_group=_int_name(_link_name(attrs.get("iommu_group"))), driver=_link_name(attrs.get("driver")),
            vgpu_params=_text(attrs.get("nvidia/vgpu_params")) or None,
        ))
    counts: dict[tuple[str | None, str | None], int] = {}
    for m in mdevs:
        counts[(m.parent, m.type)] = counts.get((m.parent, m.type), 0) + 1
    parents: list[MdevParent] = []
    seen_types: dict[_TypeKey, MdevType] = {}
    for name in sorted(idx.mdev_bus, key=_parent_sort_key):
        addr = P.pci_or_none(name)
        key = str(addr) if addr else name
        physfn = devices[addr].physfn if addr is not None and addr in devices else None
        # A VF's static type attributes were read on one VF of its PF (see INVENTORY_GLOBS); its own win.
        shared = idx.vf_types.get(_pci_key(idx, physfn), {}) if physfn is not None else {}
        types = [_mdev_type(t, attrs, shared.get(t), counts.get((key, t), 0), seen_types)
                 for t, attrs in sorted(idx.types.get(name, {}).items(), key=lambda kv: _type_sort_key(kv[0]))]
        parents.append(MdevParent(address=key, types=types, physfn=physfn))
    parent_by_addr = {p.address: p for p in parents}

    # -- NVIDIA vendor-specific VFs (vGPU 17+) ---------------------------------------------
    names_by_id: dict[int, str] = {}
    raw_vfs: list[tuple[PciDevice, int, list[VendorType], str | None]] = []
    for addr, dev in sorted(devices.items()):
        attrs = idx.pci.get(_pci_key(idx, addr), {})
        cur_e, cre_e = attrs.get("nvidia/current_vgpu_type"), attrs.get("nvidia/creatable_vgpu_types")
        if cur_e is None and cre_e is None:
            continue
        creatable = [VendorType(i, n) for i, n in P.parse_creatable_vgpu_types(_text(cre_e))]
        for t in creatable:
            names_by_id.setdefault(t.id, t.name)
        err = _errno_text(cre_e) or _errno_text(cur_e)
        if err:
            what = "creatable_vgpu_types" if _errno_text(cre_e) else "current_vgpu_type"
            warnings.append(f"VF {addr}: reading nvidia/{what} failed: {err}")
        raw_vfs.append((dev, _int(cur_e) or 0, creatable, err))

    smi_by_addr, smi_driver = _smi_facts(nvidia_smi, warnings, sources)
    facts: dict[PciAddress, NvidiaGpuFacts] = dict(smi_by_addr)
    if nvml is not None:
        sources["nvml"] = "ok" if nvml.available else f"unavailable ({nvml.error})"
        for f in nvml.gpus:
            if f.address is not None:
                facts[f.address] = f
    else:
        sources["nvml"] = "not used"
    for f in facts.values():
        for info in f.supported_vgpu_types or []:
            if info.get("name"):
                names_by_id.setdefault(int(info["id"]), str(info["name"]))

    vendor_vfs: list[VendorVf] = []
    for dev, cur, creatable, err in raw_vfs:
        domain = usage.pci.get(dev.address)
        vendor_vfs.append(VendorVf(
            address=dev.address, physfn=dev.physfn, current_type=cur, creatable_types=creatable,
            current_type_name=names_by_id.get(cur) if cur else None, domain=domain,
            orphan=(cur != 0 and domain is None) if usage.given else None,
            driver=dev.driver, iommu_group=dev.iommu_group, read_error=err,
        ))
    vendor_by_addr = {v.address: v for v in vendor_vfs}

    # -- GPUs --------------------------------------------------------------------------------
    gpus: list[Gpu] = []
    for addr, dev in sorted(devices.items()):
        if not dev.is_gpu or dev.physfn is not None:
            continue
        vfs = dev.virtfns
        own = parent_by_addr.get(str(addr))
        notes: list[str] = []
        backend: Backend
        if own is not None and own.types:
            gvt = dev.driver == "i915" or any(t.id.startswith("i915-") for t in own.types)
            backend = "gvtg" if gvt else "mdev"
        elif any(str(v) in parent_by_addr for v in vfs):
            backend = "mdev-sriov"
        elif any(v in vendor_by_addr for v in vfs):
            backend = "vendor-vfio"
        elif vfs:
            backend = "sriov-vf"
        else:
            backend = "passthrough"
        in_use = sum(1 for m in mdevs if m.parent in {str(addr), *(str(v) for v in vfs)})
        in_use += sum(1 for v in vfs if v in vendor_by_addr and vendor_by_addr[v].current_type)
        if backend == "passthrough" and dev.vendor == "0x10de" and (dev.sriov_totalvfs or 0) > 0 \
                and not dev.sriov_numvfs and dev.driver == "nvidia":
            notes.append(f"SR-IOV capable ({dev.sriov_totalvfs} VFs) but no VF is enabled: vGPU on this board "
                         f"needs VFs (/usr/lib/nvidia/sriov-manage -e {addr})")
        if dev.driver is None:
            notes.append("no driver bound")
        functions = [a for a, d in devices.items()
                     if a != addr and a.device_slot == addr.device_slot and d.physfn is None]
        peers = [a for a in groups.get(dev.iommu_group, []) if a != addr] if dev.iommu_group is not None else []
        gpus.append(Gpu(
            address=addr, vendor=dev.vendor, device=dev.device, driver=dev.driver, backend=backend,
            numa_node=dev.numa_node, vfs=list(vfs), vendor_name=VENDOR_NAMES.get(dev.vendor or ""),
            pci_class=dev.pci_class, iommu_group=dev.iommu_group, group_peers=peers, functions=sorted(functions),
            local_cpulist=dev.local_cpulist, reset_methods=dev.reset_methods,
            sriov_totalvfs=dev.sriov_totalvfs, sriov_numvfs=dev.sriov_numvfs, vgpus_in_use=in_use,
            domain=dev.domain, boot_vga=dev.boot_vga, nvidia=facts.get(addr), notes=notes,
        ))
        # Sharing a group with the card's own functions or with bridges is normal; anything else means
        # the GPU can only be given to a VM together with it.
        # A peer of unknown class (its attributes were not readable) is not judged.
        strangers = [a for a in peers if a.device_slot != addr.device_slot and a != dev.upstream
                     and a in devices and devices[a].pci_class is not None and not devices[a].is_bridge]
        for a in strangers:
            other = devices.get(a)
            what = class_name(other.pci_class if other else None)
            drv = f", driver {other.driver}" if other and other.driver else ""
            warnings.append(f"GPU {addr} shares its IOMMU group {dev.iommu_group} with {a} ({what}{drv}): "
                            "they can only be assigned to a VM together")

    # -- domains: orphans and dangling references --------------------------------------------
    if usage.given:
        for m in mdevs:
            if m.orphan:
                warnings.append(f"mdev {m.uuid} ({m.type} on {m.parent}) is not used by any libvirt domain "
                                "(orphan)")
        for v in vendor_vfs:
            if v.orphan:
                warnings.append(f"VF {v.address} holds vGPU type {v.current_type} but no libvirt domain uses it "
                                "(orphan)")
        existing = {m.uuid for m in mdevs}
        for u, name in sorted(usage.mdev.items()):
            if u not in existing:
                warnings.append(f"domain {name} uses mdev {u}, which does not exist on this host")
        for a, name in sorted(usage.pci.items()):
            if a not in devices:
                warnings.append(f"domain {name} uses PCI device {a}, which does not exist on this host")

    return Inventory(
        host=host,
        iommu_enabled=iommu_enabled,
        pci_devices=[devices[a] for a in sorted(devices)],
        iommu_groups=dict(sorted(groups.items())),
        mdev_parents=parents,
        mdevs=mdevs,
        vendor_vgpu=vendor_vfs,
        gpus=gpus,
        warnings=warnings,
        iommu_units=sorted(idx.iommu_units),
        nvidia_driver_version=idx.nvidia_version or smi_driver or (nvml.driver_version if nvml else None),
        sources=sources,
    )


def _pci_key(idx: _Index, addr: PciAddress) -> str:
    s = str(addr)
    if s in idx.pci:
        return s
    return next((k for k in idx.pci if P.pci_or_none(k) == addr), s)


def _parent_sort_key(name: str) -> tuple[int, Any]:
    a = P.pci_or_none(name)
    return (0, a) if a is not None else (1, name)


@lru_cache(maxsize=4096)
def _type_sort_key(type_id: str) -> tuple[str, int, str]:
    # nvidia-36 before nvidia-155 (numeric), unlike mdevctl's plain string order.
    m = re.fullmatch(r"(.*?)(\d+)", type_id)
    return (m[1], int(m[2]), type_id) if m else (type_id, -1, type_id)


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


# ============================================================================================
# Capacity per type (for `vgpuvirt types` and placement)
# ============================================================================================


@dataclass(frozen=True)
class TypeCapacity:
    """How many vGPUs of one type one GPU (or one mdev parent) can still take.

    ``exact`` is True for legacy mdev parents (the kernel's own ``available_instances``). On SR-IOV boards
    each VF offers 0 or 1, so the GPU-level figure is the number of free VFs offering the type, capped by
    ``max_instances`` minus the vGPUs already on the GPU when the maximum is known: an upper bound.
    """

    parent: str
    backend: str
    id: str
    name: str | None
    available: int
    max_instances: int | None
    in_use: int
    exact: bool
    free_vfs: int | None = None
    framebuffer_mib: int | None = None
    series: str | None = None
    mig_backed: bool = False
    gi_profile: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"parent": self.parent, "backend": self.backend, "id": self.id, "name": self.name,
                "available_instances": self.available, "max_instances": self.max_instances, "in_use": self.in_use,
                "exact": self.exact, "free_vfs": self.free_vfs, "framebuffer_mib": self.framebuffer_mib,
                "series": self.series, "mig_backed": self.mig_backed, "gi_profile": self.gi_profile}


def _row_of(parent: str, backend: str, t: MdevType) -> TypeCapacity:
    return TypeCapacity(parent=parent, backend=backend, id=t.id, name=t.name,
                        available=t.available_instances or 0, max_instances=t.max_instances, in_use=t.instances,
                        exact=True, framebuffer_mib=t.framebuffer_mib, series=t.series, mig_backed=t.mig_backed,
                        gi_profile=t.gi_profile)


def type_capacity(inv: Inventory, *, parent: str | None = None, available_only: bool = False) -> list[TypeCapacity]:
    """Types with capacity: legacy mdev parents per parent, SR-IOV GPUs per PF (VF figures folded in).

    ``parent``: only that device; a VF address gives that VF's own rows, a PF its folded rows.
    """
    want: str | None = None
    if parent is not None:
        a = P.pci_or_none(parent)
        want = str(a) if a else parent
    rows: list[TypeCapacity] = []
    by_pf: dict[str, list[MdevParent]] = {}
    for p in inv.mdev_parents:
        if p.physfn is not None and want != p.address:
            by_pf.setdefault(str(p.physfn), []).append(p)
            continue
        if want is None or want == p.address:
            gpu = inv.gpu(p.address) if p.pci else None
            backend = gpu.backend if gpu else ("mdev-sriov" if p.physfn else "mdev")
            rows.extend(_row_of(p.address, backend, t) for t in p.types)
    for pf, vfs in sorted(by_pf.items()):
        if want is not None and want != pf:
            continue
        on_gpu = sum(t.instances for v in vfs for t in v.types)
        folded: dict[str, list[MdevType]] = {}
        for v in vfs:
            for t in v.types:
                folded.setdefault(t.id, []).append(t)
        for tid, ts in sorted(folded.items(), key=lambda kv: _type_sort_key(kv[0])):
            t0 = ts[0]
            free = sum(1 for t in ts if (t.available_instances or 0) > 0)
            avail = free if t0.max_instances is None else min(free, max(0, t0.max_instances - on_gpu))
            rows.append(TypeCapacity(parent=pf, backend="mdev-sriov", id=tid, name=t0.name, available=avail,
                                     max_instances=t0.max_instances, in_use=sum(t.instances for t in ts),
                                     exact=False, free_vfs=free, framebuffer_mib=t0.framebuffer_mib,
                                     series=t0.series, mig_backed=t0.mig_backed, gi_profile=t0.gi_profile))
    vendor_by_pf: dict[str, list[VendorVf]] = {}
    for vf in inv.vendor_vgpu:
        if want is not None and want == str(vf.address):
            rows.extend(_vendor_vf_rows(vf))
            continue
        vendor_by_pf.setdefault(str(vf.physfn or vf.address), []).append(vf)
    for pf, vvs in sorted(vendor_by_pf.items()):
        if want is None or want == pf:
            rows.extend(_vendor_pf_rows(inv, pf, vvs))
    if available_only:
        rows = [r for r in rows if r.available > 0]
    return rows



def _vendor_row(parent: str, vt: VendorType, **kw: Any) -> TypeCapacity:
    d = vt.to_dict()
    return TypeCapacity(parent=parent, backend="vendor-vfio", id=str(vt.id), name=vt.name or None,
                        framebuffer_mib=d["framebuffer_mib"], series=d["series"], mig_backed=d["mig_backed"],
                        gi_profile=d["gi_profile"], **kw)


def _vendor_vf_rows(vf: VendorVf) -> list[TypeCapacity]:
    return [_vendor_row(str(vf.address), vt, available=1 if vf.current_type == 0 else 0, max_instances=None,
                        in_use=1 if vf.current_type == vt.id else 0, exact=True)
            for vt in vf.creatable_types]


def _vendor_pf_rows(inv: Inventory, pf: str, vfs: list[VendorVf]) -> list[TypeCapacity]:
    gpu = inv.gpu(pf) if P.pci_or_none(pf) else None
    nv_max: dict[int, int | None] = {}
    if gpu is not None and gpu.nvidia is not None:
        nv_max = {int(t["id"]): t.get("max_instances") for t in gpu.nvidia.supported_vgpu_types or []}
    on_gpu = sum(1 for vf in vfs if vf.current_type)
    seen: dict[int, VendorType] = {}
    for vf in vfs:
        for vt in vf.creatable_types:
            seen.setdefault(vt.id, vt)
    for vf in vfs:
        if vf.current_type and vf.current_type not in seen:
            seen[vf.current_type] = VendorType(vf.current_type, vf.current_type_name or "")
    rows = []
    for type_id, vt in seen.items():
        free = sum(1 for vf in vfs if vf.current_type == 0 and any(c.id == type_id for c in vf.creatable_types))
        mx = nv_max.get(type_id)
        rows.append(_vendor_row(pf, vt, available=free if mx is None else min(free, max(0, mx - on_gpu)),
                                max_instances=mx, in_use=sum(1 for vf in vfs if vf.current_type == type_id),
                                exact=False, free_vfs=free))
    return rows
