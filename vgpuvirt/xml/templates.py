"""Templates (``vdi``, ``gaming``, ``compute`` or a user file) and :func:`build_domain`, which fills one.

A template is parsed once per process. A build then goes in three steps, the first two kept for the next build
that shares their inputs (a pool of desktops differs only in names, UUIDs, disks and which host devices):

1. :func:`_prepare`: the template with every edit that does not depend on the VM's own values;
2. :func:`_shape`: that tree with devices (and a disk) of the request's *shapes* added, placed as they will be,
   and lint's verdict on it;
3. per VM, a deep copy of that tree with the VM's own values stamped in: its name, UUID, disk path and each
   device's identity (``stamp``: the UUID, host address or MAC its ``to_element`` would write).

Values go in only through :class:`~vgpuvirt.xml.domain.Domain` edits and the element classes, never with string
formatting, so no caller value can change the document's structure. tests/unit/test_xml_build_shapes.py holds a
build from a kept shape equal to a build of its own.
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
from vgpuvirt.xml.lint import check, lint, lint_cpus
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
    return Domain(copy.deepcopy(_template_root(_template_key(name_or_path))))


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
        for name, annotation, want, nullable in _scalar_fields():
            value = getattr(self, name)
            if type(value) is not want and not (nullable and value is None):
                _option_value(name, annotation, value)   # refuses it (or takes an int subclass that is no bool)
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
def _scalar_fields() -> tuple[tuple[str, str, type, bool], ...]:
    """(name, annotation, its type, whether None is allowed) of each scalar option."""
    out = []
    for f in fields(DomainOptions):
        base, _, none = str(f.type).partition(" | ")
        if base in _SCALARS:
            out.append((f.name, str(f.type), _SCALARS[base], none == "None"))
    return tuple(out)




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
    if uuid is None and any(not p.managed for p in pci):
        uuid = MdevUuid.generate()  # the NVIDIA vGPU 17+ guest driver licenses against the VM UUID
    devices: list[MdevHostdev | PciHostdev | HostdevInterface] = [*mdevs, *pci, *nics]
    base_args = (_template_key(template), opts, memory_mib, vcpus, cpu_pinning, numa_node, uuid is not None,
                 any(d.boot_order is not None for d in devices))
    try:
        base = _prepared(*base_args)
    except TypeError:
        # an unhashable argument (a list where a number belongs): prepared without the memo, where the edit
        # that takes the value names what is wrong with it
        base = _prepare(*base_args)

    try:
        shaped = _shaped(base, mdevs, pci, nics, disk)
    except TypeError:  # a device or disk value that cannot be hashed: shaped for this build alone
        shaped = _shape(base, mdevs, pci, nics, disk)

    # this VM's own values, stamped into a copy of the tree built for its shape
    dom = Domain(copy.deepcopy(shaped.root))
    dom.root[base.name_at].text = str(name)
    if uuid is not None:
        assert base.uuid_at is not None   # _prepare made it
        dom.root[base.uuid_at].text = str(MdevUuid.parse(uuid))
    children = list(dom.root[base.devices_at])
    for i, j, path in shaped.named_files:
        # A template's disk names each VM's own file ({name}); the same file for every VM would corrupt it.
        # (Not a caller's disk: its path is taken as given.)
        children[i][j].set("file", path.replace("{name}", str(name)))
    stamped = [children[i] for i in shaped.stamped]
    sources = set(base.sources)
    for device, el in zip(devices, stamped, strict=False):
        dom.claim_source(device, sources)
        device.stamp(el)
    if disk is not None:
        disk.stamp(stamped[-1])
    try:
        clean = shaped.clean and _cpus_fit(base, host_cpus)
    except TypeError:   # host CPUs as an unhashable set
        clean = False
    if not clean:
        check(dom, host_cpus)   # each problem, in document order
    if validate:
        from vgpuvirt.xml.schema import validate as _validate
        _validate(dom)
    return dom


@dataclass(frozen=True, eq=False)
class _Prepared:
    """A template with every edit that does not depend on the VM's name, UUID value, disk or devices."""

    root: Element                 # never handed out: each build edits a deep copy
    name_at: int                  # where <name> is among the root's children (only devices are added later)
    uuid_at: int | None           # and <uuid>, where the build gives the VM one
    devices_at: int               # and <devices>
    sources: frozenset[str]       # the hostdev/interface sources the template already has


def _template_key(template: str | Path) -> str | tuple[str, int]:
    """What identifies a template's content: a built-in's name, or a file's path and modification time."""
    if isinstance(template, str) and template in TEMPLATES:  # shipped files do not change under us
        return template
    path = template_path(template)
    try:
        return (str(path), path.stat().st_mtime_ns)
    except OSError as exc:
        raise InvalidSpec("template file", str(path), f"a readable file ({exc.strerror})") from exc


def _template_root(key: str | tuple[str, int]) -> Element:
    if isinstance(key, str):
        return _builtin_root(key)
    root = _cache.get(key)
    if root is None:
        root = _cache[key] = _parse_template(Path(key[0]))
    return root


