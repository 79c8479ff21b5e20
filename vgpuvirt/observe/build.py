"""Build one host's :class:`~vgpuvirt.services.metrics_model.HostMetrics` from what its round trip returned
(pure): the inventory (capacity, mdevs, VFs), ``nvidia-smi -q -x`` readings, ``nvidia-smi vgpu -q`` and the
kernel log, joined with the libvirt domains that own the vGPUs."""

from __future__ import annotations

import errno as _errno
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vgpuvirt.errors import XmlError
from vgpuvirt.host.base import OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.capacity.budget import GpuBudget
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.inventory.parts import Gpu
from vgpuvirt.services.metrics_model import (
    GpuMetrics,
    Health,
    HostMetrics,
    Scheduler,
    TypeUse,
    VgpuMetrics,
)
from vgpuvirt.services.nvidia.health import assess
from vgpuvirt.services.nvidia.kernel_log import KernelLog, since
from vgpuvirt.services.nvidia.nvml_readings import NvmlMetrics
from vgpuvirt.services.nvidia.readings import GpuReadings
from vgpuvirt.services.nvidia.report import SmiReport, smi_report
from vgpuvirt.services.nvidia.vgpu_query import ActiveVgpu, parse_vgpu_query
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.document import parse_xml
from vgpuvirt.xml.refs import domain_device_refs

Owner = tuple[str, str | None]     # (domain name, domain UUID)


@dataclass
class _Owners:
    by_mdev: dict[str, Owner] = field(default_factory=dict)
    by_pci: dict[PciAddress, Owner] = field(default_factory=dict)
    pci_by_vm_uuid: dict[str, set[PciAddress]] = field(default_factory=dict)


def _owners(domains: Iterable[tuple[str, str]]) -> _Owners:
    o = _Owners()
    for name, xml in domains:
        refs = domain_device_refs(xml)
        try:
            uuid = (parse_xml(xml).findtext("uuid") or "").strip().lower() or None
        except XmlError:
            uuid = None
        for m in refs.mdevs:
            o.by_mdev[str(m)] = (name, uuid)
        for a in refs.pci:
            o.by_pci[a] = (name, uuid)
        if uuid:
            o.pci_by_vm_uuid.setdefault(uuid, set()).update(refs.pci)
    return o


def _source(result: OpResult | None) -> str:
    if result is None:
        return "not run"
    if result.rc == 127 or result.errno == _errno.ENOENT:
        return "not installed"
    return "ok" if result.ok else f"failed (exit {result.rc})"


def _vgpu(vid: str, kind: GpuUse, parent: str | None, type_id: str | None, budget: GpuBudget | None,
          owner: Owner | None, a: ActiveVgpu | None) -> VgpuMetrics:
    t = budget.types.get(type_id) if budget is not None and type_id else None
    frl_on, frl = a.frame_rate_limit if a is not None else (None, None)
    vm_name = owner[0] if owner else (a.text("VM Name") if a else None)
    vm_uuid = owner[1] if owner and owner[1] else (a.vm_uuid if a else None)
    gi = a.integer("GPU Instance ID") if a is not None else None
    return VgpuMetrics(
        id=vid, kind=kind, parent=parent, type_id=type_id,
        type_name=(t.name if t is not None else None) or (a.text("vGPU Name") if a else None),
        mig_backed=(t.mig_profile is not None) if t is not None else None, gpu_instance_id=gi,
        vm_name=vm_name, vm_uuid=vm_uuid, vgpu_instance=a.instance if a else None,
        fb_total_mib=(a.integer("FB Memory Usage/Total") if a else None) or (t.framebuffer_mib if t else None),
        fb_used_mib=a.integer("FB Memory Usage/Used") if a else None,
        sm_util_pct=a.num("Utilization/Gpu") if a else None,
        memory_util_pct=a.num("Utilization/Memory") if a else None,
        encoder_util_pct=a.num("Utilization/Encoder") if a else None,
        decoder_util_pct=a.num("Utilization/Decoder") if a else None,
        encoder_sessions=a.integer("Encoder Stats/Active Sessions") if a else None,
        encoder_fps=a.num("Encoder Stats/Average FPS") if a else None,
        encoder_latency_us=a.num("Encoder Stats/Average Latency") if a else None,
        frame_rate_limit_fps=frl, frl_enabled=frl_on,
    )


def _vgpus(inv: Inventory, g: Gpu, budget: GpuBudget | None, active: list[ActiveVgpu],
           owners: _Owners) -> tuple[VgpuMetrics, ...]:
    places = {str(g.address), *(str(v) for v in g.vfs)}
    by_mdev = {a.mdev_uuid: a for a in active if a.mdev_uuid}
    rest = [a for a in active if not a.mdev_uuid]
    out: list[VgpuMetrics] = []
    for m in inv.mdevs:
        if m.parent in places:
            out.append(_vgpu(str(m.uuid), GpuUse.MDEV, m.parent, m.type, budget, owners.by_mdev.get(str(m.uuid)),
                             by_mdev.get(str(m.uuid))))
    vfs = [v for v in inv.vendor_vgpu if v.address in set(g.vfs) and v.current_type]
    for v in vfs:
        tid = f"nvidia-{v.current_type}"
        owner = owners.by_pci.get(v.address)
        # vGPU 17+ VFs have no mdev UUID: the driver's VM UUID leads to the domain holding the VF; else the
        # only active vGPU of that type left on the GPU is this one.
        a = next((x for x in rest if x.vm_uuid and v.address in owners.pci_by_vm_uuid.get(x.vm_uuid, ())), None)
        if a is None:
            same = [x for x in rest if x.integer("vGPU Type") == v.current_type]
            a = same[0] if len(same) == 1 and sum(1 for w in vfs if w.current_type == v.current_type) == 1 else None
        if a is not None:
            rest.remove(a)
        out.append(_vgpu(str(v.address), GpuUse.VENDOR_VF, str(v.address), tid, budget, owner, a))
    return tuple(out)


