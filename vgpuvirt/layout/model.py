"""The host GPU layout: what each GPU of a host should be (pure values, no I/O).

A :class:`Layout` holds named :class:`LayoutConfig` s (``day``, ``night``); a config is an ordered list
of :class:`GpuEntry`: GPU selectors plus the :class:`GpuLayout` the selected GPUs get. Later entries
override earlier ones for the GPUs they select (``all`` first, then exceptions), as mig-parted's
configs read. GPUs that no entry selects are left as they are.

:func:`vgpuvirt.layout.schema.parse_layout` makes these from YAML (docs/layouts.md);
:meth:`Layout.to_dict` is the same YAML shape back, so a parsed file and its dump compare equal.
Everything here is validated on construction (``InvalidSpec``); the schema module adds where in the
file a bad value was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import DriverName, PciAddress

VERSION = "v1"
Mode = Literal["passthrough", "vgpu", "mig", "mig-vgpu", "off"]
MODES: tuple[Mode, ...] = ("passthrough", "vgpu", "mig", "mig-vgpu", "off")
Sizing = Literal["equal", "mixed"]
SIZINGS: tuple[Sizing, ...] = ("equal", "mixed")
FILL = "fill"
VFIO = "vfio-pci"
VENDOR = "vendor"                    # whatever the GPU's own driver is (nvidia, amdgpu, i915, ...)
#: NVIDIA's vGPU scheduler policies (vGPU user guide, "Scheduling Policies"), as the CLI spells them.
SCHEDULER_POLICIES = ("best-effort", "equal-share", "fixed-share")

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}\Z")
# GPU-instance profiles: 1g.10gb, 1g.20gb+me, 3g.40gb, 7g.80gb; compute-instance suffixes (1c.3g.40gb) too.
_MIG_RE = re.compile(r"^(?:[1-7]c\.)?[1-7]g\.\d{1,4}gb(?:\+(?:me|gfx|me\.all|-me))?\Z")
# A vGPU type as a user writes it: an id (nvidia-231, 1155, i915-GVTg_V5_4) or a name (A10-4Q, GRID T4-2Q).
_TYPE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_ .+-]{0,63}\Z")


def config_name(value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise InvalidSpec("config name", value, "1-64 characters of A-Z a-z 0-9 _ . + -")
    return value


@dataclass(frozen=True)
class Selector:
    """Which GPUs an entry applies to: ``all``, an index (host order: by PCI address), a PCI address,
    or a product name (``NVIDIA A10``, compared case-insensitively)."""

    kind: Literal["all", "index", "address", "product"]
    value: str | int | None = None

    @classmethod
    def parse(cls, value: object) -> Selector:
        if isinstance(value, bool):
            raise InvalidSpec("GPU selector", value, "all, an index, a PCI address or a product name")
        if isinstance(value, int):
            if not 0 <= value <= 1023:
                raise InvalidSpec("GPU index", value, "0..1023")
            return cls("index", value)
        if not isinstance(value, str) or not value.strip():
            raise InvalidSpec("GPU selector", value, "all, an index, a PCI address or a product name")
        s = value.strip()
        if s == "all":
            return cls("all")
        if re.fullmatch(r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}\.[0-7]", s):
            return cls("address", str(PciAddress.parse(s)))
        if not _TYPE_RE.fullmatch(s):
            raise InvalidSpec("GPU product name", value, "letters, digits, spaces and _ . + -")
        return cls("product", s)

    def matches(self, index: int, address: PciAddress, product: str | None) -> bool:
        if self.kind == "all":
            return True
        if self.kind == "index":
            return index == self.value
        if self.kind == "address":
            return str(address) == self.value
        return product is not None and product.casefold() == str(self.value).casefold()

    def to_yaml(self) -> str | int:
        return "all" if self.kind == "all" else cast("str | int", self.value)


@dataclass(frozen=True)
class VgpuCount:
    """``type: count`` or ``type: fill`` (as many as the GPU takes once the other counts are placed)."""

    type: str
    count: int | None                # None: fill

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not _TYPE_RE.fullmatch(self.type.strip()):
            raise InvalidSpec("vGPU type", self.type, "a type id (nvidia-231, 1155) or name (A10-4Q, GRID T4-2Q)")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(self.count, int)
                                       or not 0 <= self.count <= 4096):
            raise InvalidSpec(f"count of vGPU type {self.type}", self.count, "0..4096 or fill")

    @property
    def fill(self) -> bool:
        return self.count is None


@dataclass(frozen=True)
class Scheduler:
    """The vGPU scheduler policy a GPU should run (carried and validated; applied by the scheduler work)."""

    policy: str
    timeslice_ms: int | None = None
    average_factor: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULER_POLICIES:
            raise InvalidSpec("scheduler policy", self.policy, " | ".join(SCHEDULER_POLICIES))
        if self.timeslice_ms is not None and (isinstance(self.timeslice_ms, bool)
                                              or not isinstance(self.timeslice_ms, int)
                                              or not 1 <= self.timeslice_ms <= 30):
            raise InvalidSpec("scheduler timeslice-ms", self.timeslice_ms, "1..30 (milliseconds)")
        if self.average_factor is not None and (isinstance(self.average_factor, bool)
                                                or not isinstance(self.average_factor, int)
                                                or not 1 <= self.average_factor <= 60):
            raise InvalidSpec("scheduler average-factor", self.average_factor, "1..60")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy}
        if self.timeslice_ms is not None:
            out["timeslice-ms"] = self.timeslice_ms
        if self.average_factor is not None:
            out["average-factor"] = self.average_factor
        return out


@dataclass(frozen=True)
class GpuLayout:
    """What one GPU should be. ``None`` fields are "whatever the mode implies" (see :meth:`resolved_*`)."""

    mode: Mode
    driver: str | None = None                # vfio-pci | vendor | a driver name (nvidia); None: by mode
    sriov_vfs: int | None = None             # None: the mode's need (all VFs for VF-based vGPU, else 0)
    mig_enabled: bool | None = None          # None: on for mig / mig-vgpu, off otherwise
    mig_devices: tuple[tuple[str, int], ...] = ()    # GPU-instance profile -> count, in file order
    mig_exact: bool = False                  # mig-devices given (even empty: no GPU instance); else keep them
    vgpu_devices: tuple[VgpuCount, ...] = ()
    sizing: Sizing | None = None             # None: leave the GPU's sizing mode as it is
    scheduler: Scheduler | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidSpec("mode", self.mode, " | ".join(MODES))
        if self.driver is not None and self.driver not in (VFIO, VENDOR):
            DriverName(self.driver)
        if self.sriov_vfs is not None and (isinstance(self.sriov_vfs, bool) or not isinstance(self.sriov_vfs, int)
                                           or not 0 <= self.sriov_vfs <= 0xFFFF):
            raise InvalidSpec("sriov-vfs", self.sriov_vfs, "an integer 0..65535")
        if self.sizing is not None and self.sizing not in SIZINGS:
            raise InvalidSpec("sizing", self.sizing, "equal | mixed")
        seen: set[str] = set()
        for prof, n in self.mig_devices:
            if not isinstance(prof, str) or not _MIG_RE.fullmatch(prof):
                raise InvalidSpec("MIG profile", prof, "a GPU-instance profile such as 1g.10gb or 3g.40gb")
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 7:
                raise InvalidSpec(f"count of MIG profile {prof}", n, "0..7")
            if prof in seen:
                raise InvalidSpec("MIG profile", prof, "each profile once")
            seen.add(prof)
        types = [v.type for v in self.vgpu_devices]
        if len(set(types)) != len(types):
            raise InvalidSpec("vgpu-devices", types, "each vGPU type once")
        if sum(1 for v in self.vgpu_devices if v.fill) > 1:
            raise InvalidSpec("vgpu-devices", types, "at most one type with fill")
        self._check_mode()

    def _check_mode(self) -> None:
        m = self.mode
        mig_on = self.resolved_mig()
        if m in ("mig", "mig-vgpu") and not mig_on:
            raise InvalidSpec("mig-enabled", False, f"true (or left out) in mode {m}")
        if m not in ("mig", "mig-vgpu") and self.mig_devices:
            raise InvalidSpec("mig-devices", dict(self.mig_devices),
                              f"none in mode {m} (MIG needs mode mig or mig-vgpu)")
        if m not in ("mig", "mig-vgpu") and mig_on:
            raise InvalidSpec("mig-enabled", True, f"false (or left out) in mode {m}")
        if m in ("passthrough", "off", "mig") and self.vgpu_devices:
            raise InvalidSpec("vgpu-devices", [v.type for v in self.vgpu_devices],
                              f"none in mode {m} (vGPU types need mode vgpu or mig-vgpu)")
        if m == "passthrough" and self.driver not in (None, VFIO):
            raise InvalidSpec("driver", self.driver, "vfio-pci (or left out) in mode passthrough")
        if m != "passthrough" and self.driver == VFIO:
            raise InvalidSpec("driver", self.driver, "the vendor's driver in mode " + m)
        if m == "passthrough" and self.sriov_vfs:
            raise InvalidSpec("sriov-vfs", self.sriov_vfs,
                              "0 in mode passthrough (a GPU passed through whole has no VFs)")

    # -- what the None fields mean --------------------------------------------------------------

    def resolved_mig(self) -> bool:
        return self.mode in ("mig", "mig-vgpu") if self.mig_enabled is None else self.mig_enabled

    def to_dict(self) -> dict[str, Any]:
        """The YAML form (keys as docs/layouts.md spells them), defaults left out."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.driver is not None:
            out["driver"] = self.driver
        if self.sriov_vfs is not None:
            out["sriov-vfs"] = self.sriov_vfs
        if self.mig_enabled is not None:
            out["mig-enabled"] = self.mig_enabled
        if self.mig_devices or self.mig_exact:
            out["mig-devices"] = dict(self.mig_devices)
        if self.vgpu_devices:
            out["vgpu-devices"] = {v.type: FILL if v.fill else v.count for v in self.vgpu_devices}
        if self.sizing is not None:
            out["sizing"] = self.sizing
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.to_dict()
        return out


