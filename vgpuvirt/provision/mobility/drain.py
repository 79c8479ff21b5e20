"""Drain a host: cordon it, plan where each of its VMs goes, move them with limited parallelism.

The plan is read once (every host's facts in parallel) and checks each VM against each other host with the
migration's own pre-checks; a VM goes to the host that passes them with the fewest VMs planned so far (a
cordoned host refuses). Applying runs :func:`~.migrate.migrate` per VM, ``parallel`` at a time: each one
re-reads its two hosts and reserves under the destination's lock, so two moves racing for the last vGPU of
one host cannot both have it; the loser tries the VM's next candidate. A running VM moves live, a shut-off
one offline. A VM no host can take stays (its reasons reported), or with ``shutdown_unmovable`` is shut
down gracefully. The host stays cordoned afterwards: uncordon it when its maintenance is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import InvalidSpec, VgpuvirtError
from vgpuvirt.provision.mobility.checks import HostFacts, Side, plan_migration, read_facts
from vgpuvirt.provision.mobility.migrate import MigrationRefused, migrate
from vgpuvirt.services.cordon import set_cordon
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.refs import domain_device_refs


@dataclass
class VmMove:
    vm: str
    live: bool
    candidates: list[str]                       # hosts that pass the pre-checks, the chosen one first
    refusals: dict[str, list[str]] = field(default_factory=dict)   # host -> why not

    @property
    def dest(self) -> str | None:
        return self.candidates[0] if self.candidates else None

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "live": self.live, "dest": self.dest, "candidates": list(self.candidates),
                "refusals": {h: list(r) for h, r in self.refusals.items()}}


@dataclass
class DrainPlan:
    host: str
    moves: list[VmMove]

    @property
    def unmovable(self) -> list[VmMove]:
        return [m for m in self.moves if m.dest is None]

    def format(self) -> str:
        lines = [f"drain {self.host}:"]
        for m in self.moves:
            if m.dest is not None:
                lines.append(f"  + {'live-migrate' if m.live else 'move (offline)'} {m.vm} -> {m.dest}")
            else:
                why = "; ".join(f"{h}: {r[0]}" for h, r in m.refusals.items()) or "no other host"
                lines.append(f"  ! {m.vm} cannot move ({why})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "moves": [m.to_dict() for m in self.moves]}


@dataclass
class Fate:
    vm: str
    fate: str                  # migrated | moved-offline | shut-down | stays | failed
    dest: str | None = None
    detail: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "fate": self.fate, "dest": self.dest, "detail": self.detail,
                "seconds": round(self.seconds, 3)}


@dataclass
class DrainResult:
    plan: DrainPlan
    fates: list[Fate]
    seconds: float
    round_trips: dict[str, int]

    @property
    def ok(self) -> bool:
        return all(f.fate in ("migrated", "moved-offline", "shut-down") for f in self.fates)

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "fates": [f.to_dict() for f in self.fates], "ok": self.ok,
                "seconds": round(self.seconds, 3), "round_trips": self.round_trips}


def _movable_vms(src: HostFacts) -> list[str]:
    """The VMs a drain moves: those vgpuvirt made (provenance) and those holding GPU devices."""
    out = []
    for name, xml in sorted(src.domains.items()):
        refs = domain_device_refs(xml)
        if refs.mdevs or refs.pci or Provenance.read(xml) is not None:
            out.append(name)
    return out


def plan_drain(src: HostFacts, others: list[HostFacts], *, vms: list[str] | None = None) -> DrainPlan:
    """Where each VM of ``src`` goes (pure): each candidate host's pre-checks, least-loaded first."""
    load = {o.name: 0 for o in others}
    moves: list[VmMove] = []
    for vm in vms if vms is not None else _movable_vms(src):
        live = vm in src.active
        ok: list[str] = []
        refusals: dict[str, list[str]] = {}
        for o in others:
            p = plan_migration(vm, src, o, live=live)
            if p.ok:
                ok.append(o.name)
            else:
                refusals[o.name] = p.refusals
        ok.sort(key=lambda h: load[h])
        if ok:
            load[ok[0]] += 1
        moves.append(VmMove(vm, live, ok, refusals))
    return DrainPlan(src.name, moves)


def drain(source: Side, others: list[Side], *, parallel: int = 2, shutdown_unmovable: bool = False,
          dry_run: bool = False, reason: str = "drained", peer_uris: Mapping[str, str] | None = None,
          on_fate: Callable[[Fate], None] | None = None) -> DrainResult:
    """Cordon ``source``, plan and (unless ``dry_run``) move its VMs to ``others``; the host stays cordoned."""
    if not 1 <= parallel <= 64:
        raise InvalidSpec("--parallel", parallel, "a number of migrations at once, 1..64")
    if not others:
        raise InvalidSpec("--host", source.name, "at least one other host to drain to")
    t0 = time.monotonic()
    hosts = [source, *others]
    rt0 = {s.name: s.host.round_trips for s in hosts}
    if not dry_run:
        set_cordon(source.host, reason)
    with ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="vgpuvirt-drain-read") as pool:
        facts = list(pool.map(read_facts, hosts))
    plan = plan_drain(facts[0], facts[1:])
    if dry_run:
        return DrainResult(plan, [], time.monotonic() - t0, _rts(hosts, rt0))
    by_name = {s.name: s for s in others}
    lock = threading.Lock()
    fates: list[Fate] = []

    def one(m: VmMove) -> Fate:
        t = time.monotonic()
        if m.dest is None:
            why = "; ".join(f"{h}: {', '.join(r)}" for h, r in m.refusals.items()) or "no other host"
            if shutdown_unmovable and m.live:
                try:
                    source.conn.shutdown(m.vm)
                except VgpuvirtError as exc:
                    return Fate(m.vm, "failed", None, f"shutdown failed: {exc}", time.monotonic() - t)
                return Fate(m.vm, "shut-down", None, why, time.monotonic() - t)
            return Fate(m.vm, "stays", None, why, time.monotonic() - t)
        errors: list[str] = []
        for dest in m.candidates:
            try:
                migrate(m.vm, source, by_name[dest], live=m.live,
                        peer_uri=(peer_uris or {}).get(dest))
            except (MigrationRefused, VgpuvirtError) as exc:
                errors.append(f"{dest}: {exc}")
                continue
            return Fate(m.vm, "migrated" if m.live else "moved-offline", dest, "", time.monotonic() - t)
        return Fate(m.vm, "failed", None, "; ".join(errors), time.monotonic() - t)

    def run(m: VmMove) -> None:
        f = one(m)
        with lock:
            fates.append(f)
        if on_fate is not None:
            on_fate(f)

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="vgpuvirt-drain") as pool:
        list(pool.map(run, plan.moves))
    order = {m.vm: i for i, m in enumerate(plan.moves)}
    fates.sort(key=lambda f: order[f.vm])
    return DrainResult(plan, fates, time.monotonic() - t0, _rts(hosts, rt0))


def _rts(hosts: list[Side], rt0: dict[str, int]) -> dict[str, int]:
    return {s.name: s.host.round_trips - rt0[s.name] for s in hosts}
