"""``plan(inventories, requests) -> Plan``: pure. From what the hosts hold and what is asked, the
steps that would make it so (create vGPU, define domain, start), printable as a dry run or a diff.

Convergence lives here: a VM whose domain already exists (and was made by vgpuvirt) is kept, its
vGPUs are re-created only if they are gone, and it is started only if it should run and does not.
vGPU UUIDs and domain UUIDs are derived from the VM name (UUIDv5), so a rerun after a cut
connection finds the devices a lost batch may have created and adopts them instead of leaking
them.
"""

from __future__ import annotations

import uuid as _uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lxml import etree

from vgpuvirt.errors import AlreadyExists, InvalidSpec
from vgpuvirt.model import MdevUuid, PciAddress, parse_cpulist
from vgpuvirt.provision.placement import Assignment, Candidate, Policy, place
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.provision.state import HostState, host_states

NAMESPACE = _uuid.UUID("7f6c3b2e-5a41-4c8e-9d1f-6b0a2e9c4d17")
META_NS = "https://vgpuvirt.dev/xmlns/provision/1"
META_TAG = f"{{{META_NS}}}provision"

Action = Literal["create-mdev", "set-vf-type", "define", "start"]
DEVICE_ACTIONS = ("create-mdev", "set-vf-type")


def mdev_uuid_for(vm: str, index: int) -> MdevUuid:
    return MdevUuid(str(_uuid.uuid5(NAMESPACE, f"mdev/{vm}/{index}")))


def domain_uuid_for(vm: str) -> str:
    return str(_uuid.uuid5(NAMESPACE, f"domain/{vm}"))


@dataclass(frozen=True)
class Step:
    action: Action
    host: str
    vm: str
    target: str                               # mdev UUID, VF address, or domain name
    parent: str | None = None                 # mdev parent / VF address
    type: str | None = None                   # mdev type id or numeric vGPU type
    xml: str | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        if self.action == "create-mdev":
            return f"create vGPU {self.type} {self.target} on {self.parent} (for {self.vm})"
        if self.action == "set-vf-type":
            return f"set vGPU type {self.type} on VF {self.target} (for {self.vm})"
        if self.action == "define":
            return f"define domain {self.target}"
        return f"start domain {self.target}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.action, "host": self.host, "vm": self.vm, "target": self.target}
        if self.parent:
            d["parent"] = self.parent
        if self.type:
            d["type"] = self.type
        return d


@dataclass(frozen=True)
class Kept:
    """Something the plan found already in place and will reuse."""

    host: str
    vm: str
    what: str

    def to_dict(self) -> dict[str, str]:
        return {"host": self.host, "vm": self.vm, "what": self.what}


@dataclass
class Plan:
    steps: list[Step]
    kept: list[Kept]
    assignments: list[Assignment]
    explain: list[Candidate]
    vms: list[VmRequest]
    hosts: list[str]
    # mdev UUIDs / VF addresses absent when planned: the only devices a rollback may remove.
    absent_before: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.steps

    def for_host(self, host: str) -> list[Step]:
        return [s for s in self.steps if s.host == host]

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "steps": [s.to_dict() for s in self.steps],
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
            for s in self.for_host(h):
                lines.append(f"  + {s.describe()}")
            for k in self.kept:
                if k.host == h:
                    lines.append(f"  = {k.what}" + ("" if k.vm in k.what else f" ({k.vm})"))
        if self.empty:
            lines.append("nothing to do: every VM is in place")
        return "\n".join(lines)


def _meta(xml: str) -> dict[str, Any] | None:
    root = etree.fromstring(xml.encode())
    el = root.find(f"metadata/{META_TAG}")
    if el is None:
        return None
    return {"host": el.get("host"), "gpus": [dict(g.attrib) for g in el]}


def _add_meta(xml: str, host: str, gpus: Sequence[dict[str, str]]) -> str:
    root = etree.fromstring(xml.encode())
    md = root.find("metadata")
    if md is None:
        md = etree.Element("metadata")
        # libvirt keeps <metadata> after <description>/<title>, before <maxMemory>/<memory>
        anchor = next((root.index(c) + 1 for c in root if c.tag in ("name", "uuid", "title", "description")), 1)
        root.insert(anchor, md)
    el = etree.SubElement(md, META_TAG, nsmap={"vgpuvirt": META_NS}, host=host)
    for g in gpus:
        etree.SubElement(el, f"{{{META_NS}}}gpu", attrib=dict(g))
    return etree.tostring(root, encoding="unicode")


def domain_meta(xml: str) -> dict[str, Any] | None:
    """The vgpuvirt metadata of a domain (which host, which GPUs it created), or None when foreign."""
    return _meta(xml)


