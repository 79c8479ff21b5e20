"""Pure parsers for the text formats a GPU host shows in sysfs (no I/O, never raise on odd input).

* :func:`parse_nvidia_description` - ``num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320,
  max_instance=8`` (legacy and SR-IOV mdev types);
* :func:`parse_gvtg_description` - GVT-g's multi-line ``low_gm_size: 128MB`` ... ``weight: 4``;
* :func:`parse_creatable_vgpu_types` - ``nvidia/creatable_vgpu_types`` (``ID    : vGPU Name`` header + rows);
* :func:`classify_vgpu_name` - ``GRID T4-2Q`` / ``NVIDIA A100D-1-10C`` / ``NVIDIA H200X-1-18C`` -> board,
  series, framebuffer, MIG GPU-instance profile;
* :func:`domain_device_refs` - mdev UUIDs and PCI addresses a libvirt domain XML uses.

A format we do not recognise yields ``None`` fields (the caller keeps the raw text), never an exception:
an inventory must survive a driver that prints something new.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress

# --------------------------------------------------------------------------------------------
# NVIDIA mdev description
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NvidiaDescription:
    num_heads: int | None = None
    frl: int | None = None
    framebuffer_mib: int | None = None
    max_resolution: str | None = None
    max_instances: int | None = None

    @property
    def recognised(self) -> bool:
        return any(v is not None for v in (self.num_heads, self.frl, self.framebuffer_mib,
                                           self.max_resolution, self.max_instances))


_KV_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^,]*?)\s*(?:,|$)")
_RES_RE = re.compile(r"^(\d{1,6})x(\d{1,6})$")
_SIZE_RE = re.compile(r"^(\d{1,9})\s*([KMGT]?)(?:i?B)?$", re.IGNORECASE)
_SIZE_MIB = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    t = text.strip()
    return int(t) if re.fullmatch(r"-?\d{1,12}", t) else None


def _size_mib(text: str | None) -> int | None:
    """``2048M`` / ``512MB`` / ``4G`` -> MiB; a bare number is taken as MiB (NVIDIA always writes M)."""
    if text is None:
        return None
    m = _SIZE_RE.match(text.strip())
    if not m:
        return None
    unit = m[2].upper() or "M"
    return int(int(m[1]) * _SIZE_MIB[unit])


def _resolution(text: str | None) -> str | None:
    if text is None:
        return None
    m = _RES_RE.match(text.strip())
    return f"{int(m[1])}x{int(m[2])}" if m else None


@lru_cache(maxsize=4096)  # an SR-IOV host repeats one type table on every VF
def parse_nvidia_description(text: str | None) -> NvidiaDescription:
    """Fields of NVIDIA's one-line description; unknown keys ignored, bad values -> None."""
    if not text or "=" not in text:
        return NvidiaDescription()
    kv: dict[str, str] = {}
    for m in _KV_RE.finditer(text.strip()):
        if m[1]:
            kv[m[1].lower()] = m[2]
    return NvidiaDescription(
        num_heads=_int(kv.get("num_heads")),
        frl=_int(kv.get("frl_config")),
        framebuffer_mib=_size_mib(kv.get("framebuffer")),
        max_resolution=_resolution(kv.get("max_resolution")),
        max_instances=_int(kv.get("max_instance")),
    )


# --------------------------------------------------------------------------------------------
# GVT-g description
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GvtgDescription:
    low_gm_mib: int | None = None
    high_gm_mib: int | None = None
    fence: int | None = None
    resolution: str | None = None
    weight: int | None = None

    @property
    def recognised(self) -> bool:
        return any(v is not None for v in (self.low_gm_mib, self.high_gm_mib, self.fence,
                                           self.resolution, self.weight))

    def to_dict(self) -> dict[str, int | str | None]:
        return {"low_gm_mib": self.low_gm_mib, "high_gm_mib": self.high_gm_mib, "fence": self.fence,
                "resolution": self.resolution, "weight": self.weight}


@lru_cache(maxsize=4096)  # an SR-IOV host repeats one type table on every VF
def parse_gvtg_description(text: str | None) -> GvtgDescription:
    """GVT-g's ``key: value`` lines (also accepts mdevctl's ``, ``-joined form)."""
    if not text or ":" not in text:
        return GvtgDescription()
    kv: dict[str, str] = {}
    for part in re.split(r"[\n,]", text):
        key, sep, value = part.partition(":")
        if sep:
            kv[key.strip().lower()] = value.strip()
    return GvtgDescription(
        low_gm_mib=_size_mib(kv.get("low_gm_size")),
        high_gm_mib=_size_mib(kv.get("high_gm_size")),
        fence=_int(kv.get("fence")),
        resolution=_resolution(kv.get("resolution")),
        weight=_int(kv.get("weight")),
    )


