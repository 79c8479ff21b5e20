"""``plan(inventories, requests) -> Plan``: pure. From what the hosts hold and what is asked, the
steps that would make it so (create vGPU, define domain, start), printable as a dry run or a diff.

Convergence lives here: a VM whose domain already exists (and was made by vgpuvirt) is kept, its
vGPUs are re-created only if they are gone, and it is started only if it should run and does not.
vGPU UUIDs and domain UUIDs are derived from the VM name (UUIDv5), so a rerun after a cut
connection finds the devices a lost batch may have created and adopts them instead of leaking
them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.domain import DefineDomain, StartDomain

# Re-exported: callers import the derived names from plan (they moved to identity for the steps).
from vgpuvirt.change.identity import NAMESPACE as NAMESPACE
from vgpuvirt.change.identity import domain_uuid_for as domain_uuid_for
from vgpuvirt.change.identity import mdev_uuid_for as mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.nvidia_mode import SetMixedSize
from vgpuvirt.change.step import HostStep, Phase, Step, step_from_meta
from vgpuvirt.change.storage import CreateVolume
from vgpuvirt.errors import AlreadyExists, InvalidSpec, NoCapacity, PreflightFailed
from vgpuvirt.libvirt_storage import LibvirtFacts
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.provision.attachment import Attachment
from vgpuvirt.provision.cpu_pinning import PinLedger, threads_per_core
from vgpuvirt.provision.disks import ClonedDisk, disk_for
from vgpuvirt.provision.nic_vf import NicChoice, nic_preparation, take_nic_vf
from vgpuvirt.provision.placement import Assignment, Candidate, Explanation, Policy, place
from vgpuvirt.provision.preflight import Ledger, one_disk_each, pool_dir, problems_of
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.provision.state import HostState, SriovPrep, allow_mixed_size, host_states, sriov_preparation
from vgpuvirt.provision.steps_license import add_seed, seed_problems
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.parts import CpuPinning
from vgpuvirt.xml.provenance import Provenance


@dataclass(frozen=True)
class Kept:
    """A step the plan found already done on the host, and will reuse instead of doing."""

    step: Step
    note: str = ""                            # e.g. "(adopted)": made by an earlier, cut run

    @property
    def host(self) -> str:
        return self.step.host

    @property
    def vm(self) -> str:
        return self.step.vm

    @property
    def what(self) -> str:
        return (self.step.kept() or self.step.describe()) + (f" {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, str]:
        return {"host": self.host, "vm": self.vm, "what": self.what, "action": self.step.kind}


@dataclass
class Plan:
    steps: list[Step]
    kept: list[Kept]
    assignments: list[Assignment]
    explain: Sequence[Candidate]   # an Explanation: its hosts x VMs lines are made when read
    vms: list[VmRequest]
    hosts: list[str]
    # mdev UUIDs / VF addresses absent when planned: the only devices a rollback may remove.
    absent_before: dict[str, frozenset[str]] = field(default_factory=dict)
    # Host preparation that must happen (and be read back) before ``pending`` VMs can be placed.
    prep: list[SriovPrep] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    unmet: str = ""                           # why the pending VMs cannot be placed before the preparation

    @property
    def empty(self) -> bool:
        return not self.steps and not self.prep

    def for_host(self, host: str) -> list[Step]:
        return [s for s in self.steps if s.host == host]

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "steps": [s.to_dict() for s in self.steps],
                "prep": [p.to_dict() for p in self.prep], "pending": list(self.pending),
                "kept": [k.to_dict() for k in self.kept],
                "assignments": [{"vm": a.vm, "host": a.host, "gpu": str(a.gpu), "slot": str(a.slot),
                                 "kind": a.kind, "type": a.type.id, "type_name": a.type.name,
                                 "numa_node": a.numa_node} for a in self.assignments],
                "explain": [c.to_dict() for c in self.explain]}

    def format(self) -> str:
        """A dry-run listing, diff-style: ``+`` will be done, ``=`` already in place."""
        lines: list[str] = []
        for h in self.hosts:
            lines.append(f"{h}:")
            lines += [f"  + {pr.describe()}" for pr in self.prep if pr.host == h]
            lines += [f"  + {s.describe()}" for s in self.for_host(h)]
            lines += [f"  = {k.what}" + ("" if k.vm in k.what else f" ({k.vm})") for k in self.kept if k.host == h]
        if self.pending:
            lines.append(f"then, once the VFs exist (and show their vGPU types), place {len(self.pending)} VM(s): "
                         + ", ".join(self.pending[:8]) + (" ..." if len(self.pending) > 8 else ""))
        if self.empty:
            lines.append("nothing to do: every VM is in place")
        return "\n".join(lines)


def domain_meta(xml: str) -> dict[str, Any] | None:
    """The vgpuvirt metadata of a domain (which host, which GPUs it created), or None when foreign."""
    prov = Provenance.read(xml)
    return prov.to_dict() if prov is not None else None


def _build_domain(vm: VmRequest, host: str, picks: Sequence[Assignment], nic_vf: PciAddress | None = None,
                  pinning: CpuPinning | None = None, pool_dir: str | None = None,
                  siblings: Mapping[int, frozenset[int]] | None = None) -> Domain:
    from vgpuvirt.xml import DomainOptions, HostdevInterface, build_domain

    given = vm.options.get("domain_options")
    opts = given if isinstance(given, DomainOptions) else DomainOptions.from_mapping(vm.domain_settings())
    # A vGPU display needs an emulated graphics device; headless templates (compute) have none.
    headless = vm.template == "compute" or opts.graphics == "none"
    mdevs: list[Any] = []
    pci: list[Any] = []
    gpus_meta: list[Mapping[str, str]] = []
    for a in picks:
        att = _attachment(vm, a, display=not headless and not mdevs)
        gpus_meta.append(att.entry)
        (mdevs if a.kind is GpuUse.MDEV else pci).extend(att.devices)
    nics = []
    if vm.nic is not None and nic_vf is not None:
        from vgpuvirt.model import MacAddress
        nics.append(HostdevInterface(nic_vf, mac=MacAddress.parse(vm.nic.mac) if vm.nic.mac else None,
                                     vlan=vm.nic.vlan))
        gpus_meta.append({"kind": GpuUse.NIC_VF, "address": str(nic_vf)})
    if pinning is not None and given is None and "threads_per_core" not in vm.options:
        # vCPUs on both threads of whole cores: the guest is told so, and schedules like the host does
        t = threads_per_core(pinning, siblings or {})
        if t > 1 and vm.vcpus % t == 0:
            opts = dataclasses.replace(opts, threads_per_core=t)
    numa = picks[0].numa_node if vm.template == "compute" and picks else None
    dom = build_domain(vm.template, name=vm.name, uuid=domain_uuid_for(vm.name), memory_mib=vm.memory_mib,
                       vcpus=vm.vcpus, mdevs=mdevs, pci=pci, nics=nics,
                       disk=disk_for(vm.disk, vm.name, pool_dir), cpu_pinning=pinning, numa_node=numa,
                       options=opts)
    Provenance.of(host, gpus_meta).attach(dom)
    return dom


def _attachment(vm: VmRequest, a: Assignment, display: bool = False) -> Attachment:
    """The attachment of ``a`` as ``vm`` asks for it (audio function, frame rate limiter, display: only its first
    mdev, and only when the domain has a display)."""
    req = vm.gpus[a.index]
    return a.attachment(with_audio=req.with_audio, frl_off=req.frl is False, display=display and req.display)


def plan(inventories: Mapping[str, Any] | Iterable[Any], requests: Sequence[VmRequest], *,
         domains: Mapping[str, Iterable[tuple[str, str]]] | None = None, policy: Policy = "binpack",
         heterogeneous: bool = False, states: Mapping[str, HostState] | None = None,
         libvirt: Mapping[str, LibvirtFacts] | None = None) -> Plan:
    """Compute the steps; touches nothing. ``domains`` maps a host name to its libvirt (name, xml) pairs;
    ``libvirt`` to its networks, pools and firmware (:meth:`LibvirtConnection.facts`), for the pre-flight.
    A VM whose host lacks what its domain needs is refused here (:class:`PreflightFailed`), never at start."""
    # counted once (a count per name was names x names: 65,000 comparisons for 32 hosts of 8 VMs)
    dup = {n for n, k in Counter(vm.name for vm in requests).items() if k > 1}
    if dup:
        raise InvalidSpec("VM names", sorted(dup), "unique names")
    one_disk_each(requests)
    # Placement accounts for what it plans in the states it is given: work on copies (plan is pure).
    hs = ({k: v.clone() for k, v in states.items()} if states is not None
          else host_states(inventories, domains, libvirt))
    if heterogeneous:
        allow_mixed_size(hs.values())
    if not hs:
        raise InvalidSpec("hosts", [], "at least one host inventory")
    steps: list[Step] = []
    kept: list[Kept] = []
    todo: list[VmRequest] = []
    absent: dict[str, set[str]] = {h: set() for h in hs}

    def want(step: Step, note: str = "") -> None:
        """Keep ``step`` when the host already holds what it makes, else plan it."""
        if step.done_in(hs[step.host]):
            if step.kept() is not None:
                kept.append(Kept(step, note))
            return
        steps.append(step)
        if isinstance(step, HostStep):
            absent[step.host].add(step.target)

    # which hosts hold a domain of each name: looking through every host for every VM grew with hosts x VMs
    holders: dict[str, list[HostState]] = {}
    for h in hs.values():
        for name in h.domains:
            holders.setdefault(name, []).append(h)
    for vm in requests:
        found = _find_domain(vm.name, holders.get(vm.name, ()))
        if found is None:
            todo.append(vm)
            continue
        h, prov = found
        kept.append(Kept(DefineDomain(h.name, vm.name, h.domains[vm.name])))
        for g in prov.gpus:
            made = step_from_meta(h.name, vm.name, g)
            if made is not None:
                d = made.details()
                if not made.done_in(h) and "parent" in d:
                    # gone in a reboot: made again only where the capacity model has room (it was planned
                    # blindly, and the apply then blamed a concurrent caller)
                    h.take_again(d["parent"], [d["type"], f"nvidia-{d['type']}"], f"VM {vm.name}'s vGPU {made.target}")
                want(made)
        if vm.start:
            want(StartDomain(h.name, vm.name))
    ready = _adopt_lost(todo, hs, kept)
    to_place = [vm for vm in todo if vm.gpus and vm.name not in {a.vm for a in ready}]
    try:
        if to_place:
            placed, explain, after = place(to_place, hs, policy=policy)
            hs = {**hs, **after}           # place() is pure: the plan goes on from the states it returned
        else:
            placed, explain = [], Explanation()
    except NoCapacity as exc:
        prep = sriov_preparation(hs, to_place)
        if not prep:
            raise
        # Nothing can be placed until the VFs exist and show their types: the plan is the preparation.
        return Plan([], kept, [], [], list(requests), list(hs), {}, prep=prep,
                    pending=[vm.name for vm in to_place], unmet=str(exc))
    assignments = ready + placed
    steps.extend(_mixed_size_steps(hs, placed))
    by_vm: dict[str, list[Assignment]] = {}
    for a in assignments:
        by_vm.setdefault(a.vm, []).append(a)
    adopted_vms = {a.vm for a in ready}
    problems: list[tuple[str, str, str]] = []
    ledger = Ledger()
    pins = PinLedger({h: s.domains for h, s in hs.items()}, {h: s.resources.siblings for h, s in hs.items()})
    nics = _nic_vfs(todo, by_vm, hs)
    if isinstance(nics, Plan):
        nics.kept, nics.vms, nics.explain = kept, list(requests), explain
        return nics
    for vm in todo:
        picks = sorted(by_vm.get(vm.name, ()), key=lambda a: a.index)
        host = picks[0].host if picks else _host_without_gpu(vm, hs)
        if vm.name not in adopted_vms:
            for a in picks:
                made = _attachment(vm, a).step
                if made is not None:
                    steps.append(made)
                    absent[host].add(made.target)
        nic = nics.get(vm.name)
        if nic is not None:
            explain.append(Candidate(vm.name, host, str(nic.vf), "chosen", nic.reason))
        gpu = next((g for g in hs[host].gpus if picks and g.address == picks[0].gpu), None)
        pin, why = pins.choose(host, vm, gpu.local_cpus if gpu is not None else None)
        if why:
            explain.append(Candidate(vm.name, host, str(picks[0].gpu) if picks else "-", "chosen", why))
        dom = _build_domain(vm, host, picks, nic.vf if nic else None, pin, pool_dir(vm, hs[host]),
                            pins.siblings(host))
        problems += [(host, vm.name, p) for p in problems_of(hs[host], vm.name, dom, vm.disk, ledger)]
        if isinstance(vm.disk, ClonedDisk):
            want(CreateVolume(host, vm.name, vm.disk.pool, vm.disk.volume(vm.name)), "(adopted)")
        if vm.license is not None:
            seed = add_seed(vm.license, host, vm.name, str(domain_uuid_for(vm.name)), hs[host], dom, vm.disk)
            problems += seed_problems(hs[host], vm.name, seed)
            want(seed, "(adopted)")
        steps.append(DefineDomain(host, vm.name, dom.to_xml()))
        if vm.start:
            steps.append(StartDomain(host, vm.name))
    if problems:
        raise PreflightFailed.of(problems)
    hosts = list(hs)
    at = {h: i for i, h in enumerate(hosts)}
    # a host's device steps in plan order (one batch: a mixed-size switch before the vGPUs it is for), then its
    # libvirt steps by rank (volumes and defines, then starts)
    steps.sort(key=lambda s: (at[s.host], s.phase == Phase.DOMAINS, s.rank if s.phase == Phase.DOMAINS else 0))
    return Plan(steps, kept, assignments, explain, list(requests), hosts,
                {h: frozenset(v) for h, v in absent.items()})


def _host_without_gpu(vm: VmRequest, hs: Mapping[str, HostState]) -> str:
    """Where a VM without GPUs goes: its ``host``, or the plan's only host."""
    if vm.host is not None:
        if vm.host not in hs:
            raise InvalidSpec("VM host", vm.host, f"one of the plan's hosts ({', '.join(hs)})")
        return vm.host
    if len(hs) != 1:
        raise InvalidSpec(f"host of VM {vm.name}", None, "a host= for a VM without GPUs when there are several hosts")
    return next(iter(hs))


