"""Validated values. Each is frozen, validated on construction, and normalized when parsed.

Everything that may reach a host (an address, a UUID, a type id, a count, a name) is one of
these before it leaves the caller, so that no unchecked string is ever written to sysfs or
passed to a command.
"""

from __future__ import annotations

import functools
import re
import uuid as _uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from vgpuvirt.errors import InvalidSpec

_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<slot>[0-9a-fA-F]{1,2})"
    r"\.(?P<function>[0-7])$"
)


_PCI_FIELDS = ("domain", "bus", "slot", "function")
_PCI_LIMITS = (0xFFFF, 0xFF, 0x1F, 7)


@dataclass(frozen=True, order=True)
class PciAddress:
    """A PCI function address, stored as integers.

    ``PciAddress.parse("0000:3B:00.0") == PciAddress.parse("3b:00.0")``; ``str()`` gives the
    canonical ``0000:3b:00.0``; :meth:`libvirt_attrs` gives libvirt's ``0x..`` attributes.
    """

    domain: int
    bus: int
    slot: int
    function: int

    def __post_init__(self) -> None:
        for name, value, top in zip(_PCI_FIELDS, (self.domain, self.bus, self.slot, self.function), _PCI_LIMITS,
                                    strict=True):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                raise InvalidSpec(f"PCI {name}", value, f"an integer 0..{top:#x}")

    @classmethod
    def parse(cls, text: str | PciAddress) -> PciAddress:
        if isinstance(text, PciAddress):
            return text
        if not isinstance(text, str):
            raise InvalidSpec("PCI address", text, "a string like 0000:3b:00.0")
        m = _PCI_RE.fullmatch(text.strip())
        if not m:
            raise InvalidSpec("PCI address", text, "[dddd:]bb:ss.f in hex, e.g. 0000:3b:00.0")
        try:
            return cls(int(m["domain"] or "0", 16), int(m["bus"], 16), int(m["slot"], 16),
                       int(m["function"]))
        except InvalidSpec as exc:
            raise InvalidSpec("PCI address", text, exc.expected) from None

    @classmethod
    def from_libvirt(cls, domain: str, bus: str, slot: str, function: str) -> PciAddress:
        """From libvirt ``<address>`` attributes, read as libvirt reads them (C ``strtoul`` base 0):
        ``0x3b`` hex, ``59`` decimal, ``0001`` octal (node devices print ``domain='0000'``)."""
        values = (domain, bus, slot, function)
        try:
            numbers = [_c_uint(v) for v in values]
        except (ValueError, TypeError):  # TypeError: a non-string (None from a missing attribute)
            raise InvalidSpec("libvirt PCI address", values,
                              "0x-prefixed hex, decimal or 0-prefixed octal integers") from None
        # a well-formed number out of range: the error names the field, the value as written and its limit
        # (slot 0x22 is no number-format problem, a PCI bus simply has 32 slots)
        for name, text, value, top in zip(_PCI_FIELDS, values, numbers, _PCI_LIMITS, strict=True):
            if value > top:
                raise InvalidSpec(f"PCI {name}", text, f"at most {top:#x} ({top})")
        return cls(*numbers)

    @cached_property
    def _text(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    def __str__(self) -> str:
        # Formatted once per address: placement names every eligible GPU for every VM (its --explain), which
        # over a 32-host fleet is 16,000 str() of the same 64 addresses. (A cached_property writes the
        # instance's __dict__ directly, so it works on a frozen dataclass; fields, eq and hash ignore it.)
        return self._text

    def libvirt_attrs(self) -> dict[str, str]:
        return {"domain": f"0x{self.domain:04x}", "bus": f"0x{self.bus:02x}",
                "slot": f"0x{self.slot:02x}", "function": f"0x{self.function:x}"}

    @property
    def nvml_bus_id(self) -> str:
        """NVML / nvidia-smi form: ``00000000:3B:00.0``."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.slot:02X}.{self.function:X}"

    @classmethod
    def from_nvml(cls, text: str) -> PciAddress:
        if not isinstance(text, str):
            raise InvalidSpec("NVML PCI bus id", text, "dddddddd:BB:SS.F")
        m = re.fullmatch(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", text.strip())
        if not m:
            raise InvalidSpec("NVML PCI bus id", text, "dddddddd:BB:SS.F")
        return cls(int(m[1], 16) & 0xFFFF, int(m[2], 16), int(m[3], 16), int(m[4]))

    @property
    def device_slot(self) -> tuple[int, int, int]:
        """(domain, bus, slot): functions of one multi-function device share it."""
        return (self.domain, self.bus, self.slot)


def _c_uint(text: str) -> int:
    """An unsigned integer as C's ``strtoul(text, NULL, 0)`` reads the whole string (libvirt's parser)."""
    if not isinstance(text, str):
        raise TypeError(text)
    t = text.strip()
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", t):
        return int(t, 16)
    if re.fullmatch(r"0[0-7]*", t):
        return int(t, 8)
    if re.fullmatch(r"[1-9][0-9]*", t):
        return int(t)
    raise ValueError(text)


_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")


@dataclass(frozen=True, order=True)
class MdevUuid:
    """A mediated-device UUID in the kernel's canonical form (lower-case 8-4-4-4-12)."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _UUID_RE.fullmatch(self.value) or self.value != self.value.lower():
            raise InvalidSpec("UUID", self.value,
                              "lower-case 8-4-4-4-12 hex, e.g. 83b8f4f2-509f-382f-3c1e-e6bfe0fa1001")

    @classmethod
    def parse(cls, text: str | MdevUuid | _uuid.UUID) -> MdevUuid:
        if isinstance(text, MdevUuid):
            return text
        if isinstance(text, _uuid.UUID):
            return cls(str(text))
        if not isinstance(text, str) or not _UUID_RE.fullmatch(text.strip()):
            raise InvalidSpec("UUID", text, "8-4-4-4-12 hex digits, e.g. 83b8f4f2-509f-382f-3c1e-e6bfe0fa1001")
        return cls(text.strip().lower())

    @classmethod
    def generate(cls) -> MdevUuid:
        return cls(str(_uuid.uuid4()))

    def __str__(self) -> str:
        return self.value


