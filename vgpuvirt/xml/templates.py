"""Templates (``vdi``, ``gaming``, ``compute`` or a user file) and :func:`build_domain`, which fills one.

A template is parsed once per process and deep-copied for each build (parsing is the slow part);
it is filled only through :class:`~vgpuvirt.xml.domain.Domain` edits and the element classes, never
with string formatting, so no caller value can change the document's structure.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import re
import uuid as _uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import DomainName, MacAddress, MdevUuid, PciAddress
from vgpuvirt.xml.domain import Domain, parse_xml
from vgpuvirt.xml.element import Element, GuestAddress
from vgpuvirt.xml.hostdev import HostdevInterface, MdevHostdev, PciHostdev
from vgpuvirt.xml.lint import check
from vgpuvirt.xml.parts import CpuPinning, Disk, EvdevInput, Graphics, Tpm, VirtioNic

TEMPLATES = ("vdi", "gaming", "compute")
_VENDOR_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,12}\Z")
_MACHINE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
_cache: dict[tuple[str, int], Element] = {}


def template_path(name_or_path: str | Path) -> Path:
    """The file for a built-in template name, or the given path (which must exist)."""
    s = str(name_or_path)
    if isinstance(name_or_path, str) and s in TEMPLATES:
        return _builtin_path(s)
    if isinstance(name_or_path, Path) or "/" in s or s.endswith(".xml"):
        p = Path(s)
        if not p.is_file():
            raise InvalidSpec("template file", s, "an existing domain XML file")
        return p
    raise InvalidSpec("template", s, f"one of {', '.join(TEMPLATES)} or the path of a domain XML file")


@functools.cache
def _builtin_path(name: str) -> Path:
    return Path(str(importlib.resources.files("vgpuvirt") / "templates" / f"{name}.xml"))


@functools.cache
def _builtin_root(name: str) -> Element:
    return _parse_template(_builtin_path(name))


def _parse_template(path: Path) -> Element:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidSpec("template file", str(path), f"a readable file ({exc.strerror})") from exc
    root = parse_xml(data)
    if root.tag != "domain":
        raise XmlError(f"template {path}: root element is <{root.tag}>, expected <domain>")
    return root


def load_template(name_or_path: str | Path) -> Domain:
    """A fresh, editable copy of a template: parsed once (per file and modification time), then deep-copied."""
    if isinstance(name_or_path, str) and name_or_path in TEMPLATES:  # shipped files do not change under us
        return Domain(copy.deepcopy(_builtin_root(name_or_path)))
    path = template_path(name_or_path)
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError as exc:
        raise InvalidSpec("template file", str(path), f"a readable file ({exc.strerror})") from exc
    root = _cache.get(key)
    if root is None:
        root = _cache[key] = _parse_template(path)
    return Domain(copy.deepcopy(root))


@dataclass(frozen=True, kw_only=True)
class DomainOptions:
    """Per-build switches. ``None`` keeps what the template says."""

    graphics: str | None = None               # "spice" | "vnc" | "none"
    graphics_listen: str = "127.0.0.1"
    secure_boot: bool = False
    tpm: bool = False
    hyperv: bool | None = None
    hyperv_vendor_id: str | None = None
    kvm_hidden: bool = False
    hugepages: bool | None = None
    host_passthrough: bool | None = None
    threads_per_core: int = 1
    disable_arch_capabilities: bool = False
    virtio_input: bool | None = None
    evdev: tuple[EvdevInput, ...] = ()
    virtio_nics: tuple[VirtioNic, ...] | None = None
    machine: str | None = None
    numa_mode: str = "strict"

    def __post_init__(self) -> None:
        # Scalars of exactly their type (machine=0 or threads_per_core=True is refused, not half-used). The
        # fields are listed once (_scalar_fields): reading every field's annotation for each build was 14%
        # of build_domain's time.
        for name, annotation in _scalar_fields():
            _option_value(name, annotation, getattr(self, name))
        if self.graphics not in (None, "spice", "vnc", "none"):
            raise InvalidSpec("graphics", self.graphics, "spice | vnc | none")
        if self.hyperv_vendor_id is not None and not _VENDOR_ID_RE.match(self.hyperv_vendor_id):
            raise InvalidSpec("hyperv_vendor_id", self.hyperv_vendor_id, "1-12 characters of A-Z a-z 0-9 _ -")
        if not isinstance(self.threads_per_core, int) or not 1 <= self.threads_per_core <= 8:
            raise InvalidSpec("threads_per_core", self.threads_per_core, "an integer 1..8")
        if self.machine is not None and not _MACHINE_RE.match(self.machine):
            raise InvalidSpec("machine type", self.machine, "a QEMU machine type such as q35")
        object.__setattr__(self, "evdev", tuple(EvdevInput(e) if isinstance(e, str) else e for e in self.evdev))
        if self.virtio_nics is not None:
            object.__setattr__(self, "virtio_nics", tuple(self.virtio_nics))

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> DomainOptions:
        """Options from plain data (an Ansible ``domain_options`` dict, JSON): every key must be an option and
        every value of its type (``hugepages: "no"`` is refused, not taken as true), else InvalidSpec."""
        if not isinstance(values, Mapping):
            raise InvalidSpec("domain options", values, "a mapping of option names to values")
        known = {f.name: str(f.type) for f in fields(cls)}
        kw: dict[str, object] = {}
        for key, value in values.items():
            if key not in known:
                raise InvalidSpec("domain option", key, "one of " + ", ".join(sorted(known)))
            kw[str(key)] = _option_value(str(key), known[key], value)
        return cls(**kw)  # type: ignore[arg-type]


_SCALARS: dict[str, type] = {"bool": bool, "int": int, "str": str}


@functools.cache
def _scalar_fields() -> tuple[tuple[str, str], ...]:
    return tuple((f.name, str(f.type)) for f in fields(DomainOptions) if str(f.type).partition(" | ")[0] in _SCALARS)




def _option_value(key: str, annotation: str, value: object) -> object:
    """``value`` checked against a DomainOptions field annotation (``bool | None``, ``tuple[EvdevInput, ...]``)."""
    base, _, none = annotation.partition(" | ")
    if value is None and none == "None":
        return None
    if base in _SCALARS:
        want = _SCALARS[base]
        # bool is an int subclass, and an int is no flag: compare the exact type.
        if type(value) is not want and not (want is int and isinstance(value, int) and not isinstance(value, bool)):
            article = "an" if base == "int" else "a"
            raise InvalidSpec(f"domain option {key}", value, f"{article} {base}{' or null' if none else ''}")
        return value
    item_cls = {"tuple[EvdevInput, ...]": EvdevInput, "tuple[VirtioNic, ...]": VirtioNic}[base]
    if not isinstance(value, (list, tuple)):
        raise InvalidSpec(f"domain option {key}", value, f"a list of {item_cls.__name__} settings")
    items: list[object] = []
    for item in value:
        if isinstance(item, item_cls) or (item_cls is EvdevInput and isinstance(item, str)):
            items.append(item)
            continue
        if not isinstance(item, Mapping):
            raise InvalidSpec(f"domain option {key}", item, f"a mapping of {item_cls.__name__} settings")
        names = {f.name for f in fields(item_cls)}
        if not set(item) <= names:
            raise InvalidSpec(f"domain option {key}", item, "only the keys " + ", ".join(sorted(names)))
        kw = dict(item)
        if item_cls is VirtioNic and isinstance(kw.get("mac"), str):
            kw["mac"] = MacAddress.parse(kw["mac"])
        items.append(item_cls(**kw))
    return tuple(items)


#: The options a build without ``options`` gets (frozen: one instance serves every build).
_DEFAULT_OPTIONS = DomainOptions()


def build_domain(
    template: str | Path,
    *,
    name: DomainName | str,
    memory_mib: int,
    vcpus: int,
    uuid: MdevUuid | str | _uuid.UUID | None = None,
    mdevs: Sequence[MdevHostdev] = (),
    pci: Sequence[PciHostdev] = (),
    nics: Sequence[HostdevInterface] = (),
    disk: Disk | None = None,
    cpu_pinning: CpuPinning | None = None,
    host_cpus: frozenset[int] | None = None,
    numa_node: int | None = None,
    options: DomainOptions | None = None,
    validate: bool = False,
) -> Domain:
    """Fill ``template`` and return the domain; raises InvalidSpec/XmlError before libvirt sees anything."""
    opts = options or _DEFAULT_OPTIONS
    name = DomainName.parse(name)
    for what, seq, cls in (("mdevs", mdevs, MdevHostdev), ("pci", pci, PciHostdev), ("nics", nics, HostdevInterface)):
        for item in seq:
            if not isinstance(item, cls):
                raise InvalidSpec(what, item, f"{cls.__name__} values")
    if cpu_pinning is not None and len(cpu_pinning.vcpu_cpus) != vcpus:
        raise InvalidSpec("CPU pinning", cpu_pinning.vcpu_cpus,
                          f"exactly one host CPU per vCPU ({vcpus}), got {len(cpu_pinning.vcpu_cpus)}")

    dom = load_template(template)
    dom.set_name(name)
    for src in dom.root.iterfind("devices/disk/source[@file]"):
        # A template's disk names each VM's own file ({name}); the same file for every VM would corrupt it.
        src.set("file", src.get("file", "").replace("{name}", str(name)))
    old_uuid = dom.child("uuid")
    if old_uuid is not None:  # a template's UUID would be shared by every VM built from it
        dom.root.remove(old_uuid)
    if uuid is None and any(not p.managed for p in pci):
        uuid = MdevUuid.generate()  # the NVIDIA vGPU 17+ guest driver licenses against the VM UUID
    if uuid is not None:
        dom.set_uuid(MdevUuid.parse(uuid))
    if opts.machine is not None:
        dom.set_machine(opts.machine)
    dom.set_memory_mib(memory_mib)
    dom.set_vcpus(vcpus)

    if opts.secure_boot:
        dom.set_secure_boot(True)
    if opts.hyperv is not None or opts.hyperv_vendor_id is not None:
        on = opts.hyperv if opts.hyperv is not None else True
        dom.set_hyperv(on, opts.hyperv_vendor_id)
    if opts.kvm_hidden:
        dom.set_kvm_hidden(True)
    if opts.host_passthrough is not None:
        dom.set_cpu_mode(opts.host_passthrough)
    cpu = dom.child("cpu")
    if cpu is not None and (cpu.get("mode") == "host-passthrough" or cpu.find("topology") is not None):
        dom.set_topology(vcpus, opts.threads_per_core)
    if opts.disable_arch_capabilities:
        dom.set_cpu_feature("arch-capabilities", "disable")
    if opts.hugepages is not None:
        dom.set_hugepages(opts.hugepages)
    if cpu_pinning is not None:
        dom.set_cpu_pinning(cpu_pinning)
    if numa_node is not None:
        dom.set_numa_node(numa_node, opts.numa_mode)

    if opts.graphics is not None:
        dom.set_graphics(None if opts.graphics == "none" else Graphics(opts.graphics, opts.graphics_listen))
    if opts.tpm:
        dom.set_tpm(Tpm())
    if opts.virtio_input is not None:
        dom.set_virtio_input(opts.virtio_input)
    for ev in opts.evdev:
        dom.add_evdev(ev)
    if opts.virtio_nics is not None:
        dom.set_virtio_nics(opts.virtio_nics)
    if disk is not None:
        dom.add_disk(disk)

    devices: list[MdevHostdev | PciHostdev | HostdevInterface] = [*mdevs, *pci, *nics]
    if any(d.boot_order is not None for d in devices):
        # libvirt refuses per-device <boot order> next to <os><boot dev=...>; the caller's order wins
        os_el = dom.child("os")
        for b in [] if os_el is None else os_el.findall("boot"):
            os_el.remove(b)  # type: ignore[union-attr]
    sources = dom.device_sources()
    for m in mdevs:
        dom.add_device(m, sources=sources)
    for p in place_multifunction(dom, pci):
        dom.add_device(p, sources=sources)
    for n in nics:
        dom.add_device(n, sources=sources)

    check(dom, host_cpus)
    if validate:
        from vgpuvirt.xml.schema import validate as _validate
        _validate(dom)
    return dom


def _is_q35(dom: Domain) -> bool:
    machine = dom.machine or ""
    return "q35" in machine


def place_multifunction(dom: Domain, pci: Sequence[PciHostdev]) -> list[PciHostdev]:
    """Functions of one host device (GPU .0 + audio .1) become one multi-function guest slot, each at its
    host function number (the guest sees the layout it would see on the host: drivers find a GPU's audio,
    USB or UCSI functions at the numbers the hardware gives them).

    Hostdevs with an explicit ``guest_address`` and single-function devices are returned unchanged, and so
    is a group without function 0 (a guest slot must have a function 0: libvirt then gives each function a
    slot of its own, as it does by default). A group gets a new ``pcie-root-port`` on q35 (or a free slot on
    bus 0 elsewhere), ``multifunction='on'`` on function 0.
    """
    groups: dict[tuple[int, int, int], list[PciHostdev]] = defaultdict(list)
    for p in pci:
        if p.guest_address is None and not p.unassigned:
            groups[p.address.device_slot].append(p)
    placed: dict[PciAddress, PciHostdev] = {}
    next_slot = 0x10
    for members in groups.values():
        if len(members) < 2 or not any(p.address.function == 0 for p in members):
            continue
        members.sort(key=lambda p: p.address.function)
        if _is_q35(dom):
            bus, slot = dom.add_pcie_root_port(), 0
        else:
            used = dom.used_guest_slots(0)
            while next_slot in used:
                next_slot += 1
            if next_slot > 0x1F:
                raise XmlError("no free PCI slot on bus 0 for a multi-function device")
            bus, slot = 0, next_slot
            next_slot += 1
        for p in members:
            fn = p.address.function
            ga = GuestAddress(PciAddress(0, bus, slot, fn), multifunction=fn == 0)
            placed[p.address] = replace(p, guest_address=ga)
    return [placed.get(p.address, p) if p.guest_address is None and not p.unassigned else p for p in pci]