def _adopt_lost(todo: Sequence[VmRequest], hs: Mapping[str, HostState], kept: list[Kept]) -> list[Assignment]:
    """Assignments for the vGPUs a lost batch created for VMs that have no domain yet (UUIDs are derived
    from the VM name, so they are found again); a VM is adopted only when all of its vGPUs are, on one host."""
    ready: list[Assignment] = []
    where: dict[MdevUuid, list[tuple[HostState, str, str]]] = {}   # one pass over the hosts, not one per vGPU
    for h in hs.values():
        for u, (parent, t) in h.existing_mdevs.items():
            where.setdefault(u, []).append((h, parent, t))
    for vm in todo:
        found = [on[-1] for i in range(len(vm.gpus)) if (on := where.get(mdev_uuid_for(vm.name, i)))]
        if len(found) != len(vm.gpus) or len({h.name for h, _, _ in found}) != 1:
            continue
        picks = [_adopt(vm, i, h, parent, t) for i, (h, parent, t) in enumerate(found)]
        if any(a is None for a in picks):
            continue
        for i, (h, parent, t) in enumerate(found):
            kept.append(Kept(CreateMdev(h.name, vm.name, mdev_uuid_for(vm.name, i), PciAddress.parse(parent),
                                        MdevTypeId.parse(t)), "(adopted)"))
        ready.extend(a for a in picks if a is not None)
    return ready