def _prepare(key: str | tuple[str, int], opts: DomainOptions, memory_mib: int, vcpus: int,
             cpu_pinning: CpuPinning | None, numa_node: int | None, with_uuid: bool,
             device_boot: bool) -> _Prepared:
    """The part of a build that is the same for every VM built with these arguments: a pure function of them
    (the template is named by content key), so :func:`_prepared` may keep its results."""
    dom = Domain(copy.deepcopy(_template_root(key)))
    dom.child("name", create=True)
    old_uuid = dom.child("uuid")
    if old_uuid is not None:  # a template's UUID would be shared by every VM built from it
        dom.root.remove(old_uuid)
    if with_uuid:
        dom.child("uuid", create=True)
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
    if device_boot:
        # libvirt refuses per-device <boot order> next to <os><boot dev=...>; the caller's order wins
        os_el = dom.child("os")
        for b in [] if os_el is None else os_el.findall("boot"):
            os_el.remove(b)  # type: ignore[union-attr]
    dom.child("devices", create=True)
    at = {el.tag: i for i, el in reversed(list(enumerate(dom.root)))}   # (each tag's first)
    return _Prepared(dom.root, at["name"], at["uuid"] if with_uuid else None, at["devices"],
                     frozenset(dom.device_sources()))


#: typed: a vCPU count of True must not find the entry of 1 (the edits refuse a bool; a hit would skip them)
_prepared = functools.lru_cache(maxsize=128, typed=True)(_prepare)


@dataclass(frozen=True, eq=False)
class _Shaped:
    """A prepared template with devices (and a disk) of given shapes added: the tree each VM of that shape
    gets a copy of, with its own identities stamped in (the first VM's are there until then)."""

    root: Element                 # never handed out: each build edits a deep copy
    stamped: tuple[int, ...]      # positions among <devices>' children: the mdevs, PCI devices, NICs, then the disk
    named_files: tuple[tuple[int, int, str], ...]   # a template disk's <source file> naming {name}: the disk's
                                                    # position, the source's in the disk, and the file as written
    clean: bool                   # lint found nothing (CPU pinning against the host's CPUs aside)


def _shape(base: _Prepared, mdevs: Sequence[MdevHostdev], pci: Sequence[PciHostdev],
           nics: Sequence[HostdevInterface], disk: Disk | None) -> _Shaped:
    """``base`` with these devices added where a build puts them (a multi-function device's functions placed
    together): the same tree for devices of the same shapes, but for the identities their ``stamp`` rewrites.

    Lint's verdict holds for every VM of the shape: of its rules only two read an identity, and a build checks
    both for each VM itself (a source named twice: :meth:`Domain.claim_source`; a MAC that is no unicast
    address: refused by :class:`~vgpuvirt.model.MacAddress`). A rule added to lint that reads a UUID, a host
    address or a MAC must be checked per VM in :func:`build_domain` too."""
    dom = Domain(copy.deepcopy(base.root))
    disk_el = None if disk is None else dom.add_disk(disk)
    added = [dom.add_element(m.to_element()) for m in mdevs]
    added += [dom.add_element(p.to_element()) for p in place_multifunction(dom, pci)]
    added += [dom.add_element(n.to_element()) for n in nics]
    if disk_el is not None:
        added.append(disk_el)
    position = {el: i for i, el in enumerate(dom.devices)}
    named = []
    for src in dom.root.iterfind("devices/disk/source[@file]"):
        owner = src.getparent()
        if owner is not None and owner is not disk_el and "{name}" in src.get("file", ""):
            named.append((position[owner], owner.index(src), src.get("file", "")))
    return _Shaped(dom.root, tuple(position[el] for el in added), tuple(named), not lint(dom))


_SHAPES: dict[tuple[object, ...], _Shaped] = {}
_SHAPES_MAX = 256


def _shaped(base: _Prepared, mdevs: Sequence[MdevHostdev], pci: Sequence[PciHostdev],
            nics: Sequence[HostdevInterface], disk: Disk | None) -> _Shaped:
    """:func:`_shape`, kept per shape. A PCI device's shape includes its function and which of the request's
    host slots it shares (what :func:`place_multifunction` decides by); raises TypeError for an unhashable value."""
    slots: dict[tuple[int, int, int], int] = {}
    key = (base, tuple(m.shape() for m in mdevs),
           tuple((p.shape(), slots.setdefault(p.address.device_slot, len(slots)), p.address.function) for p in pci),
           tuple(n.shape() for n in nics), None if disk is None else disk.shape())
    shaped = _SHAPES.get(key)
    if shaped is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()   # a plain bound: a process building more shapes than this reshapes now and then
        shaped = _SHAPES[key] = _shape(base, mdevs, pci, nics, disk)
    return shaped


def clear_caches() -> None:
    """Forget every parsed template, prepared template and shaped tree: the next build starts from the file.
    (Nothing needs this to see a changed template file: its modification time is part of what names it.)"""
    _cache.clear()
    _builtin_root.cache_clear()
    _prepared.cache_clear()
    _SHAPES.clear()
    _cpus_fit.cache_clear()


@functools.lru_cache(maxsize=128)
def _cpus_fit(base: _Prepared, host_cpus: frozenset[int] | None) -> bool:
    return not lint_cpus(Domain(base.root), host_cpus)


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

