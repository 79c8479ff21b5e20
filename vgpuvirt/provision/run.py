"""The main job in one call: inventory every host (in parallel, one round trip each), plan, apply.

``provision(hosts, conn, requests)`` is what ``vgpuvirt provision`` and the examples call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.runner import Progress, Report, Runner, conn_for, hosts_by_name
from vgpuvirt.change.sriov import enable_steps
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import NoCapacity, PreflightFailed, ProvisioningError
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.libvirt_storage import LibvirtFacts
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.apply import apply
from vgpuvirt.provision.placement import Policy
from vgpuvirt.provision.plan import Plan, mdev_uuid_for, plan
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.usage import GpuUse


@dataclass
class ProvisionResult:
    plan: Plan
    applied: Report | None
    inventory_seconds: float
    plan_seconds: float

    def rows(self) -> list[dict[str, Any]]:
        """One row per VM GPU for the summary table: VM, host, GPU, type, device, action."""
        acted = {(s.host, s.vm) for s in self.plan.steps}
        out = []
        for a in self.plan.assignments:
            dev = str(mdev_uuid_for(a.vm, a.index)) if a.kind == GpuUse.MDEV else str(a.slot)
            out.append({"vm": a.vm, "host": a.host, "gpu": str(a.gpu), "type": a.type.id, "type_name": a.type.name,
                        "device": dev, "numa_node": a.numa_node,
                        "status": "created" if (a.host, a.vm) in acted else "kept"})
        placed = {a.vm for a in self.plan.assignments}
        for st in self.plan.steps:            # VMs without GPUs (gpus=()) have no assignment
            if st.vm not in placed and isinstance(st, DefineDomain):
                out.append({"vm": st.vm, "host": st.host, "gpu": None, "type": None, "type_name": None,
                            "device": None, "numa_node": None, "status": "created"})
        out += self._kept_rows(placed)
        return out

    def _kept_rows(self, placed: set[str]) -> list[dict[str, Any]]:
        """Kept VMs: one row per vGPU their metadata lists (parent, type, device), whether it is there or
        made again; status ``started`` only when this run starts the VM, ``re-created`` when it makes a vGPU
        of it again, else ``kept``."""
        kinds: dict[tuple[str, str], set[str]] = {}
        for st in self.plan.steps:
            kinds.setdefault((st.host, st.vm), set()).add(st.kind)
        devices: dict[tuple[str, str], list[Any]] = {}
        for st in [*(k.step for k in self.plan.kept), *self.plan.steps]:
            if isinstance(st, CreateMdev | SetVfType):
                devices.setdefault((st.host, st.vm), []).append(st)
        out: list[dict[str, Any]] = []
        for k in self.plan.kept:
            if k.vm in placed or not isinstance(k.step, DefineDomain):
                continue
            did = kinds.get((k.host, k.vm), set())
            status = "started" if "start" in did else "re-created" if did else "kept"
            devs = devices.get((k.host, k.vm)) or [None]
            for d in devs:
                place = None if d is None else str(d.parent if isinstance(d, CreateMdev) else d.vf)
                out.append({"vm": k.vm, "host": k.host, "gpu": place, "type": None if d is None else str(d.type),
                            "type_name": None, "device": None if d is None else d.target, "numa_node": None,
                            "status": status})
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {"plan": self.plan.to_dict(), "vms": self.rows(),
             "timing": {"inventory_s": round(self.inventory_seconds, 3), "plan_s": round(self.plan_seconds, 3)}}
        if self.applied is not None:
            d["applied"] = self.applied.to_dict()
        return d


def gather(hosts: Mapping[str, Host], conn: LibvirtConnection | Mapping[str, LibvirtConnection],
           facts: dict[str, LibvirtFacts] | None = None) -> tuple[dict[str, Any], dict[str, list[tuple[str, str]]]]:
    """Inventories and libvirt domains of every host, hosts in parallel; with ``facts`` (a dict to fill),
    also each libvirt's networks, pools and firmware, for the plan's pre-flight."""
    from vgpuvirt.services.inventory.read import inventory

    def one(name: str) -> tuple[str, Any, list[tuple[str, str]], LibvirtFacts | None]:
        c = conn_for(conn, name)
        pairs = list(c.domain_xml_pairs())
        lv = c.facts() if facts is not None else None
        return name, inventory(hosts[name], domains=pairs), pairs, lv

    invs: dict[str, Any] = {}
    doms: dict[str, list[tuple[str, str]]] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(hosts)), thread_name_prefix="vgpuvirt-inventory") as pool:
        for name, inv, pairs, lv in pool.map(one, list(hosts)):
            invs[name] = inv
            doms[name] = pairs
            if facts is not None and lv is not None:
                facts[name] = lv
    return invs, doms


def provision(hosts: Host | Sequence[Host] | Mapping[str, Host],
              conn: LibvirtConnection | Mapping[str, LibvirtConnection], requests: Sequence[VmRequest], *,
              policy: Policy = "binpack", heterogeneous: bool = False, dry_run: bool = False,
              progress: Progress | None = None, on_plan: Callable[[Plan], None] | None = None,
              wait_timeout: float = 10.0) -> ProvisionResult:
    by_name = hosts_by_name(hosts)
    t0 = time.monotonic()
    facts: dict[str, LibvirtFacts] = {}
    invs, doms = gather(by_name, conn, facts)
    t1 = time.monotonic()
    p = plan(invs, requests, domains=doms, policy=policy, heterogeneous=heterogeneous, libvirt=facts)
    t2 = time.monotonic()
    if p.prep and not dry_run:
        return _prepare_then_provision(p, by_name, conn, requests, policy=policy, heterogeneous=heterogeneous,
                                       progress=progress, on_plan=on_plan, wait_timeout=wait_timeout, t0=t0)
    if on_plan is not None:
        on_plan(p)
    applied = None if dry_run else apply(p, by_name, conn, progress=progress, wait_timeout=wait_timeout)
    return ProvisionResult(p, applied, t1 - t0, t2 - t1)


def _prepare_then_provision(prep_plan: Plan, hosts: dict[str, Host],
                            conn: LibvirtConnection | Mapping[str, LibvirtConnection], requests: Sequence[VmRequest],
                            *, policy: Policy, heterogeneous: bool, progress: Progress | None,
                            on_plan: Callable[[Plan], None] | None, wait_timeout: float, t0: float) -> ProvisionResult:
    """Enable the VFs the plan asks for (a change-engine step on each host's runner), read the hosts again, plan
    and apply on the same runners: the one rollback of a failure undoes the provisioning and the preparation (the
    hosts are left as they were)."""
    runners: dict[str, Runner] = {}
    tried: set[tuple[str, PciAddress]] = set()
    try:
        todo = prep_plan.prep
        while True:
            # A second round only when the new plan asks for other PFs: vGPU boards first, then the NICs
            # the VMs placed on them need (each PF at most once, so this ends).
            for h in dict.fromkeys(pr.host for pr in todo):
                # no progress ticks here: they count the plan's steps (apply's run_hosts sets them on this runner)
                r = runners.setdefault(h, Runner(hosts[h], wait_timeout=wait_timeout))
                r.run(enable_steps(hosts[h], [pr.pf for pr in todo if pr.host == h]), phase="prepare")
            tried |= {(pr.host, pr.pf) for pr in todo}
            facts: dict[str, LibvirtFacts] = {}
            invs, doms = gather(hosts, conn, facts)
            t1 = time.monotonic()
            p = plan(invs, requests, domains=doms, policy=policy, heterogeneous=heterogeneous, libvirt=facts)
            t2 = time.monotonic()
            todo = [pr for pr in p.prep if (pr.host, pr.pf) not in tried]
            if not p.prep:
                break
            if not todo:
                raise NoCapacity(", ".join(hosts), ", ".join(p.pending),
                                 f"still nothing fits after enabling VFs: {p.unmet}")
        if on_plan is not None:
            on_plan(p)
        applied = apply(p, hosts, conn, progress=progress, wait_timeout=wait_timeout, prior=runners)
    except ProvisioningError:
        raise                       # apply's rollback took the preparation's journals over: all undone
    except BaseException as exc:    # the preparation or the re-read/plan failed: undo what the preparation did
        made = [c for r in runners.values() for c in r.journal.completed]
        undone = [line for r in runners.values() for line in r.rollback()]
        if made:
            # A pre-flight refusal here comes after VFs were enabled (and disabled again): its own "nothing
            # was changed" would contradict the lines that follow.
            why = f"pre-flight refused the plan: {exc.shown}" if isinstance(exc, PreflightFailed) else str(exc)
            raise ProvisioningError(f"after enabling SR-IOV: {why}", completed=made, rollback=undone,
                                    cause=exc) from exc
        raise
    return ProvisionResult(p, applied, t1 - t0, t2 - t1)
