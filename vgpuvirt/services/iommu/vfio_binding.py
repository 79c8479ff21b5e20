"""vfio-pci binding of whole IOMMU groups (after the pre-flight) and giving the devices back.

``driver_override`` + unbind + ``drivers_probe``, never ``new_id`` (which would grab every device with
that id); the :class:`BindingRecord` of original drivers is the caller's to keep. :func:`plan_prepare` says
what to bind (pure but for one read); the binding runs as the change engine's ``BindDriver`` steps
(:func:`vgpuvirt.change.driver.prepare_vfio`: one batch, the runner's rollback). :func:`release` gives the
devices back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import DeviceBusy, DeviceError, InvalidSpec, NotAssignable
from vgpuvirt.host.base import Host, Op, OpResult
from vgpuvirt.model import DriverName, PciAddress
from vgpuvirt.services.iommu.check import (
    VFIO,
    AssignabilityReport,
    assignability,
    domain_users,
    parse_addresses,
    read_patterns,
)
from vgpuvirt.services.mutation import Change, Planned, error_for, note
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.pci.parsers import parse_driver_override


@dataclass(frozen=True)
class Binding:
    address: PciAddress
    original_driver: str | None
    original_override: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"address": str(self.address), "original_driver": self.original_driver,
                "original_override": self.original_override}


@dataclass(frozen=True)
class BindingRecord:
    """What :func:`prepare` changed: keep it and hand it to :func:`release`."""

    host: str
    bindings: tuple[Binding, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "bindings": [b.to_dict() for b in self.bindings]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BindingRecord:
        try:
            out = []
            for b in data["bindings"]:
                drv = b.get("original_driver")
                ov = b.get("original_override")
                out.append(Binding(PciAddress.parse(b["address"]),
                                   str(DriverName(drv)) if drv else None, str(DriverName(ov)) if ov else None))
            return cls(str(data.get("host", "")), tuple(out))
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidSpec("binding record", data, "the JSON that `iommu prepare` printed") from exc


def _bind_ops(a: PciAddress, driver: str | None, timeout: float) -> list[Op]:
    g = f"bind:{a}"
    ops = [Op.write(f"{sysfs.PCI}/{a}/driver_override", VFIO, group=g)]
    if driver is not None:
        ops.append(Op.write(sysfs.driver_unbind(DriverName(driver)), str(a), group=g))
    ops += [Op.write(sysfs.DRIVERS_PROBE, str(a), group=g),
            Op.wait(f"{sysfs.PCI}/{a}/driver", "link_endswith", VFIO, timeout=timeout, group=g)]
    return ops


def _release_ops(a: PciAddress, current: str | None, b: Binding, timeout: float) -> list[Op]:
    g = f"release:{a}"
    ops = [Op.write(f"{sysfs.PCI}/{a}/driver_override", (b.original_override or "") + "\n", group=g)]
    if current is not None:
        ops.append(Op.write(sysfs.driver_unbind(DriverName(current)), str(a), group=g))
    if b.original_driver is not None:
        ops += [Op.write(sysfs.DRIVERS_PROBE, str(a), group=g),
                Op.wait(f"{sysfs.PCI}/{a}/driver", "link_endswith", b.original_driver, timeout=timeout, group=g)]
    return ops


def bind_item(host: str, a: PciAddress, current: str | None, to: str | None, *, timeout: float = 10.0,
              override: str | None = None) -> Planned:
    """One device moved from driver ``current`` to ``to`` (vfio-pci, or back to the vendor's driver; None: back to
    no driver) with the same ops a binding and :func:`release` use, as one batch item (the driver step).
    ``override``: the ``driver_override`` to leave when going back (what the device had)."""
    if to == VFIO:
        ops = _bind_ops(a, current, timeout)
    else:
        ops = _release_ops(a, current, Binding(a, str(DriverName(to)) if to else None, override), timeout)

    def explain(bad: OpResult) -> DeviceError:
        return error_for(host, str(a), bad, what=f"binding {a} to {to}")

    return Planned("driver.bind", str(a), tuple(ops), explain, {"device": str(a), "from": current, "to": to},
                   intent=f"bind to {to}", message=f"bound to {to}", dry_message=f"would bind to {to}")


@dataclass(frozen=True)
class PreparePlan:
    """What binding devices' IOMMU groups to vfio-pci takes: ``record.bindings`` (each endpoint not yet on
    vfio-pci, with its driver and override now), the pre-flight ``report``, the devices asked for."""

    record: BindingRecord
    report: AssignabilityReport
    requested: tuple[PciAddress, ...]

    @property
    def target(self) -> str:
        return ",".join(str(a) for a in self.requested)

    @property
    def data(self) -> dict[str, Any]:
        return {"devices": [str(a) for a in self.requested], "bind": [b.to_dict() for b in self.record.bindings],
                "report": self.report}


def plan_prepare(host: Host, addresses: Iterable[str | PciAddress], *,
                 domains: Iterable[tuple[str, str]] | None = None, for_domain: str | None = None) -> PreparePlan:
    """Which endpoints of the devices' IOMMU groups go to vfio-pci (one read); refuse (NotAssignable) when the
    pre-flight says no. Nothing is changed."""
    reqs = parse_addresses(addresses)
    users = domain_users(domains, for_domain)
    report, f = assignability(host, host.read(read_patterns()), reqs, users)
    if not report.assignable:
        raise NotAssignable(host.name, ", ".join(str(a) for a in reqs), list(report.reasons), report)
    targets: list[PciAddress] = []
    for d in report.devices:
        for m in d.members:
            if m.is_bridge or m.address in targets:
                continue
            if f.vgpu_type(m.address) is not None:
                continue      # a vGPU 17+ VF is already a VFIO device under nvidia: never rebind it
            targets.append(m.address)
    bindings = [Binding(a, f.driver(a), f.override(a)) for a in targets if f.driver(a) != VFIO]
    return PreparePlan(BindingRecord(host.name, tuple(bindings)), report, tuple(reqs))


def note_prepare(host: str, plan: PreparePlan) -> None:
    note(host, "iommu.prepare", plan.target, "bind " + ", ".join(f"{b.address} (from {b.original_driver})"
                                                                 for b in plan.record.bindings))


def release(host: Host, record: BindingRecord | Sequence[str | PciAddress], *,
            domains: Iterable[tuple[str, str]] | None = None, dry_run: bool = False,
            timeout: float = 10.0) -> Change:
    """Give devices back to their original drivers (from the record). Without a record (a list
    of addresses) the override is cleared and the kernel probes the device's default driver."""
    if isinstance(record, BindingRecord):
        bindings = list(record.bindings)
        probe_default = False
    else:
        bindings = [Binding(a, None) for a in parse_addresses(record)]
        probe_default = True
    users = domain_users(domains, None)
    snap = host.read([f"{sysfs.PCI}/{b.address}/{x}" for b in bindings for x in ("driver", "driver_override", "class")])
    ops: list[Op] = []
    done: list[str] = []
    for b in bindings:
        a = b.address
        if not snap.has(f"{sysfs.PCI}/{a}/class"):
            raise DeviceError(host.name, str(a), "no such PCI device (was it removed?)")
        if a in users:
            raise DeviceBusy(host.name, str(a), f"still used by domain {', '.join(users[a])}")
        cur = snap.link_name(f"{sysfs.PCI}/{a}/driver")
        ov = parse_driver_override(snap.text(f"{sysfs.PCI}/{a}/driver_override"))
        if probe_default:
            if cur != VFIO and ov != VFIO:
                continue
            g = f"release:{a}"
            ops.append(Op.write(f"{sysfs.PCI}/{a}/driver_override", "\n", group=g))
            if cur is not None:
                ops.append(Op.write(sysfs.driver_unbind(DriverName(cur)), str(a), group=g))
            ops.append(Op.write(sysfs.DRIVERS_PROBE, str(a), group=g))
        else:
            if cur == b.original_driver and ov == b.original_override:
                continue
            ops += _release_ops(a, cur, b, timeout)
        done.append(str(a))
    target = ",".join(str(b.address) for b in bindings)
    data = {"devices": done}
    if not ops:
        return Change(host.name, "iommu.release", target, changed=False, dry_run=dry_run, data=data,
                      message="already on the original drivers")
    if dry_run:
        return Change(host.name, "iommu.release", target, changed=True, dry_run=True, ops=tuple(ops), data=data,
                      message=f"would release {len(done)} device(s)")
    note(host.name, "iommu.release", target, "restore " + ", ".join(done))
    batch = host.apply(ops, on_error="continue")
    failed = [r for r in batch.results if not r.ok and not r.skipped]
    if failed:
        raise error_for(host.name, failed[0].op.path or target, failed[0], what="restoring the original driver")
    return Change(host.name, "iommu.release", target, changed=True, ops=tuple(ops), data=data,
                  message=f"released {len(done)} device(s)")