def _types(budget: GpuBudget | None) -> tuple[TypeUse, ...]:
    if budget is None:
        return ()
    held = Counter(r.type_id for r in budget.residents)
    return tuple(TypeUse(f.type_id, budget.types[f.type_id].name, budget.types[f.type_id].framebuffer_mib,
                         f.fits_now, held.get(f.type_id, 0)) for f in budget.fits())


# The readings nvidia-smi gives a GPU, carried into its metrics as read (absent readings keep the defaults:
# None, or the empty Ecc / MemoryRepair / PcieLink).
_AS_READ = ("fb_used_mib", "fb_reserved_mib",
            "sm_util_pct", "memory_util_pct", "encoder_util_pct", "decoder_util_pct", "temperature_c",
            "power_w", "power_limit_w", "sm_clock_mhz", "memory_clock_mhz", "graphics_clock_mhz",
            "performance_state", "ecc", "memory_repair", "pcie")


def _gpu(inv: Inventory, g: Gpu, budget: GpuBudget | None, r: GpuReadings | None, active: list[ActiveVgpu],
         owners: _Owners, klog: KernelLog | None, cursor: float | None, nvml_sched: Scheduler | None) -> GpuMetrics:
    all_xids = klog.xids.get(g.address, ()) if klog is not None else None
    codes = tuple(x.code for x in all_xids) if all_xids is not None else None
    health = assess(r, codes) if r is not None or codes else (g.health or Health())
    vgpu_fb = (sum(x.framebuffer_mib or 0 for x in budget.residents if x.mig_profile is None)
               if budget is not None and budget.residents else (0 if budget is not None else None))
    sched = (nvml_sched or (klog.schedulers.get(g.address) if klog is not None else None)) or Scheduler()
    owner = owners.by_pci.get(g.address)          # a domain that holds the PF itself: passthrough
    return GpuMetrics(
        address=str(g.address), name=(r.name if r else None) or g.name, uuid=r.uuid if r else None,
        mode=budget.mode.capacity_word if budget else None, sizing=budget.sizing if budget else None,
        vm_name=owner[0] if owner else None, vm_uuid=owner[1] if owner else None,
        fb_total_mib=(r.fb_total_mib if r else None) or (budget.framebuffer_mib if budget else None),
        vgpu_fb_used_mib=vgpu_fb, types=_types(budget),
        **({f: getattr(r, f) for f in _AS_READ} if r is not None else {}),
        xids=since(all_xids, cursor) if all_xids is not None else None, xids_since_boot=codes,
        scheduler=sched, health=health,
        vgpus=_vgpus(inv, g, budget, [a for a in active if a.gpu == g.address], owners),
    )


def build_host_metrics(inv: Inventory, *, smi: OpResult | SmiReport | None, vgpu_query: OpResult | None,
                       klog: KernelLog | None, cursor: float | None, domains: Iterable[tuple[str, str]],
                       sources: dict[str, str], collected_at: float, duration_s: float | None,
                       round_trips: int | None, nvml: NvmlMetrics | None = None,
                       readings: Mapping[PciAddress, GpuReadings] | None = None) -> HostMetrics:
    """``nvml``: readings of this machine through NVML; they win over nvidia-smi's, GPU by GPU. ``readings``:
    ``smi``'s, already parsed by the caller (the inventory's health used them too)."""
    # a lost GPU makes nvidia-smi exit non-zero while it still reports the others: read what it printed
    # (a copy: NVML's are merged in below, the caller's mapping stays as it was)
    parsed = smi_report(smi) if readings is None else None
    by_gpu = dict(readings) if readings is not None else dict(parsed.readings) if parsed is not None else {}
    vq_ok = vgpu_query is not None and vgpu_query.ok
    sources = {**sources, "vgpu_query": _source(vgpu_query)}
    active = parse_vgpu_query(vgpu_query.stdout) if vq_ok and vgpu_query is not None else []
    schedulers: dict[PciAddress, Scheduler] = {}
    if nvml is not None and nvml.available:
        by_gpu.update(nvml.readings)
        active = [a for a in active if a.gpu not in nvml.readings] + nvml.vgpus
        schedulers = nvml.schedulers
    budgets = {b.address: b for b in inv.capacity()}
    owners = _owners(domains)
    gpus = tuple(_gpu(inv, g, budgets.get(g.address), by_gpu.get(g.address), active, owners, klog, cursor,
                      schedulers.get(g.address)) for g in inv.gpus)
    return HostMetrics(host=inv.host, up=True, collected_at=collected_at, duration_s=duration_s,
                       round_trips=round_trips, driver_version=inv.nvidia_driver_version, sources=sources,
                       warnings=tuple(inv.warnings), gpus=gpus)
