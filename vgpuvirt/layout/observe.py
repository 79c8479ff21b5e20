"""A host's GPUs as the layout sees them, from one inventory: :class:`GpuNow` per physical GPU, and
:func:`export_layout` (the host as it is, as a layout that applies back to the same state).

Pure over an :class:`~vgpuvirt.services.inventory.model.Inventory` (which is one round trip to read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.layout.model import VFIO, GpuEntry, GpuLayout, Layout, Mode, Scheduler, Selector, VgpuCount
from vgpuvirt.model import PciAddress
from vgpuvirt.services.capacity.budget import GpuBudget
from vgpuvirt.services.capacity.build import gpu_budget, physical_gpus
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.inventory.parts import Gpu
from vgpuvirt.services.mig.state import MigGpu, MigState
from vgpuvirt.services.scheduler.service import GpuScheduler, SchedulerRead
from vgpuvirt.usage import Backend
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.refs import domain_device_refs

#: PCI id -> product name as nvidia-smi prints it, for GPUs it cannot see (bound to vfio-pci).
KNOWN_PRODUCTS = {
    "0x10de:0x1eb8": "Tesla T4", "0x10de:0x1db4": "Tesla V100-PCIE-16GB", "0x10de:0x1b38": "Tesla P40",
    "0x10de:0x2236": "NVIDIA A10", "0x10de:0x2235": "NVIDIA A40", "0x10de:0x25b6": "NVIDIA A16",
    "0x10de:0x20b7": "NVIDIA A30", "0x10de:0x20b5": "NVIDIA A100 80GB PCIe",
    "0x10de:0x20f1": "NVIDIA A100-PCIE-40GB", "0x10de:0x20b0": "NVIDIA A100-SXM4-40GB",
    "0x10de:0x2331": "NVIDIA H100 PCIe", "0x10de:0x2330": "NVIDIA H100 80GB HBM3",
    "0x10de:0x26b9": "NVIDIA L40S", "0x10de:0x26b5": "NVIDIA L40", "0x10de:0x27b8": "NVIDIA L4",
}


@dataclass(frozen=True)
class Vgpu:
    """One vGPU on a GPU: an mdev (``uuid``) on the PF or a VF, or a vGPU 17+ VF type (``uuid`` None)."""

    type_id: str                     # nvidia-593, i915-GVTg_V5_4; vGPU 17+: nvidia-1155
    place: PciAddress                # its mdev parent or its VF
    uuid: str | None = None
    domain: str | None = None        # the domain whose XML uses it, when known


@dataclass(frozen=True)
class Claim:
    """An mdev a defined domain names that is not on the host (gone in a reboot, say). ``parent``/``type_id``
    come from the domain's vgpuvirt provenance; None for a domain vgpuvirt did not make (it names only a UUID)."""

    uuid: str
    domain: str
    parent: PciAddress | None = None
    type_id: str | None = None

    def describe(self, name: str | None = None) -> str:
        what = f"{name or self.type_id} on {self.parent}" if self.parent is not None and self.type_id else \
            "parent and type unknown: no vgpuvirt metadata"
        return f"VM {self.domain} names vGPU {self.uuid} ({what}), which is not on the host"


def missing_claims(inv: Inventory, domains: Iterable[tuple[str, str]] | None) -> list[Claim]:
    """Every mdev the domains name (their hostdevs, and the vGPUs their vgpuvirt metadata lists) that the
    inventory does not hold, once per UUID, in domain order."""
    have = {str(m.uuid) for m in inv.mdevs}
    out: dict[str, Claim] = {}
    for name, xml in domains or ():
        try:
            prov = Provenance.read(xml)
        except XmlError:
            prov = None
        if prov is not None and prov.host and inv.host and prov.host != inv.host:
            continue            # another host's VM (hosts that share one libvirt see each other's domains)
        for g in prov.gpus if prov is not None else ():
            if g.get("kind") == "mdev" and g.get("uuid") and g["uuid"] not in have and g["uuid"] not in out:
                try:
                    parent = PciAddress.parse(g.get("parent", ""))
                except InvalidSpec:
                    continue
                out[g["uuid"]] = Claim(g["uuid"], name, parent, g.get("type") or None)
        for u in sorted(str(u) for u in domain_device_refs(xml).mdevs):
            if u not in have and u not in out:
                out[u] = Claim(u, name)
    return list(out.values())


