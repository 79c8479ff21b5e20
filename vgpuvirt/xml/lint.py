"""Rules libvirt or QEMU would enforce later (at define or start), checked before anything reaches them.

Each problem names the device and says why, so a CLI user or a provisioning journal can act on it.
The checks read the raw tree (not only the typed views) so a malformed user file is reported, not crashed on.

``build_domain`` keeps lint's verdict per request shape (``templates._shape``) and checks for each VM only what
reads a device's identity (a source named twice; a MAC, which :class:`~vgpuvirt.model.MacAddress` checks): a
rule added here that reads a UUID, a host address or a MAC must be checked per VM there too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import parse_cpulist
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.element import Element, source_key_of

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


@dataclass(frozen=True)
class LintProblem:
    code: str
    device: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.device}: {self.message}"


def _label(el: Element) -> str:
    if el.tag == "hostdev" and el.get("type") == "mdev":
        a = el.find("source/address")
        return f"mdev {(a.get('uuid') if a is not None else None) or '?'}"
    a = el.find("source/address")
    if a is not None and a.get("bus") is not None:
        try:
            from vgpuvirt.model import PciAddress
            addr = str(PciAddress.from_libvirt(a.get("domain", "0"), a.get("bus", "0"), a.get("slot", "0"),
                                               a.get("function", "0")))
        except InvalidSpec:
            addr = "?"
        kind = "NIC VF" if el.tag == "interface" else "PCI hostdev"
        return f"{kind} {addr}"
    mac = el.find("mac")
    if el.tag == "interface" and mac is not None:
        return f"interface {mac.get('address')}"
    return f"<{el.tag} type='{el.get('type', '')}'>"


def _guest_addr(el: Element) -> tuple[int, int, int, int, bool] | None:
    for a in el.iterchildren("address"):
        if a.get("type") == "pci":
            try:
                return (int(a.get("domain", "0"), 0), int(a.get("bus", "0"), 0), int(a.get("slot", "0"), 0),
                        int(a.get("function", "0"), 0), a.get("multifunction") == "on")
            except ValueError:
                return None
    return None


def _lint_display(el: Element, has_graphics: bool, ramfb: list[str]) -> list[LintProblem]:
    """display/ramfb of a vGPU hostdev; ``ramfb`` collects the labels of those with a boot display."""
    out: list[LintProblem] = []
    display = el.get("display") == "on"
    if display and not has_graphics:
        out.append(LintProblem("display-without-graphics", _label(el),
                               "display='on' needs a <graphics> device (spice or vnc) in the domain"))
    if el.get("ramfb") == "on":
        ramfb.append(_label(el))
        if not display:
            out.append(LintProblem("ramfb-without-display", _label(el), "ramfb='on' requires display='on'"))
    return out


def lint(domain: Domain, host_cpus: frozenset[int] | None = None) -> list[LintProblem]:
    """All problems found; ``host_cpus`` is the host's online CPU set (the caller read it)."""
    out: list[LintProblem] = []
    devices = domain.root.find("devices")
    children = [] if devices is None else [el for el in devices if isinstance(el.tag, str)]
    has_graphics = any(el.tag == "graphics" for el in children)
    ramfb: list[str] = []
    seen: dict[str, Element] = {}
    slots: dict[tuple[int, int, int], list[tuple[int, bool, Element]]] = defaultdict(list)

    for el in children:
        tag = el.tag   # (each read of .tag or an attribute makes a new str: read once per device)
        if tag not in ("hostdev", "interface", "disk", "controller", "video", "sound", "memballoon"):
            continue
        kind = el.get("type") if tag == "hostdev" else None
        if kind == "pci":
            # a vGPU 17+ VF desktop: the same display/ramfb rules as an mdev's (libvirt 10.x)
            out.extend(_lint_display(el, has_graphics, ramfb))
        if kind == "mdev":
            out.extend(_lint_mdev_addresses(el))
            if el.get("model", "") != "vfio-pci" and el.get("display") is not None:
                out.append(LintProblem("display-model", _label(el), "display is only supported with model='vfio-pci'"))
            out.extend(_lint_display(el, has_graphics, ramfb))
            if el.find("boot") is not None:
                out.append(LintProblem("boot-order-mdev", _label(el),
                                       "booting from a mediated device (vfio-pci) is not supported; drop <boot>"))
            if el.find("rom") is not None:
                out.append(LintProblem("rom-on-mdev", _label(el), "<rom> applies to PCI hostdevs, not mdev vGPUs"))
        if tag == "interface":
            mac = el.find("mac")
            if mac is not None:
                value = mac.get("address", "")
                if not _MAC_RE.match(value):
                    out.append(LintProblem("bad-mac", _label(el), f"MAC {value!r} is not six hex octets a:b:c:d:e:f"))
                elif int(value[:2], 16) & 1:
                    out.append(LintProblem("bad-mac", _label(el), f"MAC {value!r} is multicast (first octet odd)"))
        if tag == "hostdev" or tag == "interface":
            key = source_key_of(el)
            if key is not None:
                if key in seen:
                    out.append(LintProblem("duplicate-hostdev", _label(el),
                                           f"the same host device is already assigned as {_label(seen[key])}"))
                else:
                    seen[key] = el
        ga = _guest_addr(el)
        if ga is not None:
            slots[ga[:3]].append((ga[3], ga[4], el))

    if domain.root.find("os/boot") is not None:
        for el in children:
            if el.find("boot") is not None:
                out.append(LintProblem("boot-order-mixed", _label(el),
                                       "per-device <boot order> cannot be used together with <os><boot dev=...>"))
    if len(ramfb) > 1:
        out.append(LintProblem("ramfb-multiple", ", ".join(ramfb),
                               "only one vGPU per domain may have ramfb='on'"))
    builtin = _chipset_slot(domain)
    for (dom, bus, slot), funcs in sorted(slots.items()):
        where = f"guest {dom:04x}:{bus:02x}:{slot:02x}"
        numbers = [f for f, _, _ in funcs]
        for f in sorted({f for f in numbers if numbers.count(f) > 1}):
            names = ", ".join(_label(e) for g, _, e in funcs if g == f)
            out.append(LintProblem("duplicate-guest-address", names, f"share guest address {where}.{f}"))
        if (dom, bus, slot) == builtin:
            continue  # function 0 is the chipset's own bridge (not in the XML): functions 1.. sit beside it
        if any(f > 0 for f in numbers) and not any(f == 0 and mf for f, mf, _ in funcs):
            names = ", ".join(_label(e) for _, _, e in funcs)
            out.append(LintProblem("multifunction-incomplete", names,
                                   f"{where} has functions > 0 but function 0 lacks multifunction='on'"))

    out.extend(lint_cpus(domain, host_cpus))
    return out