def _nic_vfs(todo: Sequence[VmRequest], by_vm: Mapping[str, list[Assignment]], hs: Mapping[str, HostState]
             ) -> dict[str, NicChoice] | Plan:
    """The NIC VF of each VM that asks for one, nearest its first GPU; or, when some VM finds none free but
    NIC PFs with SR-IOV off can serve it, a plan whose only steps are enabling them (:mod:`.nic_vf`)."""
    out: dict[str, NicChoice] = {}
    short: dict[str, list[VmRequest]] = {}
    refusal: NoCapacity | None = None
    nears: dict[str, PciAddress | None] = {}
    for vm in todo:
        if vm.nic is None:
            continue
        first = min(by_vm[vm.name], key=lambda a: a.index)
        nears[vm.name] = first.gpu
        try:
            out[vm.name] = take_nic_vf(vm, hs[first.host], first.gpu)
        except NoCapacity as exc:
            short.setdefault(first.host, []).append(vm)
            refusal = refusal or exc
    if refusal is None:
        return out
    prep = []
    for host, vms in short.items():
        found = nic_preparation(hs[host], vms, nears)
        if not found:
            raise refusal
        prep.extend(found)
    return Plan([], [], [], [], [], list(hs), {}, prep=prep, pending=[vm.name for vm in todo], unmet=str(refusal))