_MDEV_TYPE_RE = re.compile(r"^[A-Za-z0-9_]+-[A-Za-z0-9_.+-]{1,63}\Z")


@dataclass(frozen=True, order=True)
class MdevTypeId:
    """An mdev type directory name: ``<driver>-<sysfs name>`` (``nvidia-231``, ``i915-GVTg_V5_4``)."""

    value: str

    def __post_init__(self) -> None:
        if (not isinstance(self.value, str) or not _MDEV_TYPE_RE.fullmatch(self.value)
                or ".." in self.value):
            raise InvalidSpec("mdev type id", self.value, "<driver>-<name> such as nvidia-231 or i915-GVTg_V5_4")

    @classmethod
    def parse(cls, text: str | MdevTypeId) -> MdevTypeId:
        return text if isinstance(text, MdevTypeId) else cls(text.strip() if isinstance(text, str) else text)

    @property
    def driver(self) -> str:
        return self.value.split("-", 1)[0]

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, order=True)
class VgpuTypeId:
    """A numeric NVIDIA vGPU type id as written to ``nvidia/current_vgpu_type`` (``1155``)."""

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool) or not 1 <= self.value <= 0x7FFFFFFF:
            raise InvalidSpec("vGPU type id", self.value, "a positive integer such as 1155")

    @classmethod
    def parse(cls, text: str | int | VgpuTypeId) -> VgpuTypeId:
        if isinstance(text, VgpuTypeId):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            return cls(text)
        if isinstance(text, str):
            s = text.strip()
            m = re.fullmatch(r"(?:nvidia-)?(\d{1,10})", s)
            if m:
                return cls(int(m[1]))
        raise InvalidSpec("vGPU type id", text, "a positive integer such as 1155 (or nvidia-1155)")

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class VfCount:
    """A number of SR-IOV virtual functions (the kernel parses it with kstrtou16)."""

    value: int
    MAX: ClassVar[int] = 0xFFFF

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool) or not 0 <= self.value <= self.MAX:
            raise InvalidSpec("VF count", self.value, f"an integer 0..{self.MAX}")

    @classmethod
    def parse(cls, text: str | int | VfCount) -> VfCount:
        if isinstance(text, VfCount):
            return text
        if isinstance(text, str) and re.fullmatch(r"\d{1,5}", text.strip()):
            return cls(int(text))
        if isinstance(text, int) and not isinstance(text, bool):
            return cls(text)
        raise InvalidSpec("VF count", text, f"an integer 0..{cls.MAX}")

    def __int__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return str(self.value)