#: The guest address type each mdev model takes (libvirt refuses others: a vfio-pci vGPU at a drive address).
_MDEV_ADDRESS = {"vfio-pci": "pci", "vfio-ccw": "ccw", "vfio-ap": None}


def _lint_mdev_addresses(el: Element) -> list[LintProblem]:
    out: list[LintProblem] = []
    src = el.find("source/address")
    if src is None or src.get("uuid") is None:
        out.append(LintProblem("mdev-source", _label(el), "an mdev hostdev's <source><address> needs the "
                                                          "instance's uuid='...' (not a PCI address)"))
    model = el.get("model", "")
    for a in el.iterchildren("address"):
        want = _MDEV_ADDRESS.get(model, "pci")
        if a.get("type") != want:
            out.append(LintProblem("mdev-address-type", _label(el),
                                   f"a {model or 'vfio-pci'} mdev takes "
                                   + (f"a guest <address type='{want}'>" if want else "no guest <address>")
                                   + f", not type='{a.get('type')}'"))
    return out


def _chipset_slot(domain: Domain) -> tuple[int, int, int] | None:
    """The guest slot whose function 0 is the machine's built-in bridge: PIIX3 at 00:01.0 on i440fx (pc),
    ICH9 LPC at 00:1f.0 on q35. libvirt lists the chipset's other functions there (IDE/USB at 00:01.1/.2,
    SATA at 00:1f.2) without function 0, which is not a device of the domain XML."""
    machine = domain.machine or "pc"
    if "q35" in machine:
        return (0, 0, 0x1F)
    if machine == "pc" or machine.startswith("pc-"):       # pc, pc-i440fx-*
        return (0, 0, 0x01)
    return None


def lint_cpus(domain: Domain, host_cpus: frozenset[int] | None) -> list[LintProblem]:
    """The CPU pinning's problems: CPU lists that do not parse, vCPUs the domain lacks, CPUs not on the host."""
    out: list[LintProblem] = []
    tune = domain.root.find("cputune")
    if tune is None:
        return out
    vcpus = domain.vcpus
    for el in tune:
        if el.tag not in ("vcpupin", "emulatorpin", "iothreadpin"):
            continue
        what = el.tag if el.tag != "vcpupin" else f"vcpupin vcpu {el.get('vcpu')}"
        try:
            cpus = parse_cpulist(el.get("cpuset", ""))
        except InvalidSpec as exc:
            out.append(LintProblem("cpu-not-on-host", what, str(exc)))
            continue
        if el.tag == "vcpupin" and vcpus is not None and not 0 <= int(el.get("vcpu", "-1")) < vcpus:
            out.append(LintProblem("vcpupin-range", what, f"the domain has only {vcpus} vCPUs"))
        if host_cpus is not None and not cpus <= host_cpus:
            from vgpuvirt.model import format_cpulist
            missing = format_cpulist(cpus - host_cpus)
            out.append(LintProblem("cpu-not-on-host", what,
                                   f"host CPUs {missing} are not online on the host "
                                   f"(online: {format_cpulist(host_cpus) or 'none'})"))
    return out


def check(domain: Domain, host_cpus: frozenset[int] | None = None) -> None:
    """Raise :class:`XmlError` listing every lint problem, or return."""
    problems = lint(domain, host_cpus)
    if problems:
        name = domain.name or "?"
        raise XmlError(f"domain {name!r}: " + "; ".join(str(p) for p in problems), [str(p) for p in problems])
