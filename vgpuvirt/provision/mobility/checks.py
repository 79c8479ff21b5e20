"""Migration pre-checks and the plan (pure once the facts are read): every refusal at once, the destination's
vGPUs through the capacity model, and the domain XML rewritten for the destination (the whole flow:
:mod:`vgpuvirt.provision.mobility.migrate`)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import DomainName, MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.provision.mobility.steps import MigrateDomain
from vgpuvirt.provision.placement import place
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.provision.state import host_state
from vgpuvirt.services.inventory.read import Inventory, inventory
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.domain import Domain, parse_xml
from vgpuvirt.xml.element import pci_from_address
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.refs import domain_device_refs

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.change.step import Step
    from vgpuvirt.provision.state import HostState

#: What VFIO device migration needs on both hosts (VFIO migration uAPI v2 in QEMU and libvirt).
MIN_QEMU = (8, 1, 0)
MIN_LIBVIRT = (8, 6, 0)
#: ramfb's state migrates only on machine types newer than this.
RAMFB_MACHINE = (8, 1)
#: Nova asks vGPU hosts for seconds of downtime, not libvirt's 300 ms default: the framebuffer is copied
#: in the stop-and-copy phase and a small limit never converges.
VGPU_MAX_DOWNTIME_MS = 5000


@dataclass(frozen=True)
class Side:
    """One end of a migration: the Host (GPU side) and its libvirt connection."""

    host: Host
    conn: LibvirtConnection

    @property
    def name(self) -> str:
        return self.host.name


@dataclass(frozen=True)
class HostFacts:
    """What one read of a host says (inventory, libvirt and hypervisor versions, host UUID, domains)."""

    name: str
    inventory: Inventory
    libvirt: int
    hypervisor: int
    host_uuid: str | None
    domains: dict[str, str] = field(default_factory=dict)
    active: frozenset[str] = frozenset()
    cordon: str | None = None          # why the host is cordoned; None: it takes VMs
    #: the migratable XML of the VMs asked about (what a migration sends; rewritten for the destination)
    migratable: dict[str, str] = field(default_factory=dict)


def _driver_key(v: str) -> tuple[int, ...]:      # 580.95.05 -> (580, 95, 5)
    return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))


def _version(v: int) -> tuple[int, int, int]:
    return v // 1_000_000, (v // 1000) % 1000, v % 1000


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


def read_facts(side: Side, *, vms: tuple[str, ...] = ()) -> HostFacts:
    """One inventory read of the host and one round of libvirt queries (``vms``: also their migratable XML)."""
    lv = side.conn.host_facts()
    infos = side.conn.domains()
    domains = {d.name: d.xml for d in infos}
    active = frozenset(d.name for d in infos if d.active)
    migratable = {vm: side.conn.xml(vm, migratable=True, inactive=vm not in active) for vm in vms if vm in domains}
    inv = inventory(side.host, domains=list(domains.items()))
    return HostFacts(side.name, inv, lv["libvirt"], lv["hypervisor"], lv["host_uuid"], domains, active,
                     inv.cordon.reason if inv.cordon is not None else None, migratable)


def read_both(source: Side, dest: Side, *, vms: tuple[str, ...] = ()) -> tuple[HostFacts, HostFacts]:
    """Both hosts' facts, read in parallel."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="vgpuvirt-facts") as pool:
        fs = pool.submit(read_facts, source, vms=vms)
        fd = pool.submit(read_facts, dest)
        return fs.result(), fd.result()


# -- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """One vGPU of the VM: where it is on the source and where it goes on the destination."""

    kind: GpuUse                       # MDEV or VENDOR_VF
    type: str                          # mdev type id (nvidia-231) or vGPU type id (1155)
    source: str                        # mdev UUID or VF address on the source
    source_parent: str | None
    dest: str = ""
    dest_parent: str = ""

    def describe(self) -> str:
        if self.kind == GpuUse.MDEV:
            return f"vGPU {self.type} {self.source} on {self.source_parent} -> {self.dest} on {self.dest_parent}"
        return f"vGPU type {self.type} on VF {self.source} -> VF {self.dest}"

    def to_dict(self) -> dict[str, str | None]:
        return {"kind": self.kind, "type": self.type, "source": self.source, "source_parent": self.source_parent,
                "dest": self.dest, "dest_parent": self.dest_parent}