# --------------------------------------------------------------------------------------------
# nvidia/creatable_vgpu_types (vGPU 17+ vendor-specific VFIO)
# --------------------------------------------------------------------------------------------

_CREATABLE_ROW_RE = re.compile(r"^\s*(\d{1,10})\s*:\s*(.*?)\s*$")


def parse_creatable_vgpu_types(text: str | None) -> list[tuple[int, str]]:
    """``[(1155, "NVIDIA L40S-24Q"), ...]`` in the driver's order; the header line is optional."""
    out: list[tuple[int, str]] = []
    if not text:
        return out
    for line in text.splitlines():
        if not line.strip() or line.lstrip().upper().startswith("ID"):
            continue
        m = _CREATABLE_ROW_RE.match(line)
        if m and m[2]:
            out.append((int(m[1]), m[2]))
    return out


# --------------------------------------------------------------------------------------------
# vGPU type names
# --------------------------------------------------------------------------------------------


# <prefix ><board>-[<GI slices>-]<framebuffer GB><series>[ME|4]; board may itself contain '-' (RTX6000-Ada),
# so it is matched lazily and the profile is anchored at the end.
_VGPU_NAME_RE = re.compile(
    r"^(?:(?P<prefix>GRID|NVIDIA)\s+)?(?P<board>.+?)-(?:(?P<slices>\d{1,2})-)?(?P<fb>\d{1,4})"
    r"(?P<series>[QBAC])(?P<suffix>ME|4)?$")


@dataclass(frozen=True)
class VgpuClass:
    board: str | None = None
    series: str | None = None            # Q | B | A | C
    framebuffer_gib: int | None = None   # from the name (the number before the series letter)
    mig_backed: bool = False
    gi_slices: int | None = None
    gi_profile: str | None = None        # "1g.10gb", "1g.5gb+me"
    media_extensions: bool = False


@lru_cache(maxsize=4096)  # an SR-IOV host repeats one type table on every VF
def classify_vgpu_name(name: str | None) -> VgpuClass:
    """Classify an NVIDIA vGPU type name; anything else -> an empty :class:`VgpuClass`."""
    if not name:
        return VgpuClass()
    m = _VGPU_NAME_RE.match(name.strip())
    if not m:
        return VgpuClass()
    fb = int(m["fb"])
    slices = int(m["slices"]) if m["slices"] else None
    me = m["suffix"] == "ME"
    profile = f"{slices}g.{fb}gb{'+me' if me else ''}" if slices is not None else None
    return VgpuClass(board=m["board"], series=m["series"], framebuffer_gib=fb, mig_backed=slices is not None,
                     gi_slices=slices, gi_profile=profile, media_extensions=me)


# --------------------------------------------------------------------------------------------
# Small sysfs value parsers
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)   # the 32 VFs of a GPU repeat its vendor, device and class
def parse_hex_id(text: str | None) -> str | None:
    """``0x10de`` / ``10de`` -> ``0x10de`` (lower case, 0x-prefixed), else None."""
    if text is None:
        return None
    t = text.strip().lower()
    if t.startswith("0x"):
        t = t[2:]
    return f"0x{t}" if re.fullmatch(r"[0-9a-f]{1,8}", t) else None


def parse_numa_node(text: str | None) -> int | None:
    """``numa_node``: -1 (no proximity info) and garbage -> None."""
    v = _int(text)
    return v if v is not None and v >= 0 else None


def parse_reset_methods(text: str | None) -> list[str] | None:
    """``flr bus`` -> ``["flr", "bus"]``; an absent file -> None (no method, or kernel < 5.15)."""
    if text is None:
        return None
    return list(_reset_methods(text))


@lru_cache(maxsize=256)
def _reset_methods(text: str) -> tuple[str, ...]:
    return tuple(w for w in text.split() if re.fullmatch(r"[a-z_]{1,32}", w))


def parse_driver_override(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.strip()
    return None if t in ("", "(null)") else t


@lru_cache(maxsize=8192)  # a large inventory meets each address in several links; PciAddress is frozen
def pci_or_none(name: str | None) -> PciAddress | None:
    if not name:
        return None
    try:
        return PciAddress.parse(name)
    except InvalidSpec:
        return None


# Domain XML is read in vgpuvirt.xml (one door); re-exported for the callers that import it from here.
from vgpuvirt.xml.refs import DomainRefs as DomainRefs  # noqa: E402
from vgpuvirt.xml.refs import domain_device_refs as domain_device_refs  # noqa: E402
