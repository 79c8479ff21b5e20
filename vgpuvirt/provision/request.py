"""What the user asks for: a GPU by type or by need, and the VMs that carry it.

A :class:`VgpuRequest` names a type (``nvidia-231``, ``231``, ``GRID T4-2Q``) or describes a need
(framebuffer >= N MiB, heads, series, resolution, MIG-backed, vendor); :func:`fit` says whether a
:class:`TypeProfile` offered by a host satisfies it and, if not, why. Among the fitting types the
smallest wins (:func:`smallest_key`), which is how a HAMi-style "2 GiB of GPU" request maps onto a
real vGPU type. Everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import DomainName, PciAddress, parse_cpulist
from vgpuvirt.provision.disks import ClonedDisk, check_disk
from vgpuvirt.provision.license import License
from vgpuvirt.services.inventory.parts import VENDOR_KEYS

Mode = Literal["vgpu", "passthrough", "vf"]
SERIES = ("Q", "B", "A", "C")
VENDORS = ("nvidia", "intel", "amd")
VENDOR_IDS = VENDOR_KEYS

_RES_RE = re.compile(r"^(\d{2,5})x(\d{2,5})\Z")


def parse_resolution(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidSpec("resolution", text, "WIDTHxHEIGHT such as 3840x2160")
    m = _RES_RE.match(text.strip())
    return (int(m[1]), int(m[2])) if m else None


@dataclass(frozen=True)
class TypeProfile:
    """A vGPU type as placement sees it, normalized from inventory whatever the backend."""

    id: str                                  # "nvidia-231", "i915-GVTg_V5_4", "vf", "passthrough"
    name: str
    vendor: str                              # nvidia | intel | amd | other
    framebuffer_mib: int | None = None
    num_heads: int | None = None
    max_resolution: tuple[int, int] | None = None
    series: str | None = None
    mig_backed: bool | None = None
    max_instances: int | None = None

    @property
    def numeric_id(self) -> int | None:
        m = re.fullmatch(r"nvidia-(\d+)", self.id)
        return int(m[1]) if m else None

    def describe(self) -> str:
        bits = [f"{self.framebuffer_mib} MiB" if self.framebuffer_mib else None,
                f"{self.num_heads} heads" if self.num_heads else None,
                "x".join(map(str, self.max_resolution)) if self.max_resolution else None,
                "MIG" if self.mig_backed else None]
        extra = ", ".join(b for b in bits if b)
        return f"{self.id} ({self.name}{', ' + extra if extra else ''})"


@dataclass(frozen=True)
class VgpuRequest:
    """One GPU for one VM: by type (``type``) or by need (the other fields)."""

    type: str | None = None
    min_framebuffer_mib: int | None = None
    min_heads: int | None = None
    series: str | None = None
    min_resolution: str | None = None
    mig_backed: bool | None = None
    vendor: str | None = None
    mode: Mode = "vgpu"
    display: bool = True
    with_audio: bool = True                  # passthrough: take the GPU's other functions along
    allow_boot_vga: bool = False             # passthrough: the host's console GPU may be taken
    frl: bool | None = None                  # False: the frame rate limiter off (NVIDIA mdev vgpu_params)

    def __post_init__(self) -> None:
        if self.mode not in ("vgpu", "passthrough", "vf"):
            raise InvalidSpec("GPU mode", self.mode, "vgpu, passthrough or vf")
        if self.frl is not None and (not isinstance(self.frl, bool) or self.mode != "vgpu"):
            raise InvalidSpec("frame rate limiter", self.frl, "on or off, for a vGPU (not passthrough or a VF)")
        if self.type is not None and (not isinstance(self.type, str) or not self.type.strip()
                                      or len(self.type) > 80 or any(c in self.type for c in "\0\n/<>;|&$`")):
            raise InvalidSpec("vGPU type", self.type, "a type id (nvidia-231, 231) or name (GRID T4-2Q)")
        for what, v in (("framebuffer", self.min_framebuffer_mib), ("heads", self.min_heads)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise InvalidSpec(f"minimum {what}", v, "a non-negative integer")
        if self.series is not None:
            s = self.series.upper() if isinstance(self.series, str) else self.series
            if s not in SERIES:
                raise InvalidSpec("vGPU series", self.series, "one of Q, B, A, C")
            object.__setattr__(self, "series", s)
        if self.min_resolution is not None and parse_resolution(self.min_resolution) is None:
            raise InvalidSpec("minimum resolution", self.min_resolution, "WIDTHxHEIGHT such as 3840x2160")
        if self.vendor is not None:
            low = self.vendor.lower() if isinstance(self.vendor, str) else ""
            vend = VENDOR_IDS.get(low, low)
            if vend not in VENDORS:
                raise InvalidSpec("GPU vendor", self.vendor, "nvidia, intel or amd (or 0x10de/0x8086/0x1002)")
            object.__setattr__(self, "vendor", vend)

    @classmethod
    def parse(cls, text: str) -> VgpuRequest:
        """The CLI form: ``nvidia-231``, ``"GRID T4-2Q"``, ``passthrough``, ``vf``, or
        ``fb>=2048,series=Q,heads>=2,res>=3840x2160,mig=no,vendor=nvidia``."""
        t = text.strip()
        if t in ("passthrough", "vf"):
            return cls(mode=t)  # type: ignore[arg-type]
        if not any(op in t for op in (">=", "=")):
            return cls(type=t)
        kw: dict[str, object] = {}
        parts = t.split(",")
        if parts and not any(op in parts[0] for op in (">=", "=")):
            first = parts.pop(0).strip()
            # ``passthrough,boot_vga=yes`` / ``vf,vendor=intel``: a mode, then options (issue 28: it was read
            # as a type named "passthrough"); ``nvidia-231,frl=off``: a type, then options
            kw["mode" if first in ("passthrough", "vf") else "type"] = first
        for part in parts:
            m = re.fullmatch(r"\s*([a-z_]+)\s*(>=|=)\s*([^,]+?)\s*", part)
            if not m:
                raise InvalidSpec("GPU request", text, "key=value or key>=value items separated by commas")
            key, val = m[1], m[3]
            if key in ("fb", "framebuffer", "mem") and m[2] == ">=":
                kw["min_framebuffer_mib"] = _mib(val, text)
            elif key == "heads" and m[2] == ">=":
                kw["min_heads"] = _int(val, text)
            elif key in ("res", "resolution") and m[2] == ">=":
                kw["min_resolution"] = val
            elif key == "series":
                kw["series"] = val
            elif key in ("mig", "mig_backed"):
                kw["mig_backed"] = val.lower() in ("1", "yes", "true", "on")
            elif key == "vendor":
                kw["vendor"] = val
            elif key == "type":
                kw["type"] = val
            elif key == "mode":
                kw["mode"] = val
            elif key == "boot_vga":
                kw["allow_boot_vga"] = val.lower() in ("1", "yes", "true", "on")
            elif key == "frl":
                if val.lower() not in ("on", "off"):
                    raise InvalidSpec("GPU request", text, "frl=on or frl=off")
                kw["frl"] = val.lower() == "on"
            else:
                raise InvalidSpec("GPU request key", key,
                                  "fb>=, heads>=, res>=, series=, mig=, vendor=, type=, mode=, boot_vga=, frl=")
        return cls(**kw)  # type: ignore[arg-type]

    def describe(self) -> str:
        if self.mode != "vgpu":
            return self.mode + (f" ({self.vendor})" if self.vendor else "")
        frl = "" if self.frl is None else f",frl={'on' if self.frl else 'off'}"
        if self.type:
            return f"type {self.type}{frl}"
        bits = [f"fb>={self.min_framebuffer_mib}MiB" if self.min_framebuffer_mib else None,
                f"heads>={self.min_heads}" if self.min_heads else None,
                f"series={self.series}" if self.series else None,
                f"res>={self.min_resolution}" if self.min_resolution else None,
                None if self.mig_backed is None else f"mig={'yes' if self.mig_backed else 'no'}",
                f"vendor={self.vendor}" if self.vendor else None]
        return (",".join(b for b in bits if b) or "any vGPU") + frl


def _int(v: str, text: str) -> int:
    if not re.fullmatch(r"\d{1,9}", v):
        raise InvalidSpec("GPU request", text, "integers for heads and framebuffer")
    return int(v)


def _mib(v: str, text: str) -> int:
    m = re.fullmatch(r"(\d{1,9})\s*(M|MiB|MB|G|GiB|GB)?", v, re.IGNORECASE)
    if not m:
        raise InvalidSpec("GPU request", text, "a framebuffer such as 2048, 2048M or 2G")
    unit = (m[2] or "M").upper()
    return int(m[1]) * (1024 if unit.startswith("G") else 1)


def fit(req: VgpuRequest, t: TypeProfile) -> str | None:
    """None when type ``t`` satisfies the request, else the reason it does not."""
    if req.vendor and t.vendor != req.vendor:
        return f"vendor {t.vendor}, not {req.vendor}"
    if req.type is not None:
        want = req.type.strip()
        if want.isdigit():
            want = f"nvidia-{want}"
        names = {t.id.lower(), t.name.lower()}
        if t.name.lower().startswith(("grid ", "nvidia ")):
            names.add(t.name.split(" ", 1)[1].lower())
        return None if want.lower() in names else f"is {t.id} ({t.name}), not {req.type}"
    if req.min_framebuffer_mib:
        if t.framebuffer_mib is None:
            return "framebuffer unknown"
        if t.framebuffer_mib < req.min_framebuffer_mib:
            return f"framebuffer {t.framebuffer_mib} MiB < {req.min_framebuffer_mib} MiB"
    if req.min_heads:
        if t.num_heads is None:
            return "number of heads unknown"
        if t.num_heads < req.min_heads:
            return f"{t.num_heads} heads < {req.min_heads}"
    if req.series and t.series != req.series:
        return f"series {t.series or 'unknown'}, not {req.series}"
    if req.min_resolution:
        wres = parse_resolution(req.min_resolution)
        assert wres is not None
        if t.max_resolution is None:
            return "maximum resolution unknown"
        if t.max_resolution[0] < wres[0] or t.max_resolution[1] < wres[1]:
            return f"max resolution {t.max_resolution[0]}x{t.max_resolution[1]} < {req.min_resolution}"
    if req.mig_backed is not None and bool(t.mig_backed) != req.mig_backed:
        return "MIG-backed" if t.mig_backed else "not MIG-backed"
    return None


def smallest_key(t: TypeProfile) -> tuple[int, int, int, str]:
    """Order fitting types: least framebuffer, fewest heads, lowest resolution, then id."""
    res = t.max_resolution[0] * t.max_resolution[1] if t.max_resolution else 0
    return (t.framebuffer_mib or 0, t.num_heads or 0, res, t.id)


def provisioning_options(*, networks: Sequence[str] = (), bridges: Sequence[str] = (), tpm: bool = False,
                         secure_boot: bool = False, graphics: str | None = None) -> dict[str, object]:
    """``VmRequest.options`` for what real hosts need: the VM's ordinary NICs (each a libvirt network, then
    each a host bridge, in that order; none given keeps the template's ``default`` network), a TPM 2.0
    (swtpm), UEFI secure boot, the graphics (``spice``, ``vnc``, ``none``). The pre-flight checks each against
    the host's libvirt. ``provisioning_options(bridges=["br0"], tpm=True)`` -> ``{"virtio_nics": ..., "tpm": True}``.
    """
    from vgpuvirt.xml.parts import VirtioNic

    out: dict[str, object] = {}
    for what, names in (("networks", networks), ("bridges", bridges)):
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise InvalidSpec(what, names, "a list of names")
    nics = [VirtioNic("network", n) for n in networks] + [VirtioNic("bridge", b) for b in bridges]
    if nics:
        out["virtio_nics"] = tuple(nics)
    for key, flag in (("tpm", tpm), ("secure_boot", secure_boot)):
        if not isinstance(flag, bool):
            raise InvalidSpec(key, flag, "true or false")
        if flag:
            out[key] = True
    if graphics is not None:
        if graphics not in ("spice", "vnc", "none"):
            raise InvalidSpec("graphics", graphics, "spice | vnc | none")
        out["graphics"] = graphics
    return out


@dataclass(frozen=True)
class NicRequest:
    """An SR-IOV NIC VF as ``<interface type='hostdev'>`` (a free VF of the given PF, or any)."""

    pf: PciAddress | None = None
    mac: str | None = None
    vlan: int | None = None


@dataclass(frozen=True)
class VmRequest:
    """One VM: its name, its GPUs (``()``: none), and how its domain is built."""

    name: str
    gpus: tuple[VgpuRequest, ...] = (VgpuRequest(),)
    template: str = "vdi"
    memory_mib: int = 4096
    vcpus: int = 2
    host_cpus: str | None = None             # pin to these host CPUs (also implies NUMA affinity)
    pin_cpus: bool | None = None             # pin to the GPU's local CPUs; None: as the template says (gaming)
    numa_node: int | None = None             # preferred NUMA node for the GPU
    numa_strict: bool = False                # refuse GPUs on other nodes instead of preferring
    disk: str | ClonedDisk | None = None     # a path ({name}: the VM's name) or a linked clone of a golden image
    nic: NicRequest | None = None
    start: bool = True
    host: str | None = None                  # pin the VM to one host (by name)
    license: License | None = None           # deliver an NVIDIA client configuration token (a seed CD-ROM)
    options: dict[str, object] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        DomainName.parse(self.name)
        if isinstance(self.gpus, VgpuRequest):
            gpus: tuple[VgpuRequest, ...] = (self.gpus,)
        elif isinstance(self.gpus, list | tuple) and all(isinstance(g, VgpuRequest) for g in self.gpus):
            gpus = tuple(self.gpus)
        else:
            raise InvalidSpec("GPU list", self.gpus, "VgpuRequest values")
        # gpus=() is a VM without host devices (a plain desktop, a golden-image check): no placement,
        # it goes to its ``host`` (or the only host of the plan).
        object.__setattr__(self, "gpus", gpus)
        for what, v, lo in (("memory", self.memory_mib, 64), ("vCPU count", self.vcpus, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise InvalidSpec(what, v, f"an integer >= {lo}")
        if self.host_cpus is not None:
            cpus = parse_cpulist(self.host_cpus)
            if not cpus:
                raise InvalidSpec("host CPU list", self.host_cpus, "at least one CPU")
        if self.pin_cpus not in (None, True, False):
            raise InvalidSpec("pin_cpus", self.pin_cpus, "true, false or unset (the template decides)")
        if self.numa_node is not None and (not isinstance(self.numa_node, int) or self.numa_node < 0):
            raise InvalidSpec("NUMA node", self.numa_node, "a non-negative integer")
        check_disk(self.disk)
        if self.license is not None and not isinstance(self.license, License):
            raise InvalidSpec("license", type(self.license).__name__, "a License (License.from_file(TOKEN_FILE))")
        # Checked here, before any plan: an unknown key or a wrong type is the caller's input (Ansible's
        # domain_options), not a TypeError deep in the build.
        from vgpuvirt.xml import DomainOptions
        if not isinstance(self.options, Mapping):
            raise InvalidSpec("VM options", self.options, "a mapping of domain options")
        given = self.options.get("domain_options")
        if given is not None and not isinstance(given, DomainOptions):
            raise InvalidSpec("domain_options", given, "a DomainOptions")
        if given is None:
            DomainOptions.from_mapping(self.domain_settings())

    def domain_settings(self) -> dict[str, object]:
        """The ``options`` that are DomainOptions fields (``domain_options`` and ``nic_vf`` are not)."""
        return {k: v for k, v in self.options.items() if k not in ("domain_options", "nic_vf")}

    @classmethod
    def pool(cls, prefix: str, count: int, *, gpu: VgpuRequest | Sequence[VgpuRequest] = VgpuRequest(),
             start_index: int = 1, width: int = 3, **kw: object) -> list[VmRequest]:
        """``pool("vdi", 40, gpu=...)`` -> vdi-001 .. vdi-040, all alike."""
        if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= 100000:
            raise InvalidSpec("VM count", count, "an integer 1..100000")
        gpus = (gpu,) if isinstance(gpu, VgpuRequest) else tuple(gpu)
        return [cls(name=f"{prefix}-{i:0{width}d}", gpus=gpus, **kw)  # type: ignore[arg-type]
                for i in range(start_index, start_index + count)]

    def with_name(self, name: str) -> VmRequest:
        return replace(self, name=name)