@dataclass
class MigrationPlan:
    vm: str
    source: str
    dest: str
    live: bool
    moves: list[Move]
    refusals: list[str]
    dest_xml: str = field(default="", repr=False)
    steps: list[Step] = field(default_factory=list)
    absent_before: frozenset[str] = frozenset()
    max_downtime_ms: int | None = None
    notes: list[str] = field(default_factory=list)      # what was not checked, and why

    @property
    def ok(self) -> bool:
        return not self.refusals

    def format(self) -> str:
        how = "live" if self.live else "offline"
        lines = [f"migrate {self.vm} ({how}) {self.source} -> {self.dest}:"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.refusals:
            lines += [f"  refused: {r}" for r in self.refusals]
            return "\n".join(lines)
        lines += [f"  + {s.describe()}" for s in self.steps]
        lines += [f"  - release on {self.source}: {m.source}" for m in self.moves]
        if self.max_downtime_ms is not None:
            lines.append(f"  maximum downtime {self.max_downtime_ms} ms")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "source": self.source, "dest": self.dest, "live": self.live, "ok": self.ok,
                "refusals": list(self.refusals), "moves": [m.to_dict() for m in self.moves],
                "steps": [s.to_dict() for s in self.steps], "max_downtime_ms": self.max_downtime_ms,
                "notes": list(self.notes)}


