"""Mediated devices (mdev vGPUs): create, remove, list, ensure, restore.

Each operation is: ONE ``host.read`` of the paths it decides on (plus, when persistence is
involved, one ``mdevctl list --defined`` run), a decision, and ONE ``host.apply`` under the
host-side lock. mdevctl's three checks on create are kept: the same UUID with the same parent
and type is success (unchanged), another parent or type is :class:`AlreadyExists`.

Capacity is checked twice: before planning (a clear :class:`NoCapacity` without touching the
host) and again *inside* the locked batch (``check_int available_instances >= 1`` then the
``create`` write, in one group), so concurrent callers cannot both take the last instance.

Persistence: ``persist="transient"`` writes sysfs only; ``persist="persistent"`` also runs
``mdevctl define --auto`` in the same batch, so the device comes back at boot (``restore`` starts
defined-but-inactive devices on demand). The mdevctl command is injectable: ``MdevService(host,
mdevctl=["unshare", "-m", ..., "mdevctl"])`` runs it through a prefix (tests use a mount
namespace that binds a simulated sysfs over /sys).

The service decides here; what exists (active and defined mdevs) is read in
:mod:`vgpuvirt.services.vgpu.mdev_state`, the locked ops of one create or remove are built in
:mod:`vgpuvirt.services.vgpu.mdev_ops` (their names are re-exported here). It sits on the change engine: a batch of
creates runs through :class:`~vgpuvirt.change.runner.Runner`, which undoes an item that ran in part.
"""

from __future__ import annotations

import errno as _errno
import posixpath
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from vgpuvirt.change.runner import Runner
from vgpuvirt.change.step import HostFacts, HostStep
from vgpuvirt.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceError,
    DeviceNotFound,
    InvalidSpec,
    NoCapacity,
    RemoteRequirementMissing,
    TransportError,
)
from vgpuvirt.host.base import Host, Op, Snapshot
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.services.capacity.budget import GpuBudget, Place, Resident, VgpuType
from vgpuvirt.services.mutation import (
    Change,
    ItemResult,
    Outcome,
    Planned,
    apply_items,
    apply_slots,
    dry_results,
    note,
    require_unique,
    result_of,
)
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.pci.parsers import parse_nvidia_description
from vgpuvirt.services.vgpu.mdev_ops import MdevSpec, create_item, create_patterns, remove_item, type_dir
from vgpuvirt.services.vgpu.mdev_state import (
    Definition,
    MdevRecord,
    active_from_snapshot,
    device_path,
    parse_mdevctl_defined,
)
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.refs import domain_device_refs

__all__ = ["PERSIST_CHOICES", "Definition", "MdevRecord", "MdevService", "MdevSpec", "Persist", "State",
           "active_from_snapshot", "create_item", "device_path", "parse_mdevctl_defined", "remove_item"]

Persist = Literal["transient", "persistent"]
State = Literal["present", "absent"]
PERSIST_CHOICES = ("transient", "persistent")
# MdevService has a method named ``list``: these names keep the builtin usable in its annotations.
Results = list[ItemResult]
Slots = list[Planned | ItemResult]


