"""What every mutating service returns (:class:`Change`) and how a failed op becomes an error.

A service plans a list of :class:`~vgpuvirt.host.base.Op`, then either returns them (dry run) or
applies them in ONE ``host.apply`` under the host-side lock. ``Change.changed`` is honest: it is
True only when something on the host was (or, in a dry run, would be) modified, so running the
same call twice reports ``changed`` only the first time.

Kernel errnos are translated here, at the boundary, into the exception tree of
:mod:`vgpuvirt.errors`; a caller never sees a raw ``OSError``.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import (
    AlreadyExists,
    DeviceBusy,
    DeviceError,
    DeviceNotFound,
    NoCapacity,
    WriteFailed,
)
from vgpuvirt.host.base import BatchResult, Op, OpResult

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


def first_failure(batch: BatchResult) -> OpResult | None:
    for r in batch.results:
        if not r.ok and not r.skipped:
            return r
    return None


def raise_on_failure(host: str, device: str, batch: BatchResult, *, what: str,
                     overrides: Mapping[int, type[DeviceError]] | None = None) -> None:
    r = first_failure(batch)
    if r is not None:
        raise error_for(host, device, r, what=what, overrides=overrides)


def describe_ops(ops: Sequence[Op]) -> list[str]:
    return [op.describe() for op in ops]
