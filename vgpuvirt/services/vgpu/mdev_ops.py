"""The locked host operations that create or remove one mdev (capacity re-checked inside the lock)."""

from __future__ import annotations

import errno as _errno
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import AlreadyExists, DeviceBusy, DeviceError, NoCapacity
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.services.mutation import Planned, error_for
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.vgpu.mdev_state import device_path


def type_dir(parent: PciAddress, type_id: MdevTypeId) -> str:
    return sysfs.mdev_type(parent, type_id)

@dataclass(frozen=True)
class MdevSpec:
    """One mdev to create: where, of which type, under which UUID."""

    parent: PciAddress
    type: MdevTypeId
    uuid: MdevUuid

    @classmethod
    def of(cls, parent: str | PciAddress, type_id: str | MdevTypeId, uuid: str | MdevUuid | None = None) -> MdevSpec:
        """Validated; a fresh random UUID when none is given."""
        return cls(PciAddress.parse(parent), MdevTypeId.parse(type_id),
                   MdevUuid.parse(uuid) if uuid is not None else MdevUuid.generate())


def create_patterns(specs: Iterable[MdevSpec]) -> list[str]:
    """What a create decides on: the UUIDs' device links and their parents' type directories."""
    out: list[str] = []
    for p in sorted({s.parent for s in specs}):
        types = sysfs.mdev_types(p)
        out += [f"{sysfs.MDEV_BUS}/{p}", types, f"{types}/*", f"{types}/*/available_instances",
                f"{types}/*/description", f"{types}/*/name", f"{types}/*/devices/*"]
    for s in specs:
        out += [device_path(s.uuid), f"{device_path(s.uuid)}/mdev_type"]
    return out


def create_item(host: str, spec: MdevSpec, *, wait_timeout: float, create: bool = True,
                define: Sequence[str] | None = None, action: str = "mdev.create",
                data: Mapping[str, Any] | None = None, intent: str = "") -> Planned:
    """The locked ops that create one mdev (and define it with the mdevctl argv ``define``). The
    capacity check sits in the create's group, right before its write: concurrent callers
    cannot both take the last instance."""
    p, t, u = spec.parent, spec.type, spec.uuid
    g, dev, tdir = f"create:{u}", device_path(u), type_dir(p, t)
    ops: list[Op] = []
    if create:
        ops += [Op.check_absent(dev, group=g),
                Op.check_int(f"{tdir}/available_instances", 1, group=g),
                Op.write(f"{tdir}/create", str(u), group=g),
                Op.wait(dev, "exists", timeout=wait_timeout, group=g)]
    if define is not None:
        ops.append(Op.exec(define, group=g))

    def explain(bad: OpResult) -> DeviceError:
        op = bad.op
        if op.op == "check_absent":
            return AlreadyExists(host, str(u), f"device {u} appeared concurrently (EEXIST)")
        if op.op == "check_int":
            return NoCapacity(host, str(p), f"no free instance of {t} on {p}: taken by a concurrent caller "
                                            f"since it was read (available_instances now {bad.value})")
        if op.op == "wait":
            return DeviceError(host, str(u), f"wrote the create of {t} on {p} but {dev} did not appear "
                                             f"within {wait_timeout} s")
        if op.op == "exec":
            return error_for(host, str(u), bad, what=f"mdevctl define of {u}")
        # The UUID is validated, so EINVAL on create comes from the vendor driver refusing the type.
        return error_for(host, str(p), bad, what=f"creating {t} ({u}) on {p}", overrides={_errno.EINVAL: NoCapacity})

    return Planned(action, str(u), tuple(ops), explain,
                   data if data is not None else {"uuid": str(u), "parent": str(p), "type": str(t)},
                   intent=intent or f"create {t} on {p}", message="created" if create else "defined",
                   dry_message="would create" if create else "would define")


def remove_item(host: str, uuid: MdevUuid, *, wait_timeout: float, remove: bool = True,
                undefine: Sequence[Sequence[str]] = (), action: str = "mdev.remove",
                data: Mapping[str, Any] | None = None) -> Planned:
    """The locked ops that remove one active mdev (and run each mdevctl argv in ``undefine``)."""
    g, dev = f"remove:{uuid}", device_path(uuid)
    ops: list[Op] = []
    if remove:
        ops += [Op.write(f"{dev}/remove", "1", group=g), Op.wait(dev, "absent", timeout=wait_timeout, group=g)]
    ops += [Op.exec(argv, group=g) for argv in undefine]

    def explain(bad: OpResult) -> DeviceError:
        return error_for(host, str(uuid), bad, what=f"removing mdev {uuid}", overrides={_errno.EAGAIN: DeviceBusy})

    return Planned(action, str(uuid), tuple(ops), explain, data if data is not None else {"uuid": str(uuid)},
                   intent="remove" + (" and undefine" if undefine else ""), message="removed",
                   dry_message="would remove")