def _find_domain(name: str, holders: Sequence[HostState]) -> tuple[HostState, Provenance] | None:
    """The host whose domain ``name`` is (by vgpuvirt metadata), among the ``holders`` of a domain of that name
    (in the run's host order); refuses foreign domains."""
    for h in holders:
        xml = h.domains.get(name)
        if xml is None:
            continue
        prov = Provenance.read(xml)
        if prov is None:
            raise AlreadyExists(h.name, name, f"a domain named {name} exists and was not created by vgpuvirt: "
                                              "choose another name or remove it")
        if prov.host == h.name:
            return h, prov
    for h in holders:
        xml = h.domains.get(name)
        if xml is not None:
            other = Provenance.read(xml)
            raise AlreadyExists(h.name, name, f"domain {name} belongs to host {other.host if other else None}, "
                                              "which is not in this run")
    return None


def _adopt(vm: VmRequest, index: int, h: HostState, parent: str, type_id: str) -> Assignment | None:
    """An assignment for a vGPU that already exists (created by a lost batch); capacity untouched."""
    p = PciAddress.parse(parent)
    for g in h.gpus:
        for s in g.slots:
            if s.address == p and s.kind == GpuUse.MDEV and type_id in s.profiles:
                return Assignment(vm.name, index, h.name, g.address, p, GpuUse.MDEV, s.profiles[type_id], (),
                                  g.numa_node)
    return None


def _mixed_size_steps(hs: Mapping[str, HostState], placed: Sequence[Assignment]) -> list[Step]:
    """A mixed-size switch for each GPU counted in that mode (``--heterogeneous``) that gets a vGPU,
    before its vGPUs (host steps keep their order in the host's one batch)."""
    out: list[Step] = []
    for h in hs.values():
        for g in h.gpus:
            first = next((a for a in placed if a.host == h.name and a.gpu == g.address), None)
            if first is not None and g.switch_to_mixed:
                out.append(SetMixedSize(h.name, first.vm, g.address))
    return out