def _build_xml(vm: VmRequest, host: str, picks: Sequence[Assignment], nic_vf: PciAddress | None = None) -> str:
    from vgpuvirt.xml import Disk, DomainOptions, HostdevInterface, MdevHostdev, PciHostdev, build_domain

    given = vm.options.get("domain_options")
    if isinstance(given, DomainOptions):
        opts = given
    else:
        kw = {k: v for k, v in vm.options.items() if k not in ("domain_options", "nic_vf")}
        opts = DomainOptions(**kw)  # type: ignore[arg-type]
    # A vGPU display needs an emulated graphics device; headless templates (compute) have none.
    headless = vm.template == "compute" or opts.graphics == "none"
    mdevs: list[Any] = []
    pci: list[Any] = []
    gpus_meta: list[dict[str, str]] = []
    for a in picks:
        req = vm.gpus[a.index]
        if a.kind == "mdev":
            u = mdev_uuid_for(vm.name, a.index)
            first_display = req.display and not headless and not mdevs
            mdevs.append(MdevHostdev(u, display=first_display, ramfb=first_display))
            gpus_meta.append({"kind": "mdev", "uuid": str(u), "parent": str(a.slot), "type": a.type.id})
        elif a.kind == "vendor-vf":
            pci.append(PciHostdev.vgpu_vf(a.slot))
            gpus_meta.append({"kind": "vendor-vf", "vf": str(a.slot), "type": str(a.type.numeric_id)})
        elif a.kind == "vf":
            pci.append(PciHostdev(a.slot))
            gpus_meta.append({"kind": "vf", "address": str(a.slot)})
        else:
            funcs = a.functions if req.with_audio else (a.slot,)
            pci.extend(PciHostdev(f) for f in funcs)
            gpus_meta.append({"kind": "whole", "address": str(a.slot)})
    nics = []
    if vm.nic is not None and nic_vf is not None:
        from vgpuvirt.model import MacAddress
        nics.append(HostdevInterface(nic_vf, mac=MacAddress.parse(vm.nic.mac) if vm.nic.mac else None,
                                     vlan=vm.nic.vlan))
        gpus_meta.append({"kind": "nic-vf", "address": str(nic_vf)})
    pinning = None
    if vm.host_cpus:
        from vgpuvirt.xml import CpuPinning
        cpus = sorted(parse_cpulist(vm.host_cpus))
        pinning = CpuPinning.from_cpulist(",".join(map(str, cpus[: vm.vcpus])))
    numa = picks[0].numa_node if vm.template == "compute" else None
    dom = build_domain(vm.template, name=vm.name, uuid=domain_uuid_for(vm.name), memory_mib=vm.memory_mib,
                       vcpus=vm.vcpus, mdevs=mdevs, pci=pci, nics=nics,
                       disk=Disk(vm.disk) if vm.disk else None, cpu_pinning=pinning, numa_node=numa,
                       options=opts)
    return _add_meta(dom.to_xml(), host, gpus_meta)


