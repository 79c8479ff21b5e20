"""Teardown: destroy the named domains, remove the vGPUs vgpuvirt made for them, then undefine them.

Only domains that carry vgpuvirt's metadata are touched (a foreign domain of the same name is
reported and left alone), and of the devices that metadata lists only those that are provably the
domain's and that no other domain uses (:mod:`.ownership`: copied metadata removes nothing).

Order, per host: destroy each domain (a running VM holds its vGPUs), read every domain's live and
persistent XML, ONE read and ONE batch removing the vGPUs, then undefine each domain whose due vGPUs
are all gone. A vGPU whose removal failed (EBUSY: still held) keeps its domain defined, with its
metadata, so a rerun finds it again and finishes; undefining first would lose the only record of it.
Disks are kept unless ``remove_storage=True``. Rerunning is harmless: what is already gone is reported.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.device_removal import RemoveDevice
from vgpuvirt.change.domain import DestroyDomain, UndefineDomain
from vgpuvirt.change.runner import Report, Runner, conn_for, hosts_by_name
from vgpuvirt.change.step import DeviceStep, Step, step_from_meta
from vgpuvirt.change.storage import DeleteVolume
from vgpuvirt.errors import InvalidSpec, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision.ownership import domain_refs, judge
from vgpuvirt.provision.steps_license import seed_volumes
from vgpuvirt.xml.provenance import Provenance


@dataclass
class TeardownResult:
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    disks_removed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    report: Report = field(default_factory=Report)   # the runner's account: every step that ran, round trips

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        # teardown's own keys (the CLI/Ansible contract), then the one report's (its "seconds" is the same)
        return {**self.report.to_dict(), "removed": self.removed, "skipped": self.skipped, "failed": self.failed,
                "disks_removed": self.disks_removed, "seconds": round(self.seconds, 3)}


def _selected(name: str, names: set[str] | None, patterns: Sequence[str]) -> bool:
    if names is not None and name in names:
        return True
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _step(runner: Runner, step: Step) -> VgpuvirtError | None:
    """Run one step; its error, or None. Teardown goes on past a failure (it never puts back what it removed:
    the report says what is left, and a rerun finishes)."""
    try:
        runner.run([step], "teardown")
    except VgpuvirtError as exc:
        return exc
    return None


def teardown(hosts: Host | Sequence[Host] | Mapping[str, Host],
             conn: LibvirtConnection | Mapping[str, LibvirtConnection], names: Iterable[str] | None = None, *,
             patterns: Sequence[str] = (), remove_storage: bool = False, dry_run: bool = False,
             progress: Callable[[str, str], None] | None = None, wait_timeout: float = 10.0) -> TeardownResult:
    """Remove the VMs named (or matching a glob in ``patterns``) that vgpuvirt made on these hosts."""
    by_name = hosts_by_name(hosts)
    wanted = set(names) if names is not None else None
    if wanted is None and not patterns:
        wanted = set()
    result = TeardownResult()
    t0 = time.monotonic()
    found: set[str] = set()

    def one(hname: str) -> tuple[TeardownResult, Report]:
        t = time.monotonic()
        r = TeardownResult()
        c = conn_for(conn, hname)
        runner = Runner(by_name[hname], c, wait_timeout=wait_timeout)
        mine: dict[str, list[DeviceStep]] = {}
        seeds: dict[str, list[tuple[str, str]]] = {}
        xmls: dict[str, str] = {}
        for d in c.domains():
            if not _selected(d.name, wanted, patterns):
                continue
            prov = Provenance.read(d.xml)
            if prov is None:
                found.add(d.name)
                r.skipped.append(f"{hname}: domain {d.name} was not created by vgpuvirt; left alone")
                continue
            if prov.host not in (hname, None):
                continue  # another host's VM on a shared libvirt (test:///default)
            found.add(d.name)
            if not dry_run and d.active:
                err = _step(runner, DestroyDomain(hname, d.name))
                if err is not None:
                    r.failed.append(f"{hname}: {d.name}: {err}")
                    continue          # still running: its vGPUs are in use, nothing else to do
                r.removed.append(f"{hname}: destroyed {d.name}")
            mine[d.name] = [s for s in (step_from_meta(hname, d.name, g) for g in prov.gpus) if s is not None]
            xmls[d.name] = d.xml
            try:
                seeds[d.name] = seed_volumes(prov.gpus)
            except InvalidSpec as exc:      # a hand-edited record: keep going, say so
                r.failed.append(f"{hname}: {d.name}: license seed record unreadable: {exc}")
        if mine:
            due = _remove_vgpus(runner, c, mine, r, dry_run)
            for name in mine:
                # the license seed is deleted whatever remove_storage says: not among the volumes kept
                vols = [v for v in _volumes(c, name, r, hname)
                        if not any(v.endswith("/" + sv) for _pool, sv in seeds.get(name, ()))]
                if dry_run:
                    r.removed.append(f"{hname}: would destroy and undefine {name}"
                                     + (f" and delete its volume(s) {', '.join(vols)}" if remove_storage and vols
                                        else ""))
                    if vols and not remove_storage:
                        r.skipped.append(f"{hname}: would keep {name}'s volume(s) {', '.join(vols)} "
                                         "(remove_storage=True deletes them)")
                    r.removed += [f"{hname}: would delete license seed {p}/{v}" for p, v in seeds.get(name, ())]
                elif name in due:
                    r.skipped.append(f"{hname}: kept domain {name} defined (destroyed): a vGPU of it is still "
                                     "due; rerun teardown to finish")
                else:
                    _undefine(runner, hname, name, xmls[name], seeds.get(name, ()), vols, remove_storage, r)
                if progress is not None:
                    progress(hname, name)
        return r, runner.report(time.monotonic() - t)

    reports: list[Report] = []
    with ThreadPoolExecutor(max_workers=max(1, len(by_name)), thread_name_prefix="vgpuvirt-teardown") as pool:
        for r, rep in pool.map(one, list(by_name)):
            result.removed += r.removed
            result.skipped += r.skipped
            result.failed += r.failed
            result.disks_removed += r.disks_removed
            reports.append(rep)
    for n in sorted((wanted or set()) - found):
        result.skipped.append(f"domain {n} not found (already removed)")
    result.seconds = time.monotonic() - t0
    result.report = Report(done=[d for rep in reports for d in rep.done], seconds=result.seconds,
                           host_seconds={h: s for rep in reports for h, s in rep.host_seconds.items()},
                           round_trips={h: n for rep in reports for h, n in rep.round_trips.items()})
    return result


def _undefine(runner: Runner, hname: str, name: str, xml: str, seeds: Sequence[tuple[str, str]], vols: list[str],
              remove_storage: bool, r: TeardownResult) -> None:
    """Undefine the domain, then delete its license seeds; stops at the first failure (the rest stays, named)."""
    undef = UndefineDomain(hname, name, xml, remove_storage)
    err = _step(runner, undef)
    if err is not None:
        r.failed.append(f"{hname}: {name}: {err}")
        return
    r.disks_removed += undef.deleted
    r.removed.append(f"{hname}: undefined {name}" + (f"; deleted volume(s) {', '.join(undef.deleted)}"
                                                     if undef.deleted else ""))
    if vols and not remove_storage:
        r.skipped.append(f"{hname}: kept {name}'s volume(s) {', '.join(vols)} (remove_storage=True deletes them)")
    # the seed holds the license token: removed with the domain, whatever remove_storage
    for pool, vol in seeds:
        seed = DeleteVolume(hname, name, pool, vol)
        err = _step(runner, seed)
        if err is not None:
            r.failed.append(f"{hname}: {name}: {err}")
            return
        r.removed.append(f"{hname}: deleted license seed {pool}/{vol}" if seed.found[0]
                         else f"{hname}: license seed {pool}/{vol} was already gone")


def _volumes(c: LibvirtConnection, name: str, r: TeardownResult, hname: str) -> list[str]:
    """The VM's disk volumes, named in what teardown says it deletes or keeps; [] (with a note) if unreadable."""
    try:
        return c.storage_volumes(name)
    except VgpuvirtError as exc:
        r.skipped.append(f"{hname}: could not list the volumes of {name}: {exc}")
        return []


