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
"""

from __future__ import annotations

import errno as _errno
import json
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vgpuvirt.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceError,
    DeviceNotFound,
    InvalidSpec,
    NoCapacity,
    RemoteRequirementMissing,
)
from vgpuvirt.host.base import Host, Op, Snapshot
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.services import capacity
from vgpuvirt.services.mutation import Change, error_for, first_failure, note
from vgpuvirt.services.parsers import domain_device_refs, parse_nvidia_description

MDEV_BUS = "/sys/class/mdev_bus"
MDEV_DEVICES = "/sys/bus/mdev/devices"

Persist = Literal["transient", "persistent"]
State = Literal["present", "absent"]
PERSIST_CHOICES = ("transient", "persistent")


@dataclass(frozen=True)
class MdevRecord:
    """One mediated device as the host knows it (active in sysfs and/or defined in mdevctl)."""

    uuid: MdevUuid
    parent: str
    type: str
    active: bool
    defined: bool = False
    start: str | None = None          # mdevctl "auto" | "manual" when defined

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": str(self.uuid), "parent": self.parent, "type": self.type, "active": self.active,
                "defined": self.defined, "start": self.start}


@dataclass(frozen=True)
class Definition:
    parent: str
    type: str
    start: str


def _type_dir(parent: PciAddress, type_id: MdevTypeId) -> str:
    return f"{MDEV_BUS}/{parent}/mdev_supported_types/{type_id}"


def _dev(uuid: MdevUuid) -> str:
    return f"{MDEV_DEVICES}/{uuid}"


def active_from_snapshot(snap: Snapshot) -> dict[MdevUuid, tuple[str, str]]:
    """{uuid: (parent, type)} for every ``/sys/bus/mdev/devices/<uuid>`` link in the snapshot."""
    out: dict[MdevUuid, tuple[str, str]] = {}
    for path in snap.glob(f"{MDEV_DEVICES}/*"):
        name = posixpath.basename(path)
        try:
            uuid = MdevUuid.parse(name)
        except InvalidSpec:
            continue
        target = snap.link(path)
        # ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/<uuid> -> parent is the dir above
        parent = posixpath.basename(posixpath.dirname(target.rstrip("/"))) if target else ""
        out[uuid] = (parent, snap.link_name(f"{path}/mdev_type") or "")
    return out


def parse_mdevctl_defined(text: str) -> dict[MdevUuid, list[Definition]]:
    """``mdevctl list --defined --dumpjson``: ``[{parent: [{uuid: {mdev_type, start, attrs}}]}]``."""
    text = text.strip()
    if not text:
        return {}
    data = json.loads(text)
    out: dict[MdevUuid, list[Definition]] = {}
    if not isinstance(data, list):
        return out
    for block in data:
        if not isinstance(block, dict):
            continue
        for parent, devices in block.items():
            for dev in devices if isinstance(devices, list) else []:
                if not isinstance(dev, dict):
                    continue
                for uuid_text, cfg in dev.items():
                    try:
                        uuid = MdevUuid.parse(uuid_text)
                    except InvalidSpec:
                        continue
                    cfg = cfg if isinstance(cfg, dict) else {}
                    out.setdefault(uuid, []).append(
                        Definition(str(parent), str(cfg.get("mdev_type", "")), str(cfg.get("start", "manual"))))
    return out


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
        snap = self.host.read([f"{MDEV_DEVICES}/*", f"{MDEV_DEVICES}/*/mdev_type"])
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
        """Create one mdev; the same UUID/parent/type already active is success with changed=False."""
        p = PciAddress.parse(parent)
        t = MdevTypeId.parse(type_id)
        u = MdevUuid.parse(uuid) if uuid is not None else MdevUuid.generate()
        if persist not in PERSIST_CHOICES:
            raise InvalidSpec("persistence", persist, "transient or persistent")
        return self._ensure_present(p, t, u, persist, dry_run, action="mdev.create")

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
        if persist not in PERSIST_CHOICES:
            raise InvalidSpec("persistence", persist, "transient or persistent")
        p, t = PciAddress.parse(parent), MdevTypeId.parse(type_id)
        try:
            return self._ensure_present(p, t, u, persist, dry_run, action="mdev.ensure")
        except AlreadyExists:
            # A concurrent caller may have created this very UUID between our read and our batch:
            # if it is now exactly what we want, the goal is reached.
            _, active = self._read_for_create(p, t, u)
            if active == (str(p), str(t)):
                return Change(self.host.name, "mdev.ensure", str(u), changed=False, dry_run=dry_run,
                              data={"uuid": str(u), "parent": str(p), "type": str(t)},
                              message="already present (created concurrently)")
            raise

    def _read_for_create(self, p: PciAddress, t: MdevTypeId,
                         u: MdevUuid) -> tuple[Snapshot, tuple[str, str] | None]:
        types = f"{MDEV_BUS}/{p}/mdev_supported_types"
        snap = self.host.read([
            _dev(u), f"{_dev(u)}/mdev_type", f"{MDEV_BUS}/{p}", types,
            f"{types}/*", f"{types}/*/available_instances", f"{types}/*/description", f"{types}/*/name",
            f"{types}/*/devices/*",
        ])
        active = active_from_snapshot(snap).get(u)
        return snap, active

    def _ensure_present(self, p: PciAddress, t: MdevTypeId, u: MdevUuid, persist: Persist, dry_run: bool,
                        *, action: str) -> Change:
        host = self.host.name
        defs = self.defined(required=True) if persist == "persistent" else None
        snap, active = self._read_for_create(p, t, u)
        data = {"uuid": str(u), "parent": str(p), "type": str(t), "persist": persist}

        # mdevctl's three checks on an existing UUID.
        if active is not None:
            a_parent, a_type = active
            if a_parent != str(p):
                raise AlreadyExists(host, str(u), f"device {u} found under different parent '{a_parent}'")
            if a_type != str(t):
                raise AlreadyExists(host, str(u), f"device {u} found with different type '{a_type}'")
        for d in (defs or {}).get(u, []):
            if d.parent == str(p) and d.type != str(t):
                raise AlreadyExists(host, str(u), f"device {u} is defined on {p} with different type '{d.type}'")
        is_defined = any(d.parent == str(p) and d.type == str(t) for d in (defs or {}).get(u, []))
        need_define = persist == "persistent" and not is_defined

        ops: list[Op] = []
        g = f"create:{u}"
        if active is None:
            self._precheck_capacity(snap, p, t)
            ops += [
                Op.check_absent(_dev(u), group=g),
                Op.check_int(f"{_type_dir(p, t)}/available_instances", 1, group=g),
                Op.write(f"{_type_dir(p, t)}/create", str(u), group=g),
                Op.wait(_dev(u), "exists", timeout=self.wait_timeout, group=g),
            ]
        if need_define:
            ops.append(Op.exec(self._mdevctl_argv("define", "-u", str(u), "-p", str(p), "-t", str(t), "--auto"),
                               group=g))
        if not ops:
            return Change(host, action, str(u), changed=False, dry_run=dry_run, data=data,
                          message="already present" + (" and defined" if persist == "persistent" else ""))
        if dry_run:
            return Change(host, action, str(u), changed=True, dry_run=True, ops=tuple(ops), data=data,
                          message="would create" if active is None else "would define")
        note(host, action, str(u), f"create {t} on {p} ({persist})")
        batch = self.host.apply(ops)
        bad = first_failure(batch)
        if bad is not None:
            created = active is None and any(r.ok and r.op.op == "write" for r in batch.results)
            if created:
                # define failed after the create: undo exactly what we did.
                note(host, action, str(u), "rolling back the create after a failed define")
                self.host.apply([Op.write(f"{_dev(u)}/remove", "1"),
                                 Op.wait(_dev(u), "absent", timeout=self.wait_timeout)])
            raise self._create_error(bad, p, t, u)
        return Change(host, action, str(u), changed=True, ops=tuple(ops), data=data,
                      message="created" if active is None else "defined")

    def _precheck_capacity(self, snap: Snapshot, p: PciAddress, t: MdevTypeId) -> None:
        host = self.host.name
        types = f"{MDEV_BUS}/{p}/mdev_supported_types"
        if not snap.has(f"{MDEV_BUS}/{p}") or not snap.has(types):
            raise DeviceNotFound(host, str(p), f"parent {p} is not currently registered for mdev support")
        if not snap.has(_type_dir(p, t)):
            known = [posixpath.basename(x) for x in snap.glob(f"{types}/*") if snap.is_dir(x)]
            raise DeviceNotFound(host, str(p), f"parent {p} does not support mdev type {t} "
                                               f"(it offers: {', '.join(known[:12]) or 'none'})")
        avail = snap.int(f"{_type_dir(p, t)}/available_instances")
        if avail is None:
            raise DeviceError(host, str(p), f"cannot read available_instances of {t}")
        if avail < 1:
            raise NoCapacity(host, str(p), f"no available instances of {t} on {p}: {self._why_zero(snap, p, t)}")

    @staticmethod
    def _why_zero(snap: Snapshot, p: PciAddress, t: MdevTypeId) -> str:
        types = f"{MDEV_BUS}/{p}/mdev_supported_types"
        desc = parse_nvidia_description(snap.text(f"{_type_dir(p, t)}/description"))
        existing: list[tuple[str, int | None]] = []
        for link in snap.glob(f"{types}/*/devices/*"):
            tid = link.split("/")[-3]
            fb = parse_nvidia_description(snap.text(f"{types}/{tid}/description")).framebuffer_mib
            existing.append((tid, fb))
        return capacity.explain_zero(str(t), desc.framebuffer_mib, desc.max_instances, existing)

    def _create_error(self, bad: Any, p: PciAddress, t: MdevTypeId, u: MdevUuid) -> DeviceError:
        host = self.host.name
        op: Op = bad.op
        if op.op == "check_absent":
            return AlreadyExists(host, str(u), f"device {u} appeared concurrently (EEXIST)")
        if op.op == "check_int":
            return NoCapacity(host, str(p), f"no available instances of {t} on {p} "
                                            f"(taken by a concurrent caller; now {bad.value})")
        if op.op == "wait":
            return DeviceError(host, str(u), f"wrote the create of {t} on {p} but {_dev(u)} did not appear "
                                             f"within {self.wait_timeout} s")
        if op.op == "exec":
            return error_for(host, str(u), bad, what=f"mdevctl define of {u}")
        # The UUID is validated, so EINVAL on create comes from the vendor driver refusing the type.
        return error_for(host, str(p), bad, what=f"creating {t} ({u}) on {p}",
                         overrides={_errno.EINVAL: NoCapacity})

    # -- remove ------------------------------------------------------------------------------
    def remove(self, uuid: str | MdevUuid, *, undefine: bool = True, dry_run: bool = False,
               domains: Iterable[tuple[str, str]] | None = None, action: str = "mdev.remove") -> Change:
        """Remove an active mdev (and its mdevctl definition unless ``undefine=False``).
        With ``domains`` ((name, xml) pairs) a device a domain references is refused (DeviceBusy)."""
        u = MdevUuid.parse(uuid)
        host = self.host.name
        users = [name for name, xml in (domains or ()) if u in domain_device_refs(xml).mdevs]
        snap = self.host.read([_dev(u), f"{_dev(u)}/mdev_type"])
        active = active_from_snapshot(snap).get(u)
        defs = self.defined(required=False) if undefine else None
        my_defs = (defs or {}).get(u, [])
        data: dict[str, Any] = {"uuid": str(u), "parent": active[0] if active else None,
                                "type": active[1] if active else None, "defined": bool(my_defs)}
        if users and (active or my_defs):
            raise DeviceBusy(host, str(u), f"mdev {u} is used by domain(s) {', '.join(sorted(users))}: "
                                           "detach or undefine them first")
        ops: list[Op] = []
        if active is not None:
            ops += [Op.write(f"{_dev(u)}/remove", "1"), Op.wait(_dev(u), "absent", timeout=self.wait_timeout)]
        if my_defs:
            # A UUID defined under several parents needs -p to say which; undefine them all.
            for d in my_defs:
                ops.append(Op.exec(self._mdevctl_argv("undefine", "-u", str(u), "-p", d.parent)))
        if not ops:
            return Change(host, action, str(u), changed=False, dry_run=dry_run, data=data, message="already absent")
        if dry_run:
            return Change(host, action, str(u), changed=True, dry_run=True, ops=tuple(ops), data=data,
                          message="would remove")
        note(host, action, str(u), "remove" + (" and undefine" if my_defs else ""))
        batch = self.host.apply(ops)
        bad = first_failure(batch)
        if bad is not None:
            if bad.op.op == "write" and bad.errno in (_errno.ENODEV, _errno.ENOENT):
                # Gone between our read and the write (NVIDIA removes it when the VM stops):
                # the removal is moot, the undefine still has to happen.
                rest = [o for o in ops if o.op == "exec"]
                if not rest:
                    return Change(host, action, str(u), changed=False, data=data, message="already gone")
                batch = self.host.apply(rest)
                bad = first_failure(batch)
                if bad is None:
                    return Change(host, action, str(u), changed=True, ops=tuple(rest), data=data,
                                  message="already gone; undefined")
            raise error_for(host, str(u), bad, what=f"removing mdev {u}",
                            overrides={_errno.EAGAIN: DeviceBusy})
        return Change(host, action, str(u), changed=True, ops=tuple(ops), data=data, message="removed")

    # -- restore -----------------------------------------------------------------------------
    def restore(self, *, dry_run: bool = False, only_auto: bool = False) -> Change:
        """Start every mdevctl-defined device that is not active (after a reboot); one batch,
        one group per device so that one failure does not stop the others."""
        host = self.host.name
        defs = self.defined(required=True) or {}
        snap = self.host.read([f"{MDEV_DEVICES}/*", f"{MDEV_DEVICES}/*/mdev_type"])
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