def plan(inventories: Mapping[str, Any] | Iterable[Any], requests: Sequence[VmRequest], *,
         domains: Mapping[str, Iterable[tuple[str, str]]] | None = None, policy: Policy = "binpack",
         heterogeneous: bool = False, states: Mapping[str, HostState] | None = None) -> Plan:
    """Compute the steps; touches nothing. ``domains`` maps a host name to its libvirt (name, xml) pairs."""
    names = [vm.name for vm in requests]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InvalidSpec("VM names", sorted(dup), "unique names")
    hs = dict(states) if states is not None else host_states(inventories, domains, heterogeneous=heterogeneous)
    if not hs:
        raise InvalidSpec("hosts", [], "at least one host inventory")
    steps: list[Step] = []
    kept: list[Kept] = []
    todo: list[VmRequest] = []
    absent: dict[str, set[str]] = {h: set() for h in hs}
    for vm in requests:
        found = _find_domain(vm.name, hs)
        if found is None:
            todo.append(vm)
            continue
        h, meta = found
        kept.append(Kept(h.name, vm.name, f"domain {vm.name}"))
        for g in meta["gpus"]:
            if g.get("kind") == "mdev":
                u = MdevUuid.parse(g["uuid"])
                if u in h.existing_mdevs:
                    kept.append(Kept(h.name, vm.name, f"vGPU {g['type']} {u} on {g['parent']}"))
                else:
                    steps.append(Step("create-mdev", h.name, vm.name, str(u), g["parent"], g["type"]))
                    absent[h.name].add(str(u))
            elif g.get("kind") == "vendor-vf":
                vf = PciAddress.parse(g["vf"])
                if h.vf_types.get(vf) == int(g["type"]):
                    kept.append(Kept(h.name, vm.name, f"vGPU type {g['type']} on VF {vf}"))
                else:
                    steps.append(Step("set-vf-type", h.name, vm.name, str(vf), str(vf), g["type"]))
                    absent[h.name].add(str(vf))
        if vm.start and not _active(h, vm.name):
            steps.append(Step("start", h.name, vm.name, vm.name))
    # Adopt vGPUs a lost batch may have created for a VM that has no domain yet.
    adopted: dict[str, tuple[str, str, str]] = {}
    for vm in todo:
        for i in range(len(vm.gpus)):
            u = mdev_uuid_for(vm.name, i)
            for h in hs.values():
                if u in h.existing_mdevs:
                    parent, t = h.existing_mdevs[u]
                    adopted[f"{vm.name}/{i}"] = (h.name, str(parent), t)
    ready: list[Assignment] = []
    to_place: list[VmRequest] = []
    for vm in todo:
        got = [adopted.get(f"{vm.name}/{i}") for i in range(len(vm.gpus))]
        if all(got) and len({g[0] for g in got if g}) == 1:
            for i, g in enumerate(got):
                assert g is not None
                a = _adopt(vm, i, hs[g[0]], g[1], g[2])
                if a is None:
                    break
                ready.append(a)
                kept.append(Kept(g[0], vm.name, f"vGPU {g[2]} {mdev_uuid_for(vm.name, i)} on {g[1]} (adopted)"))
            else:
                continue
        to_place.append(vm)
    placed, explain = place(to_place, hs, policy=policy) if to_place else ([], [])
    assignments = ready + placed
    by_vm: dict[str, list[Assignment]] = {}
    for a in assignments:
        by_vm.setdefault(a.vm, []).append(a)
    adopted_vms = {a.vm for a in ready}
    for vm in todo:
        picks = sorted(by_vm[vm.name], key=lambda a: a.index)
        host = picks[0].host
        for a in picks:
            if vm.name in adopted_vms:
                continue
            if a.kind == "mdev":
                u = mdev_uuid_for(vm.name, a.index)
                steps.append(Step("create-mdev", host, vm.name, str(u), str(a.slot), a.type.id))
                absent[host].add(str(u))
            elif a.kind == "vendor-vf":
                steps.append(Step("set-vf-type", host, vm.name, str(a.slot), str(a.slot), str(a.type.numeric_id)))
                absent[host].add(str(a.slot))
        nic_vf = _take_nic_vf(vm, hs[host]) if vm.nic is not None else None
        xml = _build_xml(vm, host, picks, nic_vf)
        steps.append(Step("define", host, vm.name, vm.name, xml=xml))
        if vm.start:
            steps.append(Step("start", host, vm.name, vm.name))
    order = {"create-mdev": 0, "set-vf-type": 0, "define": 1, "start": 2}
    steps.sort(key=lambda s: (list(hs).index(s.host), order[s.action]))
    return Plan(steps, kept, assignments, explain, list(requests), list(hs),
                {h: frozenset(v) for h, v in absent.items()})


def _take_nic_vf(vm: VmRequest, h: HostState) -> PciAddress:
    assert vm.nic is not None
    for i, (vf, pf) in enumerate(h.free_nic_vfs):
        if vm.nic.pf is None or pf == vm.nic.pf:
            del h.free_nic_vfs[i]
            return vf
    from vgpuvirt.errors import NoCapacity
    raise NoCapacity(h.name, str(vm.nic.pf or "NIC"), f"no free SR-IOV NIC VF for {vm.name}"
                     + (f" on PF {vm.nic.pf}" if vm.nic.pf else ""))


def _find_domain(name: str, hs: Mapping[str, HostState]) -> tuple[HostState, dict[str, Any]] | None:
    """The host whose domain ``name`` is (by vgpuvirt metadata); refuses foreign domains."""
    for h in hs.values():
        xml = h.domains.get(name)
        if xml is None:
            continue
        meta = _meta(xml)
        if meta is None:
            raise AlreadyExists(h.name, name, f"a domain named {name} exists and was not created by vgpuvirt: "
                                              "choose another name or remove it")
        if meta.get("host") == h.name:
            return h, meta
    for h in hs.values():
        xml = h.domains.get(name)
        if xml is not None:
            other = (_meta(xml) or {}).get("host")
            raise AlreadyExists(h.name, name, f"domain {name} belongs to host {other}, which is not in this run")
    return None


def _adopt(vm: VmRequest, index: int, h: HostState, parent: str, type_id: str) -> Assignment | None:
    """An assignment for a vGPU that already exists (created by a lost batch); capacity untouched."""
    p = PciAddress.parse(parent)
    for g in h.gpus:
        for s in g.slots:
            if s.address == p and s.kind == "mdev" and type_id in s.profiles:
                return Assignment(vm.name, index, h.name, g.address, p, "mdev", s.profiles[type_id], (), g.numa_node)
    return None


def _active(h: HostState, name: str) -> bool:
    xml = h.domains.get(name, "")
    # live XML of a running domain carries an id attribute
    try:
        return etree.fromstring(xml.encode()).get("id") not in (None, "-1")
    except etree.XMLSyntaxError:
        return False