#: Vendors an entry can be limited to, by PCI vendor id.
VENDORS = {"nvidia": "0x10de", "amd": "0x1002", "intel": "0x8086"}
_PCI_ID_RE = re.compile(r"^(?:0x)?([0-9a-fA-F]{4}):(?:0x)?([0-9a-fA-F]{4})\Z")
_MIGPARTED_ID_RE = re.compile(r"^0x([0-9a-fA-F]{4})([0-9a-fA-F]{4})\Z")


def pci_id(value: object) -> str:
    """A PCI vendor:device id as ``0x10de:0x20b0``, from that form, ``10de:20b0``, or mig-parted's
    ``0x20B010DE`` (device then vendor)."""
    text = value.strip() if isinstance(value, str) else ""
    m = _PCI_ID_RE.fullmatch(text)
    if m:
        return f"0x{m[1].lower()}:0x{m[2].lower()}"
    m = _MIGPARTED_ID_RE.fullmatch(text)
    if m:
        return f"0x{m[2].lower()}:0x{m[1].lower()}"
    raise InvalidSpec("device-filter", value, "a PCI id such as 0x10de:0x20b0 (or mig-parted's 0x20B010DE)")


#: What a GPU is to the selectors: its address, product name and PCI id (``0x10de:0x20b0``), the last two
#: possibly unknown. Plain (address, product) pairs are accepted too.
GpuFacts = tuple[PciAddress, str | None] | tuple[PciAddress, str | None, str | None]


