"""``apply(plan, hosts, conn)``: run a plan's steps with a journal, and undo exactly what was done
when something fails.

Per host, in this order (hosts in parallel, one thread and one libvirt connection each):

1. every :class:`~vgpuvirt.provision.steps.HostStep` of the host (create vGPU, set VF type, ...) in ONE
   locked ``host.apply`` batch (check capacity, create, wait), so 64 VMs cost one round trip, not 64;
   each step gives the services' ops and what a failed op means (``step.item()``), run together by
   :func:`~vgpuvirt.services.mutation.apply_items`;
2. each :class:`~vgpuvirt.provision.steps.DomainStep` in plan order (``define``, then ``start``).

Each completed step goes into the journal; its undo is the step's own (``undo_item()`` / ``undo()``).
On failure the journal is unwound in reverse, across every host of the plan, and
:class:`~vgpuvirt.errors.ProvisioningError` says what was done and what the rollback did. Only
journaled steps are undone: a device or domain the plan did not create is never touched. When a
batch is cut (the SSH connection drops mid-way) its outcome is unknown; the rollback re-reads the
host and removes only those of the batch's devices that exist now *and* were absent when the plan
was made.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import ProvisioningError, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision.plan import Plan
from vgpuvirt.provision.steps import DomainStep, HostStep, Step
from vgpuvirt.services.mutation import apply_items

log = logging.getLogger("vgpuvirt.provision")

Progress = Callable[[str, Step], None]


class Cancelled(VgpuvirtError):
    """Another host failed; this one stopped before its next step."""


@dataclass
class Entry:
    step: Step
    certain: bool = True          # False: part of a batch whose outcome is unknown


@dataclass
class Journal:
    host: str
    entries: list[Entry] = field(default_factory=list)

    def add(self, step: Step, certain: bool = True) -> None:
        self.entries.append(Entry(step, certain))

    @property
    def completed(self) -> list[str]:
        return [f"{self.host}: {e.step.describe()}" + ("" if e.certain else " (outcome unknown)")
                for e in self.entries]


@dataclass
class ApplyResult:
    done: list[str]
    kept: list[str]
    seconds: float
    host_seconds: dict[str, float]
    round_trips: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "kept": self.kept, "seconds": round(self.seconds, 3),
                "host_seconds": {k: round(v, 3) for k, v in self.host_seconds.items()},
                "round_trips": self.round_trips}


def _hosts_by_name(hosts: Host | Sequence[Host] | Mapping[str, Host]) -> dict[str, Host]:
    if isinstance(hosts, Mapping):
        return dict(hosts)
    if isinstance(hosts, Host):
        return {hosts.name: hosts}
    return {h.name: h for h in hosts}


def _conn_for(conn: LibvirtConnection | Mapping[str, LibvirtConnection], host: str) -> LibvirtConnection:
    if isinstance(conn, LibvirtConnection):
        return conn
    return conn[host]


class _Runner:
    def __init__(self, plan: Plan, hosts: dict[str, Host], conn: LibvirtConnection | Mapping[str, LibvirtConnection],
                 progress: Progress | None, wait_timeout: float) -> None:
        self.plan = plan
        self.hosts = hosts
        self.conn = conn
        self.progress = progress
        self.wait_timeout = wait_timeout
        self.cancel = threading.Event()
        self.journals = {h: Journal(h) for h in plan.hosts}
        self.seconds: dict[str, float] = {}

    def _tick(self, host: str, step: Step) -> None:
        if self.progress is not None:
            self.progress(host, step)

    def run_host(self, name: str) -> None:
        t0 = time.monotonic()
        try:
            self._run_host(name)
        finally:
            self.seconds[name] = time.monotonic() - t0

    def _run_host(self, name: str) -> None:
        steps = self.plan.for_host(name)
        if not steps:
            return
        host = self.hosts[name]
        journal = self.journals[name]
        devices = [s for s in steps if isinstance(s, HostStep)]
        if devices:
            try:
                outcomes = apply_items(host, [s.item(self.wait_timeout) for s in devices], on_error="stop")
            except VgpuvirtError:
                # The batch may have run in part: remember every device as "maybe created".
                for s in devices:
                    journal.add(s, certain=False)
                raise
            for s, o in zip(devices, outcomes, strict=True):
                if o.wrote:
                    journal.add(s, certain=o.ok)
                    self._tick(name, s)
                err = o.error
                if err is not None:
                    raise err
        conn = _conn_for(self.conn, name)
        for d in steps:
            if not isinstance(d, DomainStep):
                continue
            if self.cancel.is_set():
                raise Cancelled(f"{name}: stopped because another host failed")
            d.run(conn)
            journal.add(d)
            self._tick(name, d)

    # -- rollback ---------------------------------------------------------------------------
    def rollback_host(self, name: str) -> list[str]:
        journal = self.journals[name]
        out: list[str] = []
        conn = _conn_for(self.conn, name) if journal.entries else None
        devices: list[Entry] = []
        for e in reversed(journal.entries):
            s = e.step
            if not isinstance(s, DomainStep):
                devices.append(e)
                continue
            assert conn is not None
            try:
                out.append(f"{name}: {s.undo(conn)}")
            except VgpuvirtError as exc:
                out.append(f"{name}: FAILED to undo '{s.describe()}': {exc}")
        if devices:
            out += self._undo_devices(name, devices)
        return out

    def _undo_devices(self, name: str, entries: list[Entry]) -> list[str]:
        host = self.hosts[name]
        out: list[str] = []
        todo = [e.step for e in entries if e.certain and isinstance(e.step, HostStep)]
        unsure = [e.step for e in entries if not e.certain and isinstance(e.step, HostStep)]
        try:
            if unsure:
                # Which of the cut batch's devices exist now? Only those absent at plan time are ours.
                ours = self.plan.absent_before.get(name, frozenset())
                snap = host.read([s.state_path() for s in unsure])
                for s in unsure:
                    if s.target not in ours:
                        continue
                    if s.happened(snap):
                        todo.append(s)
                    else:
                        out.append(f"{name}: {s.describe()} had not happened; nothing to undo")
            if not todo:
                return out
        except VgpuvirtError as exc:
            return [*out, *(f"{name}: FAILED to undo '{s.describe()}': {exc}" for s in todo + unsure)]
        try:
            outcomes = apply_items(host, [s.undo_item(self.wait_timeout) for s in todo], on_error="continue")
        except VgpuvirtError as exc:
            return out + self._undo_outcome_lost(name, todo, exc)
        for s, o in zip(todo, outcomes, strict=True):
            if o.ok:
                out.append(f"{name}: {s.undone()}")
            else:
                bad = next(r for r in o.results if not r.ok)
                out.append(f"{name}: FAILED to undo '{s.describe()}': {bad.error or bad.errno}")
        return out


    def _undo_outcome_lost(self, name: str, todo: list[HostStep], exc: VgpuvirtError) -> list[str]:
        """The undo batch's answer was lost (a cut mid-rollback): one re-read says which undos happened, rather
        than reporting as failed a vGPU the host did remove; if the host cannot be read either, each is
        reported failed, with the cause."""
        try:
            snap = self.hosts[name].read([s.state_path() for s in todo])
        except VgpuvirtError:
            return [f"{name}: FAILED to undo '{s.describe()}': {exc}" for s in todo]
        return [f"{name}: {s.undone()} (the answer was lost; a re-read shows it done)" if not s.happened(snap)
                else f"{name}: FAILED to undo '{s.describe()}': {exc}" for s in todo]


def apply(plan: Plan, hosts: Host | Sequence[Host] | Mapping[str, Host],
          conn: LibvirtConnection | Mapping[str, LibvirtConnection], *, progress: Progress | None = None,
          parallel: bool = True, wait_timeout: float = 10.0) -> ApplyResult:
    """Run ``plan``; on any failure roll back every host's completed steps and raise ProvisioningError."""
    by_name = _hosts_by_name(hosts)
    missing = [h for h in plan.hosts if plan.for_host(h) and h not in by_name]
    if missing:
        from vgpuvirt.errors import InvalidSpec
        raise InvalidSpec("hosts", sorted(by_name), f"a Host for each host of the plan (missing: {missing})")
    runner = _Runner(plan, by_name, conn, progress, wait_timeout)
    rt0 = {h: by_name[h].round_trips for h in plan.hosts if h in by_name}
    t0 = time.monotonic()
    errors: dict[str, BaseException] = {}

    def work(h: str) -> None:
        try:
            runner.run_host(h)
        except BaseException as exc:  # every failure, even a bug, must trigger the rollback
            errors[h] = exc
            runner.cancel.set()

    names = [h for h in plan.hosts if plan.for_host(h)]
    if parallel and len(names) > 1:
        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="vgpuvirt-apply") as pool:
            list(pool.map(work, names))
    else:
        for h in names:
            work(h)
            if errors:
                break
    if errors:
        first_host = next(h for h in names if h in errors and not isinstance(errors[h], Cancelled))
        cause = errors[first_host]
        completed = [c for h in names for c in runner.journals[h].completed]
        rollback: list[str] = []
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            for part in pool.map(runner.rollback_host, names):
                rollback.extend(part)
        log.warning("provisioning failed on %s: %s; rolled back %d step(s)", first_host, cause, len(rollback))
        raise ProvisioningError(f"{first_host}: {cause}", completed=completed, rollback=rollback,
                                cause=cause) from cause
    return ApplyResult(
        done=[c for h in names for c in runner.journals[h].completed],
        kept=[f"{k.host}: {k.what}" for k in plan.kept],
        seconds=time.monotonic() - t0,
        host_seconds=dict(runner.seconds),
        round_trips={h: by_name[h].round_trips - rt0[h] for h in rt0},
    )