def with_claims(gpus: list[GpuNow], claims: Sequence[Claim]) -> list[GpuNow]:
    """Each GPU with the missing mdevs whose parent is it or one of its VFs."""
    out = []
    for g in gpus:
        mine = tuple(c for c in claims if c.type_id and (c.parent == g.address or c.parent in g.vfs))
        out.append(replace(g, claimed=mine) if mine else g)
    return out


@dataclass(frozen=True)
class GpuNow:
    """One physical GPU as it is."""

    address: PciAddress
    product: str | None
    driver: str | None
    functions: tuple[PciAddress, ...]           # its other functions (HDMI audio), bound along in passthrough
    budget: GpuBudget
    vfs_total: int
    vfs: tuple[PciAddress, ...]
    vgpus: tuple[Vgpu, ...] = ()
    type_names: dict[str, str] = field(default_factory=dict)   # type id -> name as the host names it
    backend: str = ""
    holder: str | None = None                   # the domain the whole GPU is passed through to
    mig: MigGpu | None = None                   # nvidia-smi's MIG view (index, GIs, CIs), when read
    pci_id: str | None = None                   # "0x10de:0x2236"
    function_drivers: tuple[str | None, ...] = ()   # the drivers of ``functions``, in order
    sched: SchedulerRead | None = field(default=None, compare=False)  # the host's scheduler read (all GPUs)
    claimed: tuple[Claim, ...] = ()             # mdevs defined domains name that are missing here

    @property
    def scheduler(self) -> GpuScheduler | None:
        """This GPU's vGPU scheduler (current and pending), when the read had it (NVIDIA GPUs)."""
        return next((s for s in self.sched.gpus if s.address == str(self.address)), None) if self.sched else None

    def scheduler_layout(self) -> Scheduler | None:
        """The policy the host will run after the next driver load, when it is not the driver's default
        (best effort): what an export writes (best-effort: a setting the layout file cannot say is left out)."""
        s = self.scheduler
        p = s.pending if s is not None else None
        if p is None or p.policy == "best-effort" or p.adaptive is not None:
            return None
        ms, rest = divmod(p.timeslice_us or 0, 1000)
        return None if rest or ms > 30 else Scheduler(p.policy, ms or None)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.budget.mig_enabled)

    def counts(self) -> Counter[str]:
        return Counter(v.type_id for v in self.vgpus)

    def short_name(self, type_id: str) -> str:
        """The name a layout file uses for a type: the host's name less NVIDIA's "GRID "/"NVIDIA " prefix."""
        name = self.type_names.get(type_id) or type_id
        for prefix in ("GRID ", "NVIDIA "):
            if name.startswith(prefix):
                return name[len(prefix):]
        return name

    def type_id(self, wanted: str) -> str | None:
        """The host's type id for a layout's type (an id, a full or a short name; case-insensitive)."""
        w = wanted.strip().casefold()
        for tid in self.type_names:
            names = {tid.casefold(), (self.type_names[tid] or "").casefold(), self.short_name(tid).casefold()}
            if tid.startswith("nvidia-"):
                names.add(tid.removeprefix("nvidia-"))
            if w in names:
                return tid
        return None

    def mode(self) -> Mode:
        if self.driver == VFIO:
            return "passthrough"
        if self.mig_enabled:
            return "mig-vgpu" if self.vgpus else "mig"
        if self.vgpus or self.budget.types or (self.vfs and self.backend is Backend.SRIOV_VF):
            return "vgpu"
        return "off"

    def layout(self) -> GpuLayout:
        """This GPU's state as a layout entry: applying it to this state changes nothing."""
        mode = self.mode()
        counts = self.counts()
        vg = tuple(VgpuCount(self.short_name(t), counts[t]) for t in sorted(counts))
        gis = self.budget.gpu_instances or {}
        sizing = self.budget.sizing if self.budget.mixed_size_supported and mode == "vgpu" else None
        return GpuLayout(mode=mode, sriov_vfs=len(self.vfs) if self.vfs_total and mode != "passthrough" else None,
                         mig_devices=tuple(sorted(gis.items())) if mode in ("mig", "mig-vgpu") else (),
                         mig_exact=mode in ("mig", "mig-vgpu"),
                         vgpu_devices=vg, sizing=sizing,
                         scheduler=self.scheduler_layout() if mode in ("vgpu", "mig-vgpu") else None)