def _of_host(views: Sequence[str], hname: str) -> bool:
    prov = Provenance.read(views[0]) if views else None
    return prov is None or prov.host in (hname, None)


def _remove_vgpus(runner: Runner, c: LibvirtConnection, mine: Mapping[str, Sequence[DeviceStep]],
                  r: TeardownResult, dry_run: bool) -> set[str]:
    """Remove the domains' provable, unused vGPUs in one batch (one more per removal that fails); the names of
    the domains that still have a vGPU due (its removal failed, or another domain uses it)."""
    host = runner.host
    hname = host.name
    due: set[str] = set()
    todo: list[tuple[str, DeviceStep]] = []
    try:
        # On a libvirt shared by several hosts (test fleets), another host's domains name ITS devices, which
        # may have the same addresses as ours: only this host's domains (and foreign ones) can hold ours.
        refs = domain_refs({n: v for n, v in c.xml_views().items() if _of_host(v, hname)})
    except VgpuvirtError as exc:
        r.failed.append(f"{hname}: reading every domain's XML before removing vGPUs: {exc}")
        return set(mine)
    for name, steps in mine.items():
        for v in judge(name, steps, refs):
            if v.refusal is None:
                todo.append((name, v.step))
                continue
            r.failed.append(f"{hname}: {v.refusal}")
            if v.blocks:
                due.add(name)
    if not todo:
        return due
    try:
        snap = host.read([s.state_path() for _, s in todo])
    except VgpuvirtError as exc:
        r.failed.append(f"{hname}: removing vGPUs: {exc}; their domains kept defined so that a rerun can finish")
        return due | {n for n, _ in todo}
    present = [(n, s) for n, s in todo if s.happened(snap)]
    r.skipped += [f"{hname}: vGPU {s.target} already gone" for n, s in todo if (n, s) not in present]
    if dry_run:
        r.removed += [f"{hname}: would remove vGPU {s.target}" for _, s in present]
        return due
    left = [(n, RemoveDevice(hname, n, s)) for n, s in present]
    while left:
        ran = len(runner.journal.entries)
        try:
            runner.run([s for _, s in left], "teardown")
        except VgpuvirtError as exc:
            done = [e for e in runner.journal.entries[ran:] if e.certain]
            if len(done) == len(runner.journal.entries[ran:]) and len(done) < len(left):
                # one removal failed (EBUSY: still held); those before it are done, those after it not tried
                r.removed += [f"{hname}: {s.removed()}" for _, s in left[:len(done)]]
                n, s = left[len(done)]
                r.failed.append(f"{hname}: vGPU {s.target} of {n}: {exc}; {n} kept defined so that a rerun can finish")
                due.add(n)
                left = left[len(done) + 1:]
                continue
            # the batch's outcome is unknown (a cut connection): every domain of it is kept for the rerun
            r.failed.append(f"{hname}: removing vGPUs: {exc}; their domains kept defined so that a rerun can finish")
            return due | {n for n, _ in left}
        r.removed += [f"{hname}: {s.removed()}" for _, s in left]
        left = []
    return due