def _machine_version(machine: str | None) -> tuple[int, int] | None:
    m = re.search(r"-(\d+)\.(\d+)$", machine or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def domain_blockers(xml: str, *, postcopy: bool = False) -> list[str]:
    """What in the domain itself keeps its VFIO devices from migrating (pure)."""
    root = parse_xml(xml)
    hostdevs = root.findall("devices/hostdev")
    out: list[str] = []
    if not hostdevs:
        return out
    if root.find("devices/iommu") is not None:
        out.append("the guest has a virtual IOMMU (<iommu>): VFIO devices cannot migrate with a vIOMMU")
    if postcopy:
        out.append("post-copy migration is not possible with VFIO devices (a vGPU's state is copied once)")
    machine = root.find("os/type")
    mv = _machine_version(machine.get("machine") if machine is not None else None)
    if any(h.get("ramfb") == "on" for h in hostdevs) and (mv is None or mv < RAMFB_MACHINE):
        name = machine.get("machine") if machine is not None else None
        out.append(f"ramfb='on' on machine type {name or '(none)'}: ramfb state migrates only on machine "
                   f"types newer than {_dotted(RAMFB_MACHINE)}")
    return out


def _gpu_of(inv: Inventory, parent: str | None) -> Any:
    if parent is None:
        return None
    for g in inv.gpus:
        if str(g.address) == parent or any(str(v) == parent for v in g.vfs):
            return g
    return None


def _board(g: Any) -> tuple[str | None, str | None]:
    return (g.device, g.name) if g is not None else (None, None)


def _board_text(b: tuple[str | None, str | None]) -> str:
    return f"{b[1] or 'GPU'} ({b[0] or '?'})"


def _ecc(g: Any) -> str | None:
    return g.nvidia.ecc_mode_current if g is not None and g.nvidia is not None else None


def _needs(vm: str, xml: str, src: HostFacts, refusals: list[str]) -> list[Move]:
    """The vGPUs the VM owns on the source: its hostdevs and its provenance (ownership) entries."""
    refs = domain_device_refs(xml)
    if refs.error:
        refusals.append(f"{vm}'s XML cannot be read: {refs.error}")
        return []
    prov = Provenance.read(xml)
    owned: dict[str, dict[str, str]] = {}
    for g in prov.gpus if prov else ():
        if g.get("kind") == GpuUse.MDEV and g.get("uuid"):
            owned[g["uuid"]] = dict(g)
    inv = src.inventory
    moves: list[Move] = []
    for uuid in sorted({str(u) for u in refs.mdevs} | set(owned)):
        m = next((x for x in inv.mdevs if str(x.uuid) == uuid), None)
        parent = m.parent if m is not None else owned.get(uuid, {}).get("parent")
        typ = m.type if m is not None else owned.get(uuid, {}).get("type")
        if not parent or not typ:
            refusals.append(f"vGPU {uuid} of {vm} is not on {src.name} (no such mdev, no ownership record)")
            continue
        moves.append(Move(GpuUse.MDEV, typ, uuid, parent))
    vfs = {str(v.address): v for v in inv.vendor_vgpu}
    for addr in sorted(str(a) for a in refs.pci):
        vf = vfs.get(addr)
        if vf is not None and vf.current_type != 0:
            moves.append(Move(GpuUse.VENDOR_VF, str(vf.current_type), addr, str(vf.physfn) if vf.physfn else None))
        else:
            refusals.append(f"{addr} is plain PCI passthrough: a passed-through device has no migratable state "
                            "(shut the VM down, or move it --offline)")
    return moves


def _versions(side: HostFacts, refusals: list[str]) -> None:
    lib, hv = _version(side.libvirt), _version(side.hypervisor)
    if lib < MIN_LIBVIRT:
        refusals.append(f"{side.name}: libvirt {_dotted(lib)} < {_dotted(MIN_LIBVIRT)} (VFIO migration needs "
                        f"libvirt >= {_dotted(MIN_LIBVIRT)})")
    if hv < MIN_QEMU:
        refusals.append(f"{side.name}: QEMU {_dotted(hv)} < {_dotted(MIN_QEMU)} (VFIO migration uAPI v2 needs "
                        f"QEMU >= {_dotted(MIN_QEMU)})")


def _place_moves(vm: str, moves: list[Move], src: HostFacts, dst: HostFacts, refusals: list[str]
                 ) -> list[Move]:
    """Each vGPU's place on the destination: same board, same type, through the capacity model."""
    hs: HostState = host_state(dst.inventory, list(dst.domains.items()))
    boards = {m.source: _board(_gpu_of(src.inventory, m.source_parent)) for m in moves}
    wanted = set(boards.values())
    for g in hs.gpus:
        if _board(dst.inventory.gpu(g.address)) not in wanted:
            g.slots = []
    reqs = tuple(VgpuRequest(type=m.type) for m in moves)
    try:
        assignments = place([VmRequest(name=vm, gpus=reqs, start=False)], {hs.name: hs}).assignments
    except NoCapacity as exc:
        refusals.append(f"no capacity on {dst.name}: {exc}")
        return moves
    taken = {str(m.uuid) for m in dst.inventory.mdevs}
    used: set[str] = set()
    out: list[Move] = []
    for m, a in zip(moves, sorted(assignments, key=lambda a: a.index), strict=True):
        got = _board(dst.inventory.gpu(a.gpu))
        if got != boards[m.source]:
            refusals.append(f"{m.source}: placed on {_board_text(got)}, not on the source's "
                            f"{_board_text(boards[m.source])}")
            continue
        if m.kind == GpuUse.MDEV:
            uuid = m.source
            i = 0
            while uuid in taken or uuid in used:
                uuid = str(mdev_uuid_for(vm, i))
                i += 1
            used.add(uuid)
            out.append(Move(m.kind, m.type, m.source, m.source_parent, uuid, str(a.slot)))
        else:
            out.append(Move(m.kind, m.type, m.source, m.source_parent, str(a.slot), str(a.gpu)))
    return out


def _gpu_checks(moves: list[Move], src: HostFacts, dst: HostFacts, refusals: list[str]) -> None:
    sv, dv = src.inventory.nvidia_driver_version, dst.inventory.nvidia_driver_version
    # the same vGPU manager or a newer one (a rolling upgrade moves VMs onto upgraded hosts), never an older one
    if sv != dv and (sv is None or dv is None or _driver_key(dv) < _driver_key(sv)):
        refusals.append(f"vGPU manager versions differ: {src.name} runs {sv or 'none'}, {dst.name} runs {dv or 'none'} "
                        f"(a vGPU moves to the same or a newer vGPU manager: upgrade {dst.name} first)")
    src_gpus = {m.source: _gpu_of(src.inventory, m.source_parent) for m in moves}
    for m, g in src_gpus.items():
        board = _board(g)
        same = [d for d in dst.inventory.gpus if _board(d) == board]
        if not same:
            have = sorted({_board_text(_board(d)) for d in dst.inventory.gpus}) or ["no GPU"]
            refusals.append(f"vGPU {m} runs on {_board_text(board)}; {dst.name} has no such board "
                            f"(it has {', '.join(have)}): a vGPU migrates only between identical boards")
            continue
        ecc = _ecc(g)
        if ecc is not None and all(_ecc(d) is not None and _ecc(d) != ecc for d in same):
            refusals.append(f"vGPU {m}: ECC is {ecc} on {src.name}, {_ecc(same[0])} on {dst.name}'s "
                            f"{_board_text(board)} (ECC mode must match)")


def _rewrite(xml: str, moves: list[Move], dest: str) -> str:
    """The domain XML for the destination: its mdev UUIDs and VF addresses, and the provenance that names them."""
    root = parse_xml(xml)
    by_uuid = {m.source: m for m in moves if m.kind == GpuUse.MDEV}
    by_vf = {m.source: m for m in moves if m.kind == GpuUse.VENDOR_VF}
    for addr in root.iterfind("devices/hostdev[@type='mdev']/source/address"):
        m = by_uuid.get(addr.get("uuid", ""))
        if m is not None:
            addr.set("uuid", m.dest)
    for hd in root.iterfind("devices/hostdev[@type='pci']"):
        src_addr = hd.find("source/address")
        if src_addr is None:
            continue
        addr = src_addr
        m = by_vf.get(str(pci_from_address(addr, "hostdev source address")))
        if m is None:
            continue
        to = PciAddress.parse(m.dest)
        addr.set("domain", f"0x{to.domain:04x}")
        addr.set("bus", f"0x{to.bus:02x}")
        addr.set("slot", f"0x{to.slot:02x}")
        addr.set("function", f"0x{to.function:x}")
        hd.set("managed", "yes")
    dom = Domain(root)
    prov = Provenance.of_domain(dom)
    if prov is not None:
        gpus: list[dict[str, str]] = []
        for g in prov.gpus:
            e = dict(g)
            if e.get("kind") == GpuUse.MDEV and e.get("uuid") in by_uuid:
                m = by_uuid[e["uuid"]]
                e.update(uuid=m.dest, parent=m.dest_parent)
            elif e.get("kind") == GpuUse.VENDOR_VF and e.get("vf") in by_vf:
                e.update(vf=by_vf[e["vf"]].dest)
            gpus.append(e)
        Provenance.of(dest, gpus).attach(dom)
    return dom.to_xml()


def plan_migration(vm: str, src: HostFacts, dst: HostFacts, *, live: bool | None = None, postcopy: bool = False,
                   max_downtime_ms: int | None = None, source_uri: str = "", peer_uri: str = "",
                   bandwidth_mib: int | None = None) -> MigrationPlan:
    """Every pre-check at once, the destination's vGPUs and the XML for the destination (pure)."""
    DomainName.parse(vm)
    refusals: list[str] = []
    if vm not in src.domains:
        raise InvalidSpec("VM", vm, f"a domain on {src.name} (it has: {', '.join(sorted(src.domains)) or 'none'})")
    running = vm in src.active
    live = running if live is None else live
    if live and not running:
        refusals.append(f"{vm} is not running on {src.name}: move it with --offline")
    if not live and running:
        refusals.append(f"{vm} is running on {src.name}: --offline moves a shut-off VM (shut it down, or use --live)")
    if src.host_uuid and src.host_uuid == dst.host_uuid:
        refusals.append(f"{src.name} and {dst.name} are the same host (host UUID {src.host_uuid})")
    if vm in dst.domains:
        refusals.append(f"a domain named {vm} already exists on {dst.name}")
    if dst.cordon is not None:
        refusals.append(f"{dst.name} is cordoned: {dst.cordon}")
    xml = src.domains[vm]
    moves = _needs(vm, xml, src, refusals)
    if parse_xml(xml).findall("devices/hostdev"):
        refusals += domain_blockers(xml, postcopy=postcopy)
        if live:
            for side in (src, dst):
                _versions(side, refusals)
    if moves:
        _gpu_checks(moves, src, dst, refusals)
        if not refusals:
            moves = _place_moves(vm, moves, src, dst, refusals)
    plan = MigrationPlan(vm, src.name, dst.name, live, moves, refusals)
    if refusals:
        return plan
    if moves and live and max_downtime_ms is None:
        max_downtime_ms = VGPU_MAX_DOWNTIME_MS
    plan.max_downtime_ms = max_downtime_ms
    plan.dest_xml = _rewrite(src.migratable.get(vm, xml), moves, dst.name)
    steps: list[Step] = []
    for m in moves:
        if m.kind == GpuUse.MDEV:
            steps.append(CreateMdev(dst.name, vm, MdevUuid.parse(m.dest), PciAddress.parse(m.dest_parent),
                                    MdevTypeId.parse(m.type)))
        else:
            steps.append(SetVfType(dst.name, vm, PciAddress.parse(m.dest), VgpuTypeId.parse(m.type)))
    if live:
        steps.append(MigrateDomain(dst.name, vm, xml=plan.dest_xml, source_uri=source_uri, peer_uri=peer_uri,
                                   bandwidth_mib=bandwidth_mib, max_downtime_ms=max_downtime_ms))
    else:
        steps.append(DefineDomain(dst.name, vm, xml=plan.dest_xml))
    plan.steps = steps
    plan.absent_before = frozenset(m.dest for m in moves)
    return plan
