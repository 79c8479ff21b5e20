"""Parse ``nvidia-smi -q -x`` (lxml; pure, never raises on odd input).

Only the facts an inventory needs: product name/brand/architecture, UUID, PCI bus id, framebuffer size,
virtualization mode (``None`` on a bare-metal driver, ``Host VGPU`` on a vGPU host driver), host vGPU
mode (``Non SR-IOV`` / ``SR-IOV``), heterogeneous mode, MIG mode and MIG devices, driver version.
``N/A`` and deprecated-functionality texts become None. The DTD the document names is never loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress

NVIDIA_SMI_ARGV = ("nvidia-smi", "-q", "-x")
#: The GPU instances of every MIG-enabled GPU (rows "|   0  MIG 1g.12gb   19   13   6:1   |", NVIDIA MIG user
#: guide; exit 6 "No GPU instances found" when there are none).
NVIDIA_SMI_LGI_ARGV = ("nvidia-smi", "mig", "-lgi")
#: The GPU-instance profiles of every MIG-enabled GPU with how many more of each fit now (Free/Total).
NVIDIA_SMI_LGIP_ARGV = ("nvidia-smi", "mig", "-lgip")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s*\|\s*$")

_UNKNOWN = {"", "n/a", "not available", "[n/a]", "unknown error", "[unknown error]"}


@dataclass(frozen=True)
class NvidiaGpuFacts:
    """What the NVIDIA driver says about one physical GPU (from NVML or nvidia-smi)."""

    source: str                               # "nvml" | "nvidia-smi"
    address: PciAddress | None
    product_name: str | None = None
    product_brand: str | None = None
    architecture: str | None = None
    uuid: str | None = None
    memory_total_mib: int | None = None
    virtualization_mode: str | None = None    # "None", "Pass-Through", "VGPU", "Host VGPU", "Host VSGA"
    host_vgpu_mode: str | None = None         # "Non SR-IOV" | "SR-IOV"
    vgpu_heterogeneous_mode: str | None = None
    mixed_size_capable: bool | None = None    # "Heterogeneous Time-Slice Sizes: Supported" (newer drivers)
    mig_mode_current: str | None = None       # "Enabled" | "Disabled"
    mig_mode_pending: str | None = None
    mig_devices: int | None = None
    ecc_mode_current: str | None = None       # "Enabled" | "Disabled" (migration needs the same on both sides)
    gpu_instances: list[tuple[int, str]] | None = None   # (GI id, MIG profile) from ``nvidia-smi mig -lgi``
    gi_profiles_free: dict[str, int] | None = None       # MIG profile -> more GIs that fit (``mig -lgip``)
    supported_vgpu_types: list[dict[str, Any]] | None = None
    creatable_vgpu_types: list[dict[str, Any]] | None = None
    active_vgpus: list[dict[str, Any]] | None = None
    not_supported: list[str] = field(default_factory=list)   # queries the driver answered NotSupported
    errors: dict[str, str] = field(default_factory=dict)     # other per-query failures

    @property
    def vgpu_host(self) -> bool:
        return (self.virtualization_mode or "").lower() == "host vgpu"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "product_name": self.product_name, "product_brand": self.product_brand,
            "architecture": self.architecture, "uuid": self.uuid, "memory_total_mib": self.memory_total_mib,
            "virtualization_mode": self.virtualization_mode, "host_vgpu_mode": self.host_vgpu_mode,
            "vgpu_heterogeneous_mode": self.vgpu_heterogeneous_mode, "mixed_size_capable": self.mixed_size_capable,
            "mig_mode": {"current": self.mig_mode_current, "pending": self.mig_mode_pending},
            "mig_devices": self.mig_devices, "ecc_mode": self.ecc_mode_current,
            "gpu_instances": ([{"id": i, "profile": p} for i, p in self.gpu_instances]
                              if self.gpu_instances is not None else None),
            **({"gi_profiles_free": dict(self.gi_profiles_free)} if self.gi_profiles_free is not None else {}),
            "supported_vgpu_types": self.supported_vgpu_types,
            "creatable_vgpu_types": self.creatable_vgpu_types,
            "active_vgpus": self.active_vgpus,
            "not_supported": list(self.not_supported), "errors": dict(self.errors),
        }


@dataclass(frozen=True)
class NvidiaSmiReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: list[NvidiaGpuFacts]
    error: str | None = None


def clean(text: str | None) -> str | None:
    if text is None:
        return None
    t = " ".join(text.split())
    if t.lower() in _UNKNOWN or "deprecated" in t.lower() or "not supported" in t.lower():
        return None
    return t


def _mib(text: str | None) -> int | None:
    t = clean(text)
    if t is None:
        return None
    m = re.fullmatch(r"(\d+)\s*MiB", t)
    return int(m[1]) if m else None


def _supported(text: str | None) -> bool | None:
    if text is None:
        return None
    return {"supported": True, "not supported": False}.get(" ".join(text.split()).lower())


def parse_root(text: str | bytes | None) -> tuple[Any, str | None]:
    """The document's root element (lxml), or None and why not. The one XML parse of a ``-q -x`` answer:
    :func:`report_of` and :func:`~vgpuvirt.services.nvidia.readings.readings_of` both read the tree it gives."""
    from lxml import etree

    if not text:
        return None, "empty output"
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
                             recover=False)
    try:
        return etree.fromstring(text.encode() if isinstance(text, str) else text, parser), None
    except etree.XMLSyntaxError as exc:
        return None, f"unparseable nvidia-smi XML: {exc}"


def parse_nvidia_smi_xml(text: str | bytes | None) -> NvidiaSmiReport:
    """Parse the whole document; an unparseable one yields an empty report with ``error`` set."""
    root, error = parse_root(text)
    return report_of(root) if root is not None else NvidiaSmiReport(None, None, [], error=error)


def report_of(root: Any) -> NvidiaSmiReport:
    """The facts of a parsed ``-q -x`` document (:func:`parse_root`)."""
    if root.tag != "nvidia_smi_log":
        return NvidiaSmiReport(None, None, [], error=f"unexpected root element <{root.tag}>")
    gpus: list[NvidiaGpuFacts] = []
    for g in root.iterfind("gpu"):
        def t(path: str, g: Any = g) -> str | None:
            el = g.find(path)
            return clean(el.text) if el is not None else None

        bus_id = g.get("id") or t("pci/pci_bus_id")
        try:
            address = PciAddress.from_nvml(bus_id) if bus_id else None
        except InvalidSpec:
            address = None
        mig_el = g.find("mig_devices")
        mig_count = len(mig_el.findall("mig_device")) if mig_el is not None else None
        gpus.append(NvidiaGpuFacts(
            source="nvidia-smi",
            address=address,
            product_name=t("product_name"),
            product_brand=t("product_brand"),
            architecture=t("product_architecture"),
            uuid=t("uuid"),
            memory_total_mib=_mib(t("fb_memory_usage/total")),
            virtualization_mode=t("gpu_virtualization_mode/virtualization_mode"),
            host_vgpu_mode=t("gpu_virtualization_mode/host_vgpu_mode"),
            vgpu_heterogeneous_mode=t("gpu_virtualization_mode/vgpu_heterogeneous_mode"),
            mixed_size_capable=_supported(g.findtext("gpu_virtualization_mode/vgpu_device_capability/"
                                                     "heterogeneous_timeslice_sizes")),
            mig_mode_current=t("mig_mode/current_mig"),
            mig_mode_pending=t("mig_mode/pending_mig"),
            mig_devices=mig_count,
            ecc_mode_current=t("ecc_mode/current_ecc"),
        ))
    drv = root.find("driver_version")
    cuda = root.find("cuda_version")
    return NvidiaSmiReport(clean(drv.text) if drv is not None else None,
                           clean(cuda.text) if cuda is not None else None, gpus)


def parse_mig_lgi(text: str | None) -> dict[int, list[tuple[int, str]]]:
    """``nvidia-smi mig -lgi`` -> GPU index -> [(GI id, profile name)]; lines that are not rows are ignored."""
    out: dict[int, list[tuple[int, str]]] = {}
    for line in (text or "").splitlines():
        m = _LGI_ROW.match(line.strip())
        if m:
            out.setdefault(int(m[1]), []).append((int(m[4]), m[2]))
    return out
