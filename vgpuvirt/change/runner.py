"""The one runner: run steps on a host, journal what ran, undo exactly that in reverse when something fails.

:class:`Runner` is one host's engine. ``run(steps)`` goes through the steps in the order given:

1. consecutive :class:`~vgpuvirt.change.step.HostStep` s go in ONE locked ``host.apply`` batch (check capacity,
   create, wait), whatever their kinds, so 64 vGPUs cost one round trip, not 64; each step gives the services'
   ops and what a failed op means (``step.item()``), run together by
   :func:`~vgpuvirt.services.mutation.apply_items`;
2. each :class:`~vgpuvirt.change.step.DomainStep` is one libvirt call.

Each step that ran goes into the :class:`Journal` with its undo (known beforehand, or learned from the host's
answer: ``undo_from``). ``rollback()`` unwinds the journal in reverse: consecutive host undos in one batch that
goes on past a failed undo, libvirt undos one by one; a step the plan did not run is never touched. When a batch
is cut (the SSH connection drops mid-way) its outcome is unknown: the rollback re-reads the host and undoes only
those of the batch's steps that happened (and, when the caller says which targets were absent before,
``ours``, only those).

A verb runs one host with :func:`run_host` (rollback and :class:`~vgpuvirt.errors.ProvisioningError` on
failure), several hosts as one all-or-nothing change with :func:`run_hosts`, or drives a :class:`Runner` itself
when it reads the host between phases (layouts). Every verb reports with :class:`Report`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.step import DomainStep, HostStep, Step
from vgpuvirt.errors import DeviceError, InvalidSpec, ProvisioningError, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.services.mutation import Outcome, Planned, apply_items

log = logging.getLogger("vgpuvirt.change")

Progress = Callable[[str, Step], None]
Hosts = Host | Sequence[Host] | Mapping[str, Host]
Conns = LibvirtConnection | Mapping[str, LibvirtConnection]


class Cancelled(VgpuvirtError):
    """Another host failed; this one stopped before its next step."""


@dataclass
class Entry:
    step: Step
    certain: bool = True               # False: part of a batch whose outcome is unknown
    undo: Planned | None = None        # a HostStep's undo, as known once the host answered


@dataclass
class Journal:
    host: str
    entries: list[Entry] = field(default_factory=list)

    def add(self, step: Step, certain: bool = True, undo: Planned | None = None) -> None:
        self.entries.append(Entry(step, certain, undo))

    @property
    def completed(self) -> list[str]:
        return [f"{self.host}: {e.step.describe()}" + ("" if e.certain else " (outcome unknown)")
                for e in self.entries]


@dataclass
class Report:
    """What a change did: one format for every verb that changes a host (text: ``lines()``, JSON: ``to_dict()``).
    ``pending_reload``: what was written but takes effect only at the next load of the driver."""

    done: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    seconds: float = 0.0
    host_seconds: dict[str, float] = field(default_factory=dict)
    round_trips: dict[str, int] = field(default_factory=dict)
    pending_reload: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ([f"done: {d}" for d in self.done] + [f"kept: {k}" for k in self.kept]
                + [f"pending driver reload: {p}" for p in self.pending_reload])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"done": self.done, "kept": self.kept, "seconds": round(self.seconds, 3),
                               "host_seconds": {k: round(v, 3) for k, v in self.host_seconds.items()},
                               "round_trips": self.round_trips}
        if self.pending_reload:
            out["pending_driver_reload"] = self.pending_reload
        return out


def hosts_by_name(hosts: Hosts) -> dict[str, Host]:
    if isinstance(hosts, Mapping):
        return dict(hosts)
    if isinstance(hosts, Host):
        return {hosts.name: hosts}
    return {h.name: h for h in hosts}


def conn_for(conn: Conns, host: str) -> LibvirtConnection:
    if isinstance(conn, LibvirtConnection):
        return conn
    return conn[host]


class Runner:
    """One host's changes: ``run`` steps (as many calls as the verb has phases), ``rollback`` on failure."""

    def __init__(self, host: Host, conn: LibvirtConnection | None = None, *, wait_timeout: float = 10.0,
                 progress: Progress | None = None, ours: frozenset[str] | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.host = host
        self.conn = conn
        self.wait_timeout = wait_timeout
        self.progress = progress
        self.ours = ours                 # targets absent when planned: the only ones a cut batch's rollback removes
        self.cancel = cancel or threading.Event()
        self.journal = Journal(host.name)
        self.round_trips: dict[str, int] = {}

    @contextmanager
    def counted(self, phase: str) -> Iterator[None]:
        """Count the round trips of what runs inside under ``phase`` (a read between phases counts too)."""
        before = self.host.round_trips
        try:
            yield
        finally:
            self.round_trips[phase] = self.round_trips.get(phase, 0) + self.host.round_trips - before

    def run(self, steps: Sequence[Step], phase: str = "apply") -> None:
        """Run ``steps`` in order (consecutive host steps in one batch); raises on the first failure, with the
        journal holding everything that ran (or may have)."""
        with self.counted(phase):
            i = 0
            while i < len(steps):
                j = i
                while j < len(steps) and isinstance(steps[j], HostStep):
                    j += 1
                if j > i:
                    self._batch([s for s in steps[i:j] if isinstance(s, HostStep)])
                    i = j
                    continue
                self._call(steps[i])
                i += 1

    @property
    def done(self) -> list[Step]:
        return [e.step for e in self.journal.entries]

    def _tick(self, step: Step) -> None:
        if self.progress is not None:
            self.progress(self.host.name, step)

    def _batch(self, steps: list[HostStep]) -> None:
        if self.cancel.is_set():
            raise Cancelled(f"{self.host.name}: stopped because another host failed")
        first = self._first_failure(steps, self.run_items(steps))
        if first is not None:
            raise first

    def run_items(self, steps: Sequence[HostStep], *, standalone: bool = False) -> list[Outcome]:
        """Host steps in ONE locked batch that stops at the first failed step (``standalone``: goes on past it, each
        step being independent of the others); every step that ran (in full or in part) is journaled, and each
        step's outcome is returned (a ``*_many`` API's per-item answer). Raises only when the batch's answer is lost
        (then every step is journaled as "maybe done")."""
        try:
            outcomes = apply_items(self.host, [s.item(self.wait_timeout) for s in steps],
                                   on_error="continue" if standalone else "stop")
        except VgpuvirtError:
            # The batch may have run in part: every step is "maybe done", its undo the one known beforehand.
            for s in steps:
                self.journal.add(s, certain=False, undo=s.undo_item(self.wait_timeout))
            raise
        for s, o in zip(steps, outcomes, strict=True):
            if o.skipped:
                continue
            undo = s.undo_from(o.results, self.wait_timeout)
            if o.ok or o.wrote or (s.undo_learned and undo is not None):
                # a failed step may have done part of its work: a write that went through, or instances the
                # host's answer names (then its undo is exactly those: certain)
                self.journal.add(s, certain=o.ok or s.undo_learned, undo=undo)
                self._tick(s)
        return outcomes

    def _first_failure(self, steps: Sequence[HostStep], outcomes: Sequence[Outcome]) -> VgpuvirtError | None:
        # Every step that ran is journaled (run_items) before the first failure is raised: the batch goes on past a
        # step whose ops succeeded but which did not take effect (check), so the steps after it ran too.
        first: VgpuvirtError | None = None
        for s, o in zip(steps, outcomes, strict=True):
            if o.skipped:
                continue
            if first is None:
                first = o.error
            if first is None and (why := s.check(o.results)) is not None:
                first = DeviceError(self.host.name, s.target, why)
        return first

    def _call(self, step: Step) -> None:
        if not isinstance(step, DomainStep):
            raise InvalidSpec("step", step.kind, "a host step or a libvirt step")
        if self.cancel.is_set():
            raise Cancelled(f"{self.host.name}: stopped because another host failed")
        if self.conn is None:
            raise InvalidSpec("libvirt connection", None, f"a connection to {self.host.name}'s libvirt for "
                                                          f"'{step.describe()}'")
        step.run(self.conn)
        self.journal.add(step)
        self._tick(step)

    # -- rollback ---------------------------------------------------------------------------
    def undo_partial(self) -> list[str]:
        """Undo only the steps that ran in part (a create whose define then failed), keeping those that completed:
        a ``*_many`` API whose items stand alone. The completed ones stay journaled."""
        partial = [e for e in self.journal.entries if not e.certain]
        kept = [e for e in self.journal.entries if e.certain]
        self.journal.entries[:] = partial
        try:
            return self.rollback()
        finally:
            self.journal.entries[:] = kept

    def rollback(self) -> list[str]:
        """Undo the journal in reverse; one line per step (``FAILED to undo`` where an undo failed). The journal
        is emptied: what is undone is not undone twice."""
        entries = list(reversed(self.journal.entries))
        self.journal.entries.clear()
        out: list[str] = []
        with self.counted("rollback"):
            i = 0
            while i < len(entries):
                if isinstance(entries[i].step, DomainStep):
                    out.append(self._undo_call(entries[i].step))
                    i += 1
                    continue
                j = i
                while j < len(entries) and not isinstance(entries[j].step, DomainStep):
                    j += 1
                out += self._undo_batch(entries[i:j])
                i = j
        return out

    def _undo_call(self, step: Step) -> str:
        name = self.host.name
        assert isinstance(step, DomainStep) and self.conn is not None
        try:
            return f"{name}: {step.undo(self.conn)}"
        except VgpuvirtError as exc:
            return f"{name}: FAILED to undo '{step.describe()}': {exc}"

    def _undo_batch(self, entries: list[Entry]) -> list[str]:
        name = self.host.name
        out: list[str] = []
        planned: list[tuple[HostStep, Planned]] = []     # in the order given (the journal's, reversed)
        unsure: list[tuple[HostStep, Planned]] = []
        for e in entries:
            s = e.step
            assert isinstance(s, HostStep)
            if e.undo is None:
                continue
            planned.append((s, e.undo))
            if not e.certain and s.state_path() is not None:
                unsure.append((s, e.undo))
        try:
            skip: set[int] = set()
            if unsure:
                # Which of the cut batch's steps happened? Only those (and only targets absent before) are undone.
                snap = self.host.read([p for s, _ in unsure if (p := s.state_path()) is not None])
                for s, _ in unsure:
                    if self.ours is not None and s.target not in self.ours:
                        skip.add(id(s))
                    elif not s.happened(snap):
                        skip.add(id(s))
                        out.append(f"{name}: {s.describe()} had not happened; nothing to undo")
            # the undos keep the journal's reverse order, the cut batch's among the rest: what a later step made on
            # an earlier one (vGPUs on new VFs) goes before the earlier one is undone
            todo = [(s, u) for s, u in planned if id(s) not in skip]
            if not todo:
                return out
        except VgpuvirtError as exc:
            return [*out, *(f"{name}: FAILED to undo '{s.describe()}': {exc}" for s, _ in planned)]
        try:
            outcomes = apply_items(self.host, [u for _, u in todo], on_error="continue")
        except VgpuvirtError as exc:
            return out + self._undo_outcome_lost([s for s, _ in todo], exc)
        for (s, _), o in zip(todo, outcomes, strict=True):
            if o.ok:
                out.append(f"{name}: {s.undone()}")
            else:
                out.append(f"{name}: FAILED to undo '{s.describe()}': {o.error}")
        return out

    def _undo_outcome_lost(self, todo: list[HostStep], exc: VgpuvirtError) -> list[str]:
        """The undo batch's answer was lost (a cut mid-rollback): one re-read says which undos happened, rather
        than reporting as failed a vGPU the host did remove; if the host cannot be read either (or nothing on it
        tells), each is reported failed, with the cause."""
        name = self.host.name
        paths = [p for s in todo if (p := s.state_path()) is not None]
        try:
            snap = self.host.read(paths) if paths else None
        except VgpuvirtError:
            snap = None
        if snap is None:
            return [f"{name}: FAILED to undo '{s.describe()}': {exc}" for s in todo]
        return [f"{name}: {s.undone()} (the answer was lost; a re-read shows it done)"
                if s.state_path() is not None and not s.happened(snap)
                else f"{name}: FAILED to undo '{s.describe()}': {exc}" for s in todo]

    def report(self, seconds: float = 0.0, kept: Sequence[str] = ()) -> Report:
        done = [e.step for e in self.journal.entries]
        return Report(done=[f"{self.host.name}: {s.describe()}" for s in done if not _pending(s)],
                      kept=list(kept), seconds=seconds, host_seconds={self.host.name: seconds},
                      round_trips={self.host.name: sum(self.round_trips.values())},
                      pending_reload=[f"{self.host.name}: {s.describe()}" for s in done if _pending(s)])

    def fail(self, exc: BaseException, what: str) -> ProvisioningError:
        """Roll back and return the error to raise: what had run, what the rollback did, the cause."""
        completed = self.journal.completed
        undone = self.rollback()
        log.warning("%s failed on %s: %s; rolled back %d step(s)", what, self.host.name, exc, len(undone))
        return ProvisioningError(f"{self.host.name}: {what} failed: {exc}", completed=completed, rollback=undone,
                                 cause=exc)


def _pending(step: Step) -> bool:
    return isinstance(step, HostStep) and step.reload_pending


def run_host(host: Host, steps: Sequence[Step], conn: LibvirtConnection | None = None, *, what: str,
             wait_timeout: float = 10.0, progress: Progress | None = None, kept: Sequence[str] = ()) -> Report:
    """Run ``steps`` on one host; on any failure undo what ran and raise ProvisioningError (``what`` names the
    verb in its message)."""
    runner = Runner(host, conn, wait_timeout=wait_timeout, progress=progress)
    t0 = time.monotonic()
    try:
        runner.run(steps)
    except Exception as exc:  # every failure, even a bug, must trigger the rollback
        raise runner.fail(exc, what) from exc
    return runner.report(time.monotonic() - t0, kept)


def run_hosts(steps: Mapping[str, Sequence[Step]], hosts: Hosts, conn: Conns, *, what: str = "provisioning",
              progress: Progress | None = None, parallel: bool = True, wait_timeout: float = 10.0,
              ours: Mapping[str, frozenset[str]] | None = None, kept: Sequence[str] = (),
              prior: Mapping[str, Runner] | None = None) -> Report:
    """Run each host's steps (hosts in parallel, one thread and one libvirt connection each) as ONE change: on
    any failure every host's completed steps are rolled back and ProvisioningError says what was done and what
    the rollback did. ``ours``: per host, the targets absent when planned (a cut batch's rollback removes only
    those). ``prior``: runners that already ran part of this change on some hosts (a preparation the plan was
    made after): their journals are taken over, so the one rollback undoes them too, and the report lists them."""
    by_name = hosts_by_name(hosts)
    prior = prior or {}
    names = [h for h, s in steps.items() if s] + [h for h in prior if not steps.get(h)]
    missing = [h for h in names if h not in by_name]
    if missing:
        raise InvalidSpec("hosts", sorted(by_name), f"a Host for each host of the change (missing: {missing})")
    cancel = threading.Event()
    runners: dict[str, Runner] = {}
    for h in names:
        c = conn_for(conn, h) if any(isinstance(s, DomainStep) for s in steps.get(h, ())) else None
        mine = (ours or {}).get(h, frozenset()) if ours is not None else None
        r = prior.get(h)
        if r is None:
            r = Runner(by_name[h], c, wait_timeout=wait_timeout, progress=progress, cancel=cancel, ours=mine)
        else:
            # the preparation's runner goes on with this change: its journal stays, the rest is this change's
            r.conn, r.progress, r.cancel, r.wait_timeout = r.conn or c, progress, cancel, wait_timeout
            r.ours = None if mine is None else mine | {e.step.target for e in r.journal.entries}
        runners[h] = r
    seconds: dict[str, float] = {}
    errors: dict[str, BaseException] = {}
    t0 = time.monotonic()

    def work(h: str) -> None:
        t = time.monotonic()
        try:
            runners[h].run(steps.get(h, ()))
        except BaseException as exc:  # every failure, even a bug, must trigger the rollback
            errors[h] = exc
            cancel.set()
        finally:
            seconds[h] = time.monotonic() - t

    if parallel and len(names) > 1:
        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="vgpuvirt-change") as pool:
            list(pool.map(work, names))
    else:
        for h in names:
            work(h)
            if errors:
                break
    if errors:
        first = next(h for h in names if h in errors and not isinstance(errors[h], Cancelled))
        cause = errors[first]
        completed = [c for h in names for c in runners[h].journal.completed]
        rollback: list[str] = []
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            for part in pool.map(lambda h: runners[h].rollback(), names):
                rollback.extend(part)
        log.warning("%s failed on %s: %s; rolled back %d step(s)", what, first, cause, len(rollback))
        raise ProvisioningError(f"{first}: {cause}", completed=completed, rollback=rollback,
                                cause=cause) from cause
    reports = [runners[h].report(seconds[h]) for h in names]
    return Report(done=[d for r in reports for d in r.done], kept=list(kept), seconds=time.monotonic() - t0,
                  host_seconds=dict(seconds),
                  round_trips={h: sum(runners[h].round_trips.values()) if h in runners else 0
                               for h in steps if h in by_name},
                  pending_reload=[p for r in reports for p in r.pending_reload])
