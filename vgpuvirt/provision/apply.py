"""``apply(plan, hosts, conn)``: run a plan's steps with a journal, and undo exactly what was done
when something fails.

Per host, in this order (hosts in parallel, one thread and one libvirt connection each):

1. every vGPU of the host in ONE locked ``host.apply`` batch (check capacity, create, wait), so
   64 VMs cost one round trip, not 64; the ops of each device, and what a failed op means, come
   from the services (:func:`~vgpuvirt.services.mdev.create_item`,
   :func:`~vgpuvirt.services.vendor_vgpu.assign_item`), run together by
   :func:`~vgpuvirt.services.mutation.apply_items`;
2. ``define`` each domain, then 3. ``start`` those that should run.

Each completed step goes into the journal with its undo (remove the vGPU / undefine / destroy).
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
from vgpuvirt.host.base import Host, Snapshot
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.provision.plan import DEVICE_ACTIONS, Plan, Step
from vgpuvirt.services.mdev import MdevSpec, create_item, device_path, remove_item
from vgpuvirt.services.mutation import Planned, apply_items
from vgpuvirt.services.vendor_vgpu import assign_item, release_item, vf_type_path

log = logging.getLogger("vgpuvirt.provision")

Progress = Callable[[str, Step], None]


class Cancelled(VgpuvirtError):
    """Another host failed; this one stopped before its next step."""


def _mdev_dir(uuid: str) -> str:
    return device_path(MdevUuid.parse(uuid))


def _vf_type_path(vf: str) -> str:
    return vf_type_path(PciAddress.parse(vf))


def device_item(step: Step, wait_timeout: float) -> Planned:
    """The services' locked ops for one device step; capacity is re-checked inside the batch."""
    assert step.type is not None
    if step.action == "create-mdev":
        assert step.parent is not None
        return create_item(step.host, MdevSpec.of(step.parent, step.type, step.target), wait_timeout=wait_timeout)
    return assign_item(step.host, PciAddress.parse(step.target), VgpuTypeId.parse(step.type),
                       wait_timeout=wait_timeout)


def undo_item(step: Step, wait_timeout: float) -> Planned:
    if step.action == "create-mdev":
        return remove_item(step.host, MdevUuid.parse(step.target), wait_timeout=wait_timeout)
    return release_item(step.host, PciAddress.parse(step.target), wait_timeout=wait_timeout)


def state_path(step: Step) -> str:
    """The host path whose state says whether a device step has happened."""
    return _mdev_dir(step.target) if step.action == "create-mdev" else _vf_type_path(step.target)


def happened(snap: Snapshot, step: Step) -> bool:
    """Whether the host, as read, holds what a device step makes."""
    if step.action == "create-mdev":
        return snap.has(state_path(step))
    return snap.text(state_path(step)) == str(step.type)


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
        devices = [s for s in steps if s.action in DEVICE_ACTIONS]
        if devices:
            try:
                outcomes = apply_items(host, [device_item(s, self.wait_timeout) for s in devices], on_error="stop")
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
        for s in steps:
            if s.action not in ("define", "start"):
                continue
            if self.cancel.is_set():
                raise Cancelled(f"{name}: stopped because another host failed")
            if s.action == "define":
                assert s.xml is not None
                conn.define(s.xml)
            else:
                conn.start(s.target)
            journal.add(s)
            self._tick(name, s)

    # -- rollback ---------------------------------------------------------------------------
    def rollback_host(self, name: str) -> list[str]:
        journal = self.journals[name]
        out: list[str] = []
        conn = _conn_for(self.conn, name) if journal.entries else None
        devices: list[Entry] = []
        for e in reversed(journal.entries):
            s = e.step
            if s.action in DEVICE_ACTIONS:
                devices.append(e)
                continue
            assert conn is not None
            try:
                if s.action == "start":
                    conn.destroy(s.target)
                    out.append(f"{name}: destroyed domain {s.target}")
                else:
                    conn.undefine(s.target)
                    out.append(f"{name}: undefined domain {s.target}")
            except VgpuvirtError as exc:
                out.append(f"{name}: FAILED to undo '{s.describe()}': {exc}")
        if devices:
            out += self._undo_devices(name, devices)
        return out

    def _undo_devices(self, name: str, entries: list[Entry]) -> list[str]:
        host = self.hosts[name]
        out: list[str] = []
        todo = [e.step for e in entries if e.certain]
        unsure = [e.step for e in entries if not e.certain]
        try:
            if unsure:
                # Which of the cut batch's devices exist now? Only those absent at plan time are ours.
                ours = self.plan.absent_before.get(name, frozenset())
                snap = host.read([state_path(s) for s in unsure])
                for s in unsure:
                    if s.target not in ours:
                        continue
                    if happened(snap, s):
                        todo.append(s)
                    else:
                        out.append(f"{name}: {s.describe()} had not happened; nothing to undo")
            if not todo:
                return out
            outcomes = apply_items(host, [undo_item(s, self.wait_timeout) for s in todo], on_error="continue")
        except VgpuvirtError as exc:
            return [*out, *(f"{name}: FAILED to undo '{s.describe()}': {exc}" for s in todo + unsure)]
        for s, o in zip(todo, outcomes, strict=True):
            what = "removed vGPU" if s.action == "create-mdev" else "reset VF"
            if o.ok:
                out.append(f"{name}: {what} {s.target}")
            else:
                bad = next(r for r in o.results if not r.ok)
                out.append(f"{name}: FAILED to undo '{s.describe()}': {bad.error or bad.errno}")
        return out


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