def gpus_now(inv: Inventory, mig: MigState | None = None, sched: SchedulerRead | None = None) -> list[GpuNow]:
    """Every physical GPU of the inventory, in address order (with its MIG view from ``mig`` and the host's
    scheduler read ``sched``)."""
    out = [replace(_gpu_now(inv, g, mig.gpu(g.address) if mig is not None else None), sched=sched)
           for g in sorted(physical_gpus(inv), key=lambda g: g.address)]
    # nvidia-smi does not see a GPU bound to vfio-pci, so its product name (what a selector may name) comes
    # from a GPU of the same PCI id on the host, else from the boards NVIDIA's vGPU documents list.
    by_id = {g.pci_id: g.product for g in out if g.product and g.pci_id}
    for i, g in enumerate(out):
        if g.product is None and g.pci_id:
            name = by_id.get(g.pci_id) or KNOWN_PRODUCTS.get(g.pci_id)
            if name:
                out[i] = replace(g, product=name)
    # A full GPU lists no creatable types, so its vGPUs' types have no name there: another GPU (or NVML's
    # supported list) may know it. Type ids are the driver's, the same on every GPU of the host.
    known = {t: n for g in out for t, n in g.type_names.items() if n != t}
    for g in out:
        for t, n in list(g.type_names.items()):
            if n == t and t in known:
                g.type_names[t] = known[t]
    return out


def _gpu_now(inv: Inventory, g: Gpu, mig: MigGpu | None) -> GpuNow:
    b = gpu_budget(inv, g)
    members = {str(a) for a in (g.address, *g.vfs)}
    names: dict[str, str] = {tid: t.name or tid for tid, t in b.types.items()}
    for t in (g.nvidia.supported_vgpu_types or []) if g.nvidia is not None else []:
        if isinstance(t, dict) and t.get("id") is not None and t.get("name"):
            names.setdefault(f"nvidia-{t['id']}", str(t["name"]))
    vgpus: list[Vgpu] = []
    for m in inv.mdevs:
        if m.parent in members and m.type is not None:
            vgpus.append(Vgpu(m.type, PciAddress.parse(m.parent), str(m.uuid), m.domain))
    for v in inv.vendor_vgpu:
        if str(v.address) in members and not v.free:
            tid = f"nvidia-{v.current_type}"
            names.setdefault(tid, v.current_type_name or tid)
            vgpus.append(Vgpu(tid, v.address, None, v.domain))
    functions = tuple(a for a in g.functions if a != g.address)
    return GpuNow(g.address, g.name, g.driver, functions, b, g.sriov_totalvfs or 0,
                  tuple(sorted(g.vfs)), tuple(sorted(vgpus, key=lambda v: (v.place, v.type_id, v.uuid or ""))),
                  names, g.backend, b.whole_holder, mig,
                  f"{g.vendor}:{g.device}".lower() if g.vendor and g.device else None,
                  tuple((d.driver if (d := inv.device(a)) else None) for a in functions))


def export_layout(inv: Inventory, name: str = "exported", gpus: list[GpuNow] | None = None) -> Layout:
    """The host as it is: one config ``name``, one entry per GPU selected by its PCI address (``gpus``: the
    GPUs as read with their MIG and scheduler views; default: from the inventory alone)."""
    entries = [GpuEntry((Selector("address", str(g.address)),), g.layout())
               for g in (gpus if gpus is not None else gpus_now(inv))]
    return Layout.single(name, entries, f"export of {inv.host}")