@dataclass(frozen=True)
class GpuEntry:
    devices: tuple[Selector, ...]
    layout: GpuLayout
    line: int | None = field(default=None, compare=False)     # where it starts in its file (1-based)
    vendor: str | None = None                 # only this vendor's GPUs, and indexes count among them
    device_filter: tuple[str, ...] = ()       # only GPUs with one of these PCI ids (0x10de:0x20b0)

    def __post_init__(self) -> None:
        if self.vendor is not None and self.vendor not in VENDORS:
            raise InvalidSpec("vendor", self.vendor, " | ".join(VENDORS))
        for f in self.device_filter:
            if pci_id(f) != f:
                raise InvalidSpec("device-filter", f, "a normalized PCI id such as 0x10de:0x20b0")

    def admits(self, pci: str | None) -> bool:
        """Whether the vendor and device filters let a GPU of PCI id ``pci`` through."""
        if self.vendor is not None and (pci is None or not pci.startswith(VENDORS[self.vendor] + ":")):
            return False
        return not self.device_filter or pci in self.device_filter

    def selects(self, index: int, address: PciAddress, product: str | None, pci: str | None = None) -> bool:
        return self.admits(pci) and any(s.matches(index, address, product) for s in self.devices)

    def to_dict(self) -> dict[str, Any]:
        devs: Any = "all" if any(s.kind == "all" for s in self.devices) else [s.to_yaml() for s in self.devices]
        out: dict[str, Any] = {"devices": devs}
        if self.vendor is not None:
            out["vendor"] = self.vendor
        if self.device_filter:
            out["device-filter"] = list(self.device_filter)
        return {**out, **self.layout.to_dict()}