@dataclass(frozen=True)
class CreateMdevItem(HostStep):
    """One item of :meth:`MdevService.create_many`: the service's checked create of one mdev (and its mdevctl
    define, ``persist="persistent"``). Its undo removes the device: the runner applies it to an item that ran in
    part (created, then the define failed)."""

    kind: ClassVar[str] = "mdev-service-create"
    rank: ClassVar[int] = 70
    host: str
    vm: str
    uuid: MdevUuid
    planned: Planned = field(compare=False, repr=False)

    @property
    def target(self) -> str:
        return str(self.uuid)

    def describe(self) -> str:
        return self.planned.intent or f"create mdev {self.uuid}"

    def done_in(self, facts: HostFacts) -> bool:
        return facts.has_mdev(self.uuid)

    def item(self, wait_timeout: float) -> Planned:
        return self.planned

    def undo_item(self, wait_timeout: float) -> Planned:
        return remove_item(self.host, self.uuid, wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.mdev(self.uuid)

    def happened(self, snap: Snapshot) -> bool:
        return snap.has(self.state_path())

    def undone(self) -> str:
        return f"removed mdev {self.uuid} again"


class MdevService:
    """mdev lifecycle on one host. ``mdevctl=None`` disables persistence (sysfs only)."""

    def __init__(self, host: Host, *, mdevctl: Sequence[str] | None = ("mdevctl",),
                 wait_timeout: float = 10.0) -> None:
        if mdevctl is not None and (not mdevctl or not all(isinstance(a, str) and a for a in mdevctl)):
            raise InvalidSpec("mdevctl command", mdevctl, "a non-empty argv prefix such as ['mdevctl']")
        self.host = host
        self.mdevctl = tuple(mdevctl) if mdevctl is not None else None
        self.wait_timeout = wait_timeout

    # -- mdevctl -----------------------------------------------------------------------------
    def defined(self, *, required: bool) -> dict[MdevUuid, list[Definition]] | None:
        """Definitions from ``mdevctl list --defined``; None when mdevctl is absent and not required."""
        if self.mdevctl is None:
            if required:
                raise RemoteRequirementMissing(self.host.name, "persistent mdevs need mdevctl, and this service "
                                                               "was created with mdevctl=None")
            return None
        res = self.host.run([*self.mdevctl, "list", "--defined", "--dumpjson"], idempotent=True)
        if res.exit_code == 127 or "command not found" in res.stderr or "No such file" in res.stderr:
            if required:
                raise RemoteRequirementMissing(
                    self.host.name, f"persistent mdevs need mdevctl, which was not found on the host "
                                    f"({' '.join(self.mdevctl)}): install mdevctl or use persist='transient'")
            return None
        if not res.ok:
            raise DeviceError(self.host.name, "mdevctl", f"mdevctl list --defined failed (exit {res.exit_code}): "
                                                         f"{res.stderr.strip()[-300:]}")
        try:
            return parse_mdevctl_defined(res.stdout)
        except ValueError as exc:
            raise DeviceError(self.host.name, "mdevctl", f"unreadable mdevctl JSON: {exc}") from exc

    def _mdevctl_argv(self, *args: str) -> list[str]:
        assert self.mdevctl is not None
        return [*self.mdevctl, *args]

    # -- list --------------------------------------------------------------------------------
    def list(self, *, defined: bool = False) -> list[MdevRecord]:
        """Active mdevs (one read); with ``defined=True`` also mdevctl definitions."""
        snap = self.host.read([f"{sysfs.MDEV_DEVICES}/*", f"{sysfs.MDEV_DEVICES}/*/mdev_type"])
        active = active_from_snapshot(snap)
        defs = self.defined(required=False) if defined else None
        out: dict[tuple[MdevUuid, str], MdevRecord] = {}
        for uuid, (parent, type_) in active.items():
            d = next((x for x in (defs or {}).get(uuid, []) if x.parent == parent), None)
            out[(uuid, parent)] = MdevRecord(uuid, parent, type_, True, d is not None, d.start if d else None)
        for uuid, ds in (defs or {}).items():
            for d in ds:
                if (uuid, d.parent) not in out:
                    out[(uuid, d.parent)] = MdevRecord(uuid, d.parent, d.type, False, True, d.start)
        return sorted(out.values(), key=lambda r: (r.parent, str(r.uuid)))

    # -- create ------------------------------------------------------------------------------
    def create(self, parent: str | PciAddress, type_id: str | MdevTypeId, uuid: str | MdevUuid | None = None, *,
               persist: Persist = "transient", dry_run: bool = False) -> Change:
        """Create one mdev; the same UUID/parent/type already active is success with changed=False.
        Without ``uuid`` a random one is chosen here, on the client, and logged (``vgpuvirt.audit``)
        before the request is sent; a dropped link raises a TransportError naming it. Callers that
        must survive a cut choose it themselves (``MdevUuid.generate()``) and pass it again."""
        spec = MdevSpec.of(parent, type_id, uuid)
        return self.create_many([spec], persist=persist, dry_run=dry_run)[0].unwrap()

    def ensure(self, uuid: str | MdevUuid, parent: str | PciAddress | None = None,
               type_id: str | MdevTypeId | None = None, *, state: State = "present",
               persist: Persist = "transient", dry_run: bool = False) -> Change:
        """Idempotent: ``present`` creates (and defines) when missing, ``absent`` removes (and undefines)."""
        u = MdevUuid.parse(uuid)
        if state == "absent":
            return self.remove(u, dry_run=dry_run, action="mdev.ensure")
        if state != "present":
            raise InvalidSpec("state", state, "present or absent")
        if parent is None or type_id is None:
            raise InvalidSpec("mdev spec", (parent, type_id), "a parent and a type for state=present")
        spec = MdevSpec.of(parent, type_id, u)
        try:
            return self.create_many([spec], persist=persist, dry_run=dry_run, action="mdev.ensure")[0].unwrap()
        except AlreadyExists:
            # A concurrent caller may have created this very UUID between our read and our batch:
            # if it is now exactly what we want, the goal is reached.
            active = active_from_snapshot(self.host.read(create_patterns([spec]))).get(u)
            if active == (str(spec.parent), str(spec.type)):
                return Change(self.host.name, "mdev.ensure", str(u), changed=False, dry_run=dry_run,
                              data={"uuid": str(u), "parent": str(spec.parent), "type": str(spec.type)},
                              message="already present (created concurrently)")
            raise

    def create_many(self, specs: Sequence[MdevSpec], *, persist: Persist = "transient", dry_run: bool = False,
                    action: str = "mdev.create") -> Results:
        """Create several mdevs: ONE read, then ONE locked batch with a group per device that stops
        at the first failure. Every check of a single create is made for every item first (a
        refusal raises and nothing is written); what fails under the lock comes back per item, the
        items after it ``skipped``. A create whose define then failed is removed again."""
        if persist not in PERSIST_CHOICES:
            raise InvalidSpec("persistence", persist, "transient or persistent")
        require_unique("mdev UUIDs", (s.uuid for s in specs))
        host = self.host.name
        defs = (self.defined(required=True) or {}) if persist == "persistent" else {}
        snap = self.host.read(create_patterns(specs))
        active = active_from_snapshot(snap)
        taken: Counter[tuple[PciAddress, MdevTypeId]] = Counter()
        slots = [self._plan_create(s, snap, active.get(s.uuid), defs.get(s.uuid, []), persist, taken,
                                   action, dry_run) for s in specs]
        items = [x for x in slots if isinstance(x, Planned)]
        if dry_run or not items:
            return dry_results(host, slots)
        runner = Runner(self.host, wait_timeout=self.wait_timeout)
        try:
            outcomes = runner.run_items([CreateMdevItem(host, "", MdevUuid.parse(it.target), it) for it in items])
        except TransportError as exc:
            # The batch may have run before the link dropped. The UUIDs were chosen here (and logged by
            # apply_items before sending), so naming them is all a caller needs to converge.
            made = ", ".join(f"uuid={it.target}" for it in items)
            raise TransportError(host, f"{str(exc).removeprefix(f'{host}: ')}: outcome unknown for the create of "
                                       f"mdev {made}; rerun with the same UUID, which converges") from exc
        # an item stands alone: one whose define failed after its create is undone, the others stay
        runner.undo_partial()
        done = iter(outcomes)
        return [x if isinstance(x, ItemResult) else result_of(host, next(done)) for x in slots]

    def _plan_create(self, spec: MdevSpec, snap: Snapshot, active: tuple[str, str] | None,
                     defs: Sequence[Definition], persist: Persist, taken: Counter[tuple[PciAddress, MdevTypeId]],
                     action: str, dry_run: bool) -> Planned | ItemResult:
        """mdevctl's three checks and the capacity pre-check for one item; its ops, or its Change
        when nothing is to be done."""
        host = self.host.name
        p, t, u = spec.parent, spec.type, spec.uuid
        data = {"uuid": str(u), "parent": str(p), "type": str(t), "persist": persist}
        if active is not None:
            a_parent, a_type = active
            if a_parent != str(p):
                raise AlreadyExists(host, str(u), f"device {u} found under different parent '{a_parent}'")
            if a_type != str(t):
                raise AlreadyExists(host, str(u), f"device {u} found with different type '{a_type}'")
        for d in defs:
            if d.parent == str(p) and d.type != str(t):
                raise AlreadyExists(host, str(u), f"device {u} is defined on {p} with different type '{d.type}'")
        is_defined = any(d.parent == str(p) and d.type == str(t) for d in defs)
        need_define = persist == "persistent" and not is_defined
        if active is None:
            taken[(p, t)] += 1
            self._precheck_capacity(snap, p, t, taken[(p, t)])
        elif not need_define:
            return ItemResult(str(u), change=Change(
                host, action, str(u), changed=False, dry_run=dry_run, data=data,
                message="already present" + (" and defined" if persist == "persistent" else "")))
        define = (self._mdevctl_argv("define", "-u", str(u), "-p", str(p), "-t", str(t), "--auto")
                  if need_define else None)
        return create_item(host, spec, wait_timeout=self.wait_timeout, create=active is None, define=define,
                           action=action, data=data, intent=f"create {t} on {p} ({persist})")

    def _precheck_capacity(self, snap: Snapshot, p: PciAddress, t: MdevTypeId, need: int = 1) -> None:
        host = self.host.name
        types = sysfs.mdev_types(p)
        if not snap.has(f"{sysfs.MDEV_BUS}/{p}") or not snap.has(types):
            raise DeviceNotFound(host, str(p), f"parent {p} is not currently registered for mdev support")
        if not snap.has(type_dir(p, t)):
            known = [posixpath.basename(x) for x in snap.glob(f"{types}/*") if snap.is_dir(x)]
            raise DeviceNotFound(host, str(p), f"parent {p} does not support mdev type {t} "
                                               f"(it offers: {', '.join(known[:12]) or 'none'})")
        avail = snap.int(f"{type_dir(p, t)}/available_instances")
        if avail is None:
            raise DeviceError(host, str(p), f"cannot read available_instances of {t}")
        if avail < 1:
            raise NoCapacity(host, str(p), f"no available instances of {t} on {p}: {self._why_zero(snap, p, t)}")
        if avail < need:
            raise NoCapacity(host, str(p), f"no available instances of {t} on {p} for the batch: "
                                           f"{need} asked, {avail} available")

    @staticmethod
    def _why_zero(snap: Snapshot, p: PciAddress, t: MdevTypeId) -> str:
        """Why the kernel shows 0: the capacity model's reason for this parent as read."""
        types_dir = sysfs.mdev_types(p)
        types: dict[str, VgpuType] = {}
        for d in snap.glob(f"{types_dir}/*"):
            tid = posixpath.basename(d)
            desc = parse_nvidia_description(snap.text(f"{d}/description"))
            types[tid] = VgpuType(tid, None, desc.framebuffer_mib, desc.max_instances)
        held = [link.split("/")[-3] for link in snap.glob(f"{types_dir}/*/devices/*")]
        residents = tuple(Resident(tid, types[tid].framebuffer_mib if tid in types else None, str(p)) for tid in held)
        sizes = {r.framebuffer_mib for r in residents if r.framebuffer_mib}
        budget = GpuBudget("", p, "nvidia", GpuUse.MDEV if residents else GpuUse.FREE, types,
                           (Place(str(p), GpuUse.MDEV, False, {str(t): 0}),), residents,
                           sizing="mixed" if len(sizes) > 1 else "equal")
        return budget.fit(str(t)).reason

    # -- remove ------------------------------------------------------------------------------
    def remove(self, uuid: str | MdevUuid, *, undefine: bool = True, dry_run: bool = False,
               domains: Iterable[tuple[str, str]] | None = None, action: str = "mdev.remove") -> Change:
        """Remove an active mdev (and its mdevctl definition unless ``undefine=False``).
        With ``domains`` ((name, xml) pairs) a device a domain references is refused (DeviceBusy)."""
        u = MdevUuid.parse(uuid)
        return self.remove_many([u], undefine=undefine, dry_run=dry_run, domains=domains, action=action)[0].unwrap()

    def remove_many(self, uuids: Iterable[str | MdevUuid], *, undefine: bool = True, dry_run: bool = False,
                    domains: Iterable[tuple[str, str]] | None = None,
                    action: str = "mdev.remove") -> Results:
        """Remove (and undefine) several mdevs: ONE read, then ONE locked batch, a group per device,
        every device attempted. One a domain uses is refused (DeviceBusy) before anything is written."""
        us = [MdevUuid.parse(u) for u in uuids]
        require_unique("mdev UUIDs", us)
        host = self.host.name
        refs = [(name, domain_device_refs(xml).mdevs) for name, xml in (domains or ())]
        snap = self.host.read([p for u in us for p in (device_path(u), f"{device_path(u)}/mdev_type")])
        active = active_from_snapshot(snap)
        defs = (self.defined(required=False) or {}) if undefine else {}
        slots: Slots = []
        for u in us:
            a, my_defs = active.get(u), defs.get(u, [])
            data: dict[str, Any] = {"uuid": str(u), "parent": a[0] if a else None, "type": a[1] if a else None,
                                    "defined": bool(my_defs)}
            users = sorted(name for name, mdevs in refs if u in mdevs)
            if users and (a or my_defs):
                raise DeviceBusy(host, str(u), f"mdev {u} is used by domain(s) {', '.join(users)}: "
                                               "detach or undefine them first")
            if a is None and not my_defs:
                slots.append(ItemResult(str(u), change=Change(host, action, str(u), changed=False, dry_run=dry_run,
                                                              data=data, message="already absent")))
                continue
            # A UUID defined under several parents needs -p to say which; undefine them all.
            slots.append(remove_item(host, u, wait_timeout=self.wait_timeout, remove=a is not None,
                                     undefine=[self._mdevctl_argv("undefine", "-u", str(u), "-p", d.parent)
                                               for d in my_defs], action=action, data=data))
        return apply_slots(self.host, slots, self._removed, dry_run=dry_run)

    def _removed(self, o: Outcome) -> ItemResult:
        host, it, bad = self.host.name, o.item, o.failure
        if bad is None or bad.op.op != "write" or bad.errno not in (_errno.ENODEV, _errno.ENOENT):
            return result_of(host, o)
        # Gone between our read and the write (NVIDIA removes it when the VM stops):
        # the removal is moot, the undefine still has to happen.
        rest = tuple(op for op in it.ops if op.op == "exec")
        if not rest:
            return ItemResult(it.target, change=Change(host, it.action, it.target, changed=False, data=it.data,
                                                       message="already gone"))
        again = apply_items(self.host, [replace(it, ops=rest, message="already gone; undefined")])[0]
        return result_of(host, again)


    # -- restore -----------------------------------------------------------------------------
    def restore(self, *, dry_run: bool = False, only_auto: bool = False) -> Change:
        """Start every mdevctl-defined device that is not active (after a reboot); one batch,
        one group per device so that one failure does not stop the others."""
        host = self.host.name
        defs = self.defined(required=True) or {}
        snap = self.host.read([f"{sysfs.MDEV_DEVICES}/*", f"{sysfs.MDEV_DEVICES}/*/mdev_type"])
        active = active_from_snapshot(snap)
        ops: list[Op] = []
        todo: list[tuple[MdevUuid, Definition]] = []
        for u, ds in sorted(defs.items(), key=lambda kv: str(kv[0])):
            if u in active:
                continue
            for d in ds:
                if only_auto and d.start != "auto":
                    continue
                todo.append((u, d))
                ops.append(Op.exec(self._mdevctl_argv("start", "-u", str(u), "-p", d.parent), group=f"start:{u}"))
                break  # a UUID can be active once only
        data: dict[str, Any] = {"to_start": [str(u) for u, _ in todo]}
        if not ops:
            return Change(host, "mdev.restore", "defined", changed=False, dry_run=dry_run, data=data,
                          message="every defined device is active")
        if dry_run:
            return Change(host, "mdev.restore", "defined", changed=True, dry_run=True, ops=tuple(ops), data=data,
                          message=f"would start {len(ops)}")
        note(host, "mdev.restore", "defined", f"starting {len(ops)} defined mdevs")
        batch = self.host.apply(ops, on_error="continue")
        started, failed = [], {}
        for (u, _), r in zip(todo, batch.results, strict=True):
            if r.ok:
                started.append(str(u))
            else:
                failed[str(u)] = (r.stderr or r.error or "failed").strip()[-300:]
        data.update(started=started, failed=failed)
        return Change(host, "mdev.restore", "defined", changed=bool(started), ops=tuple(ops), data=data,
                      message=f"started {len(started)}, failed {len(failed)}")
