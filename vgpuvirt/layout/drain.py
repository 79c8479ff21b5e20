"""Layout changes that take devices from VMs: refuse (default) or drain (shut down, apply, start again).

A VM is affected when its domain XML names a device a step takes away (an mdev that goes, a VF whose
type is cleared or that disappears with an SR-IOV change, a GPU rebound), or when the caller says it uses
one (``users``: for VMs whose device does not show in their XML). ``refuse`` raises naming them, before
anything is written. ``shutdown`` shuts them down (ACPI; after ``timeout`` ``force`` destroys, without it
the apply stops and restarts what it stopped), applies, then gives each drained VM a device of the type it
had (same GPU first) that no other domain uses, rewrites its XML to it, and starts the ones that ran.
"Fits": a free vGPU of the type it had (its GPU first), else a free vGPU its GPU was retyped to with at
least the framebuffer it had; a whole GPU still bound to vfio-pci. A VM that no longer fits is reported
and left defined but stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from vgpuvirt.errors import DeviceBusy, ProvisioningError, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.layout import verbs
from vgpuvirt.layout.model import LayoutConfig
from vgpuvirt.layout.planner import HostPlan
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.xml.domain import parse_xml
from vgpuvirt.xml.refs import domain_device_refs


@dataclass
class DrainReport:
    results: list[verbs.HostApply] = field(default_factory=list)
    drained: dict[str, list[str]] = field(default_factory=dict)       # host -> VMs shut down
    restarted: dict[str, list[str]] = field(default_factory=dict)
    moved: dict[str, dict[str, str]] = field(default_factory=dict)    # host -> VM -> "old -> new"
    unfit: dict[str, dict[str, str]] = field(default_factory=dict)    # host -> VM -> why

    @property
    def ok(self) -> bool:
        return not any(self.unfit.values())

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "hosts": [r.to_dict() for r in self.results], "drained": self.drained,
                "restarted": self.restarted, "moved": self.moved, "unfit": self.unfit}

    def lines(self) -> list[str]:
        out = []
        for r in self.results:
            out.append(f"{r.host}: layout {'applied' if r.changed else 'already in place'} "
                       f"({len(r.done)} step(s); round trips {r.round_trips})")
            out += [f"  + {s.text}" for s in r.done if not s.reload_pending]
            out += [f"  ~ written, pending until the driver reloads: {s.text}" for s in r.pending_reload]
            for vm in self.drained.get(r.host, []):
                out.append(f"  drained {vm}")
            for vm, how in self.moved.get(r.host, {}).items():
                out.append(f"  moved {vm}: {how}")
            for vm in self.restarted.get(r.host, []):
                out.append(f"  started {vm} again")
            for vm, why in self.unfit.get(r.host, {}).items():
                out.append(f"  {vm} no longer fits ({why}): left defined, stopped")
        return out


def affected(plan: HostPlan, domains: Iterable[tuple[str, str]],
             users: Mapping[str, Iterable[str]] | None = None) -> dict[str, set[str]]:
    """VM -> the devices of its that the plan takes away."""
    gone = {t for s in plan.steps for t in s.touches}
    out: dict[str, set[str]] = {}
    for name, xml in domains:
        refs = domain_device_refs(xml)
        hit = {str(u) for u in refs.mdevs} | {str(a) for a in refs.pci}
        if hit & gone:
            out.setdefault(name, set()).update(hit & gone)
    for name, devs in (users or {}).items():
        if set(devs) & gone:
            out.setdefault(name, set()).update(set(devs) & gone)
    return out


def _conn_for(hosts: Sequence[Host], connect: Sequence[str] | None) -> dict[str, LibvirtConnection | None]:
    uris = list(connect or [])
    if uris and len(uris) not in (1, len(hosts)):
        raise VgpuvirtError(f"--connect: one URI, or one per --host ({len(hosts)}), not {len(uris)}")
    out: dict[str, LibvirtConnection | None] = {}
    for i, h in enumerate(hosts):
        uri = uris[i] if len(uris) > 1 else uris[0] if uris else ("test:///default" if h.name.startswith("sim:")
                                                                   else None)
        out[h.name] = LibvirtConnection(uri) if uri else None
    return out


def _stop(conn: LibvirtConnection, names: list[str], timeout: float, force: bool) -> None:
    for n in names:
        conn.shutdown(n)
    deadline = time.monotonic() + timeout
    left = [n for n in names if conn.is_active(n)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [n for n in left if conn.is_active(n)]
    if left and not force:
        for n in names:
            if n not in left:
                conn.start(n)
        raise DeviceBusy(conn.uri, ", ".join(left), f"still running {timeout:g} s after the shutdown request "
                                                    "(pass --force to destroy them); nothing applied")
    for n in left:
        conn.destroy(n)


def _retarget(xml: str, old: str, new: str) -> str:
    root = parse_xml(xml)
    for addr in root.iterfind("devices/hostdev[@type='mdev']/source/address"):
        if addr.get("uuid", "").lower() == old.lower():
            addr.set("uuid", new)
    return str(etree.tostring(root, encoding="unicode"))


def _refit(host: Host, conn: LibvirtConnection, vm: str, devs: set[str], types: Mapping[str, tuple[str, str]],
           report: DrainReport) -> bool:
    """Give ``vm`` a free device of the type of each it lost; False (reported) when one does not fit."""
    pairs = list(conn.domain_xml_pairs())
    _, gpus = verbs.read_gpus(host, pairs)
    free: dict[str, list[tuple[str, str]]] = {}
    for g in gpus:
        for v in g.vgpus:
            if v.uuid is not None and v.domain is None:
                free.setdefault(v.type_id, []).append((str(g.address), v.uuid))
    fb = {t: vt.framebuffer_mib for g in gpus for t, vt in g.budget.types.items() if vt.framebuffer_mib}
    xml = conn.xml(vm, inactive=True)
    for dev in sorted(devs):
        if dev not in types:
            if not any(str(g.address) == dev and g.driver == "vfio-pci" for g in gpus):
                report.unfit.setdefault(host.name, {})[vm] = f"{dev} is not passed through any more"
                return False
            continue
        gpu, tid = types[dev]
        # its own type (its GPU first), else a type its GPU was retyped to with at least its framebuffer
        need = fb.get(tid)
        cands = [(t, c) for t in [tid] for c in sorted(free.get(t, []), key=lambda c: c[0] != gpu)]
        cands += sorted(((t, c) for t, cs in free.items() if t != tid and need and (fb.get(t) or 0) >= need
                         for c in cs if c[0] == gpu), key=lambda tc: (fb.get(tc[0]) or 0, tc))
        if not cands:
            report.unfit.setdefault(host.name, {})[vm] = (f"no free vGPU of type {tid}, nor one as large on GPU {gpu}, "
                                                          f"for {dev}")
            return False
        t, (at, new) = cands[0]
        free[t].remove((at, new))
        xml = _retarget(xml, dev, new)
        report.moved.setdefault(host.name, {})[vm] = f"{dev} -> {new} ({t} on {at})"
    conn.define(xml)
    return True


def apply_with_drain(hosts: Sequence[Host], config: LayoutConfig, *, connect: Sequence[str] | None = None,
                     drain: str = "refuse", timeout: float = 120.0, force: bool = False,
                     users: Mapping[str, Mapping[str, Iterable[str]]] | None = None,
                     conns: Mapping[str, LibvirtConnection | None] | None = None) -> DrainReport:
    """Apply ``config`` to every host (in parallel), refusing or draining the VMs it would take devices
    from. ``users``: host -> VM -> devices it uses that its XML does not name; ``conns``: host -> an open
    connection (instead of ``connect`` URIs; the caller keeps it open)."""
    own = conns is None
    conns = dict(conns) if conns is not None else _conn_for(hosts, connect)
    report = DrainReport()
    state: dict[str, tuple[list[str], dict[str, set[str]], dict[str, tuple[str, str]]]] = {}
    pairs = {h.name: list(c.domain_xml_pairs()) if c else [] for h, c in ((h, conns[h.name]) for h in hosts)}

    def before(h: Host, plan: HostPlan) -> None:
        hit = affected(plan, pairs[h.name], (users or {}).get(h.name))
        if not hit:
            return
        if drain != "shutdown":
            lst = "; ".join(f"{vm} ({', '.join(sorted(d))})" for vm, d in sorted(hit.items()))
            raise DeviceBusy(h.name, "layout " + config.name,
                             f"it would remove or retype devices that defined VMs use: {lst}; "
                             "shut them down first or pass --drain shutdown")
        conn = conns[h.name]
        running = [vm for vm in sorted(hit) if conn is not None and conn.is_active(vm)]
        if conn is not None:
            _stop(conn, running, timeout, force)
        types = {v.uuid or str(v.place): (str(s.gpu), v.type_id) for s in plan.steps for v in s.removes}
        state[h.name] = (running, hit, types)
        report.drained[h.name] = running

    try:
        report.results = verbs.apply(list(hosts), config, domains=pairs, before=before)
    except ProvisioningError:
        _restart_after_failure(conns, state)
        raise
    for h in hosts:
        running, hit, types = state.get(h.name, ([], {}, {}))
        conn = conns[h.name]
        for vm in sorted(hit):
            if conn is None:
                continue
            refs = domain_device_refs(conn.xml(vm, inactive=True))
            in_xml = ({str(u) for u in refs.mdevs} | {str(a) for a in refs.pci}) & hit[vm]
            # a VM related to its device only through ``users`` has no XML to rewrite: it just starts again
            fits = _refit(h, conn, vm, in_xml, types, report) if in_xml else True
            if fits and vm in running and conn is not None:
                conn.start(vm)
                report.restarted.setdefault(h.name, []).append(vm)
    for c in conns.values():
        if c is not None and own:
            c.close()
    return report


def _restart_after_failure(conns: Mapping[str, LibvirtConnection | None],
                           state: Mapping[str, tuple[list[str], dict[str, set[str]], Any]]) -> None:
    """The apply rolled back: the drained VMs' devices are back, so they start again as they were."""
    for host, (running, _, _) in state.items():
        conn = conns.get(host)
        for vm in running:
            if conn is not None:
                try:
                    conn.start(vm)
                except VgpuvirtError:
                    continue