def _facts(g: GpuFacts) -> tuple[PciAddress, str | None, str | None]:
    return (g[0], g[1], g[2] if len(g) > 2 else None)  # type: ignore[misc]


@dataclass(frozen=True)
class LayoutConfig:
    name: str
    entries: tuple[GpuEntry, ...]

    def __post_init__(self) -> None:
        config_name(self.name)

    def _selected(self, e: GpuEntry, gpus: Sequence[GpuFacts]) -> list[PciAddress]:
        # an entry's indexes count the GPUs its filters let through, in PCI address order
        admitted = [f for f in sorted(map(_facts, gpus), key=lambda f: f[0]) if e.admits(f[2])]
        return [a for i, (a, prod, pci) in enumerate(admitted) if e.selects(i, a, prod, pci)]

    def resolve(self, gpus: Sequence[GpuFacts]) -> dict[PciAddress, GpuEntry]:
        """The entry that governs each GPU (``gpus``: address, product name and PCI id, in any order; an index
        is the GPU's position by PCI address). Later entries win; GPUs no entry selects are absent."""
        out: dict[PciAddress, GpuEntry] = {}
        for e in self.entries:
            for a in self._selected(e, gpus):
                out[a] = e
        return out

    def to_list(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.entries]


@dataclass(frozen=True)
class Layout:
    configs: tuple[LayoutConfig, ...]
    source: str = field(default="<layout>", compare=False)
    version: str = VERSION

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise InvalidSpec("layout version", self.version, VERSION)
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise InvalidSpec("config names", names, "each name once")
        if not self.configs:
            raise InvalidSpec("configs", [], "at least one named config")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.configs]

    def config(self, name: str | None = None) -> LayoutConfig:
        """The named config; without a name, the only one (or the one called ``default``)."""
        if name is None:
            if len(self.configs) == 1:
                return self.configs[0]
            name = "default"
            if name not in self.names:
                raise InvalidSpec(f"config of {self.source}", None,
                                  f"-c NAME: the file has several configs ({', '.join(self.names)})")
        for c in self.configs:
            if c.name == name:
                return c
        raise InvalidSpec(f"config of {self.source}", name, "one of " + ", ".join(self.names))

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "configs": {c.name: c.to_list() for c in self.configs}}

    @classmethod
    def single(cls, name: str, entries: Iterable[GpuEntry], source: str = "<layout>") -> Layout:
        return cls((LayoutConfig(name, tuple(entries)),), source)
