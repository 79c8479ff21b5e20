"""What every mutating service returns (:class:`Change`) and how a failed op becomes an error.

A service plans a list of :class:`~vgpuvirt.host.base.Op`, then either returns them (dry run) or
applies them in ONE ``host.apply`` under the host-side lock. ``Change.changed`` is honest: it is
True only when something on the host was (or, in a dry run, would be) modified, so running the
same call twice reports ``changed`` only the first time.

Kernel errnos are translated here, at the boundary, into the exception tree of
:mod:`vgpuvirt.errors`; a caller never sees a raw ``OSError``.

Batches of many devices: a service plans each device as a :class:`Planned` item (its ops in one
group, and how a failed op of it reads as an error); :func:`apply_items` sends the items of one
host in ONE ``host.apply`` and hands back an :class:`Outcome` per item. The services' ``*_many``
methods and the provisioning layer (which mixes mdevs and VFs in one batch) share this, so the
ops and their error mapping exist once.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceError,
    DeviceNotFound,
    InvalidSpec,
    NoCapacity,
    WriteFailed,
)
from vgpuvirt.host.base import Host, Op, OpResult

log = logging.getLogger("vgpuvirt.audit")


@dataclass(frozen=True)
class Change:
    """The outcome of one service operation on one host."""

    host: str
    action: str                    # "mdev.create", "sriov.enable", ...
    target: str                    # the device or UUID acted on
    changed: bool
    dry_run: bool = False
    ops: tuple[Op, ...] = ()       # planned (dry run) or applied
    data: Mapping[str, Any] = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "action": self.action, "target": self.target, "changed": self.changed,
                "dry_run": self.dry_run, "ops": [op.describe() for op in self.ops],
                "message": self.message, **{k: _jsonable(v) for k, v in self.data.items()}}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "to_dict"):
        return v.to_dict()
    return str(v)


def note(host: str, action: str, target: str, message: str) -> None:
    """Service-level audit context around the per-op lines BaseHost.apply logs."""
    log.info("%s: %s %s: %s", host, action, target, message)


# errno -> exception class, for writes whose meaning does not depend on the file.
_GENERIC: dict[int, type[DeviceError]] = {
    _errno.ENOSPC: NoCapacity,
    _errno.EUSERS: NoCapacity,
    _errno.EDQUOT: NoCapacity,
    _errno.EEXIST: AlreadyExists,
    _errno.ENODEV: DeviceNotFound,
    _errno.ENOENT: DeviceNotFound,
    _errno.EBUSY: DeviceBusy,
}


def error_for(host: str, device: str, res: OpResult, *, what: str,
              overrides: Mapping[int, type[DeviceError]] | None = None) -> DeviceError:
    """The exception for one failed op: the class from its errno, the message naming host, device,
    what was attempted and what the kernel said."""
    code = res.errno
    said = res.error or (os.strerror(code) if code else "failed")
    if code is not None and code != 0:
        name = _errno.errorcode.get(code, str(code))
        said = f"{said} [{name}]"
    cls = (overrides or {}).get(code or -1) or _GENERIC.get(code or -1)
    op = res.op
    if op.op == "exec" and res.rc is not None:
        tail = (res.stderr or res.stdout).strip().splitlines()[-2:]
        said = f"exit status {res.rc}" + (": " + " | ".join(tail) if tail else "")
    if cls is None:
        if op.op == "write":
            return WriteFailed(host, device, op.path or "", op.value or "", code, said)
        return DeviceError(host, device, f"{what} failed: {op.describe()}: {said}")
    return cls(host, device, f"{what} failed: {said}")


Explain = Callable[[OpResult], DeviceError]


@dataclass(frozen=True)
class Planned:
    """One device's part of a batch: its ops (one group, so that with ``on_error="continue"`` a
    failure skips only the rest of this item), the error a failed op means, and the Change it makes."""

    action: str
    target: str
    ops: tuple[Op, ...]
    explain: Explain = field(repr=False, compare=False)
    data: Mapping[str, Any] = field(default_factory=dict)
    intent: str = ""               # the audit line before the batch
    message: str = ""              # of the Change once applied
    dry_message: str = ""          # of the Change in a dry run

    def change(self, host: str, *, dry_run: bool = False) -> Change:
        return Change(host, self.action, self.target, changed=True, dry_run=dry_run, ops=self.ops, data=self.data,
                      message=self.dry_message if dry_run else self.message)


@dataclass(frozen=True)
class Outcome:
    """What one :class:`Planned` item's ops did inside a shared batch."""

    item: Planned
    results: tuple[OpResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def skipped(self) -> bool:
        """None of its ops ran: an earlier item's failure stopped the batch."""
        return bool(self.results) and all(r.skipped for r in self.results)

    @property
    def failure(self) -> OpResult | None:
        return next((r for r in self.results if not r.ok and not r.skipped), None)

    @property
    def wrote(self) -> bool:
        """A write of this item went through: the host may hold something this item made."""
        return any(r.ok and r.op.mutates for r in self.results)

    @property
    def error(self) -> DeviceError | None:
        bad = self.failure
        return self.item.explain(bad) if bad is not None else None


def apply_items(host: Host, items: Sequence[Planned], *, on_error: str = "stop") -> list[Outcome]:
    """Every item's ops in ONE locked ``host.apply``; one Outcome per item, in order."""
    for it in items:
        note(host.name, it.action, it.target, it.intent or it.action)
    batch = host.apply([op for it in items for op in it.ops], on_error=on_error)
    out: list[Outcome] = []
    i = 0
    for it in items:
        out.append(Outcome(it, batch.results[i:i + len(it.ops)]))
        i += len(it.ops)
    return out


@dataclass(frozen=True)
class ItemResult:
    """One item of a service's ``*_many`` call: its Change (success, changed or not), or the error
    it met (``skipped`` too when an earlier failure stopped the batch before this item ran)."""

    target: str
    change: Change | None = None
    error: DeviceError | None = None
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.change is not None

    def unwrap(self) -> Change:
        """The Change, or raise the error: what the single-item methods return."""
        if self.error is not None:
            raise self.error
        assert self.change is not None
        return self.change


def result_of(host: str, outcome: Outcome) -> ItemResult:
    target = outcome.item.target
    if outcome.ok:
        return ItemResult(target, change=outcome.item.change(host))
    if outcome.skipped:
        return ItemResult(target, error=DeviceError(host, target, "not attempted: an earlier item of the batch "
                                                                  "failed"), skipped=True)
    return ItemResult(target, error=outcome.error)


def dry_results(host: str, slots: Sequence[Planned | ItemResult]) -> list[ItemResult]:
    """A dry run (or nothing to apply): every planned item as the Change it would make."""
    return [x if isinstance(x, ItemResult) else ItemResult(x.target, change=x.change(host, dry_run=True))
            for x in slots]


def apply_slots(host: Host, slots: Sequence[Planned | ItemResult], finish: Callable[[Outcome], ItemResult], *,
                dry_run: bool) -> list[ItemResult]:
    """Apply the planned slots in ONE batch that goes on past a failed item, and give one result per
    slot in order: the slots already settled as they are, each outcome through ``finish``. A dry run
    (or nothing to apply) is :func:`dry_results`."""
    items = [x for x in slots if isinstance(x, Planned)]
    if dry_run or not items:
        return dry_results(host.name, slots)
    done = {o.item.target: finish(o) for o in apply_items(host, items, on_error="continue")}
    return [x if isinstance(x, ItemResult) else done[x.target] for x in slots]


def require_unique(what: str, keys: Iterable[object]) -> None:
    """A device may appear once per batch: two groups acting on one device would undo each other."""
    seen: set[object] = set()
    dup: set[str] = set()
    for k in keys:
        if k in seen:
            dup.add(str(k))
        seen.add(k)
    if dup:
        raise InvalidSpec(what, sorted(dup), "each device once per batch")
