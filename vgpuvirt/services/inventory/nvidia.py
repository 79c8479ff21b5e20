"""NVIDIA enrichment of the inventory (pure): nvidia-smi and NVML facts per GPU, and the vGPU 17+
vendor-specific VFs (``nvidia/current_vgpu_type``) with their type names.
"""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass, field, replace

from vgpuvirt.host.base import OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.inventory.parse import Index, Usage, entry_int, entry_text, errno_text, pci_key
from vgpuvirt.services.inventory.parts import PciDevice, VendorType, VendorVf
from vgpuvirt.services.mig.parse import parse_lgip
from vgpuvirt.services.nvidia.nvml import NvmlReport
from vgpuvirt.services.nvidia.report import SmiReport
from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts, parse_mig_lgi
from vgpuvirt.services.pci import parsers as P


@dataclass
class NvidiaFacts:
    """What nvidia-smi and NVML said, merged (NVML wins per GPU), and the vGPU type names they know."""

    by_address: dict[PciAddress, NvidiaGpuFacts] = field(default_factory=dict)
    driver_version: str | None = None
    type_names: dict[int, str] = field(default_factory=dict)


def _with_gpu_instances(gpus: list[NvidiaGpuFacts], lgi: OpResult | None,
                        lgip: OpResult | None = None) -> list[NvidiaGpuFacts]:
    """Attach ``nvidia-smi mig -lgi``'s rows (and ``-lgip``'s free counts) to the MIG-enabled GPUs (their GPU
    index is the -q -x order). Exit 6 means none anywhere; any other failure leaves the table unknown (None)."""
    if lgip is not None and lgip.ok:
        free: dict[int, dict[str, int]] = {}
        for p in parse_lgip(lgip.stdout):
            free.setdefault(p.gpu, {})[p.name] = p.free
        gpus = [replace(g, gi_profiles_free=free.get(i, {})) if g.mig_mode_current == "Enabled" else g
                for i, g in enumerate(gpus)]
    if lgi is None or not (lgi.ok or lgi.rc == 6):
        return gpus
    rows = parse_mig_lgi(lgi.stdout) if lgi.ok else {}
    return [replace(g, gpu_instances=sorted(rows.get(i, []))) if g.mig_mode_current == "Enabled" else g
            for i, g in enumerate(gpus)]


def _smi_facts(smi: SmiReport | None, warnings: list[str], sources: dict[str, str],
               lgi: OpResult | None = None,
               lgip: OpResult | None = None) -> tuple[dict[PciAddress, NvidiaGpuFacts], str | None]:
    if smi is None:
        sources["nvidia_smi"] = "not run"
        return {}, None
    result = smi.result
    if result.rc == 127 or result.errno == _errno.ENOENT:
        sources["nvidia_smi"] = "not installed"
        return {}, None
    if not result.ok:
        tail = (result.stderr or result.stdout or result.error or "").strip().splitlines()[-1:]
        sources["nvidia_smi"] = f"failed (exit {result.rc})"
        warnings.append(f"nvidia-smi -q -x failed (exit {result.rc}): {' '.join(tail) or 'no output'}")
        return {}, None
    report = smi.facts
    if report.error:
        sources["nvidia_smi"] = "unreadable"
        warnings.append(f"nvidia-smi -q -x: {report.error}")
        return {}, None
    sources["nvidia_smi"] = "ok"
    gpus = _with_gpu_instances(report.gpus, lgi, lgip)
    return {g.address: g for g in gpus if g.address is not None}, report.driver_version


def nvidia_facts(nvidia_smi: SmiReport | None, nvml: NvmlReport | None, type_names: dict[int, str],
                 warnings: list[str], sources: dict[str, str], mig_lgi: OpResult | None = None,
                 mig_lgip: OpResult | None = None) -> NvidiaFacts:
    """Merge nvidia-smi's and NVML's per-GPU facts; ``type_names`` (from the VFs) is completed in place."""
    smi_by_addr, smi_driver = _smi_facts(nvidia_smi, warnings, sources, mig_lgi, mig_lgip)
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
                type_names.setdefault(int(info["id"]), str(info["name"]))
    return NvidiaFacts(facts, smi_driver, type_names)


RawVf = tuple[PciDevice, int, list[VendorType], str | None]


def raw_vendor_vfs(idx: Index, devices: dict[PciAddress, PciDevice], warnings: list[str]
                   ) -> tuple[list[RawVf], dict[int, str]]:
    """The devices with an ``nvidia/`` vGPU directory: (device, current type, creatable types, read error),
    and the type names their ``creatable_vgpu_types`` list."""
    names_by_id: dict[int, str] = {}
    raw: list[RawVf] = []
    for addr, dev in sorted(devices.items()):
        attrs = idx.pci.get(pci_key(idx, addr), {})
        cur_e, cre_e = attrs.get("nvidia/current_vgpu_type"), attrs.get("nvidia/creatable_vgpu_types")
        if cur_e is None and cre_e is None:
            continue
        creatable = [VendorType(i, n) for i, n in P.parse_creatable_vgpu_types(entry_text(cre_e))]
        for t in creatable:
            names_by_id.setdefault(t.id, t.name)
        err = errno_text(cre_e) or errno_text(cur_e)
        if err:
            what = "creatable_vgpu_types" if errno_text(cre_e) else "current_vgpu_type"
            warnings.append(f"VF {addr}: reading nvidia/{what} failed: {err}")
        raw.append((dev, entry_int(cur_e) or 0, creatable, err))
    return raw, names_by_id


def vendor_vfs(raw: list[RawVf], type_names: dict[int, str], usage: Usage) -> list[VendorVf]:
    out: list[VendorVf] = []
    for dev, cur, creatable, err in raw:
        domain = usage.pci.get(dev.address)
        out.append(VendorVf(
            address=dev.address, physfn=dev.physfn, current_type=cur, creatable_types=creatable,
            current_type_name=type_names.get(cur) if cur else None, domain=domain,
            orphan=(cur != 0 and domain is None) if usage.given else None,
            driver=dev.driver, iommu_group=dev.iommu_group, read_error=err,
        ))
    return out