_DOMAIN_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}\Z")


@dataclass(frozen=True, order=True)
class DomainName:
    """A libvirt domain name we accept: 1-64 of ``[A-Za-z0-9_.+-]``, not starting with ``.``/``-``."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _DOMAIN_NAME_RE.fullmatch(self.value):
            raise InvalidSpec("domain name", self.value,
                              "1-64 characters of A-Z a-z 0-9 _ . + -, not starting with . or -")

    @classmethod
    def parse(cls, text: str | DomainName) -> DomainName:
        return text if isinstance(text, DomainName) else cls(text)

    def __str__(self) -> str:
        return self.value


_DRIVER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True, order=True)
class DriverName:
    """A kernel driver name (``vfio-pci``, ``nvidia``, ``snd_hda_intel``)."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _DRIVER_RE.fullmatch(self.value):
            raise InvalidSpec("driver name", self.value, "a kernel driver name such as vfio-pci")

    def __str__(self) -> str:
        return self.value


_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}\Z")


@dataclass(frozen=True, order=True)
class MacAddress:
    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _MAC_RE.fullmatch(self.value):
            raise InvalidSpec("MAC address", self.value, "six colon-separated hex octets, e.g. 52:54:00:12:34:56")
        if int(self.value[:2], 16) & 1:
            raise InvalidSpec("MAC address", self.value, "a unicast address (first octet even)")
        object.__setattr__(self, "value", self.value.lower())

    @classmethod
    def parse(cls, text: str | MacAddress) -> MacAddress:
        return text if isinstance(text, MacAddress) else cls(text.strip() if isinstance(text, str) else text)

    def __str__(self) -> str:
        return self.value


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel CPU list (``0-3,8,10-11``) into a set of CPU numbers."""
    if not isinstance(text, str):  # a number or None from YAML/JSON must not surface as AttributeError
        raise InvalidSpec("CPU list", text, "comma-separated CPUs and ranges, e.g. 0-3,8")
    return _parse_cpulist(text)


@functools.lru_cache(maxsize=1024)
def _parse_cpulist(text: str) -> frozenset[int]:
    # kept: the same few lists come back (a build's pinning, each domain's vcpupin read by lint, the host's
    # online and NUMA node CPU lists); the result is immutable and a refusal is raised again
    cpus: set[int] = set()
    s = text.strip()
    if not s:
        return frozenset()
    for part in s.split(","):
        m = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", part.strip())
        if not m:
            raise InvalidSpec("CPU list", text, "comma-separated CPUs and ranges, e.g. 0-3,8")
        lo = int(m[1])
        hi = int(m[2]) if m[2] else lo
        if hi < lo:
            raise InvalidSpec("CPU list", text, "ranges written low-high")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int] | list[int]) -> str:
    """Inverse of :func:`parse_cpulist`: ``{0,1,2,3,8}`` -> ``0-3,8``."""
    out: list[str] = []
    items = sorted(set(cpus))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class SysPath:
    """A path below a host's sysfs_root, always absolute-looking (``/sys/...``) and never escaping it."""

    value: str = field()

    def __post_init__(self) -> None:
        v = self.value
        if (not isinstance(v, str) or not v.startswith("/") or "\0" in v or "\n" in v
                or any(p in ("..", ".") for p in v.split("/"))):
            raise InvalidSpec("host path", v, "an absolute path without '.' or '..' components")

    def __str__(self) -> str:
        return self.value


def resolvable_host_name(hostname: str) -> bool:
    """An IP address, or a name the resolver can be asked about: DNS labels of 1..63 characters (253 in all; one
    final dot allowed). An empty or longer label made getaddrinfo raise UnicodeError from its IDNA codec."""
    import ipaddress
    try:
        ipaddress.ip_address(hostname)
        return True
    except ValueError:
        pass
    name = hostname[:-1] if hostname.endswith(".") else hostname
    try:
        encoded = name.encode("idna")
    except UnicodeError:
        return False
    return 0 < len(encoded) <= 253 and all(0 < len(label) <= 63 for label in encoded.split(b"."))
