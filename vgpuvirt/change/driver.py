"""Driver binding: move a PCI function to vfio-pci (passthrough) or back to its vendor's driver; the undo moves
it back to the driver (and ``driver_override``) it had. :func:`prepare_vfio` is ``iommu prepare``: the groups
of the devices to vfio-pci, one BindDriver step each, through the runner."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.runner import Report, run_host
from vgpuvirt.change.step import HostFacts, HostStep, Phase
from vgpuvirt.errors import RecordError
from vgpuvirt.host.base import Host, OpResult, Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services.iommu import vfio_binding
from vgpuvirt.services.iommu.check import VFIO
from vgpuvirt.services.iommu.vfio_binding import BindingRecord
from vgpuvirt.services.mutation import Change, Planned
from vgpuvirt.services.pci import sysfs


@dataclass(frozen=True)
class BindDriver(HostStep):
    """Bind ``device`` to ``to`` (``vfio-pci``, or a vendor driver such as ``nvidia``). ``current``: its driver
    now (None: no driver; the undo of a bind to vfio-pci then unbinds it, any other is left bound, there being
    nothing to go back to); ``override``: its ``driver_override`` now, which the undo writes back."""

    kind: ClassVar[str] = "bind-driver"
    phase: ClassVar[Phase] = Phase.PREPARE
    rank: ClassVar[int] = 30            # after the VFs went (a PF with VFs cannot unbind), before new VFs come
    #: a bind that failed part-way (the override written, the old driver refusing to let go) is undone as far as
    #: its answer says it went: see undo_from
    undo_learned: ClassVar[bool] = True
    host: str
    vm: str
    device: PciAddress
    current: str | None
    to: str
    override: str | None = None

    @property
    def target(self) -> str:
        return str(self.device)

    def describe(self) -> str:
        return f"bind {self.device} to {self.to}"

    def details(self) -> dict[str, str]:
        return {"device": str(self.device), "from": self.current or "", "to": self.to}

    def done_in(self, facts: HostFacts) -> bool:
        return False        # planned from a fresh read of the driver link: a device already bound is not planned

    def item(self, wait_timeout: float) -> Planned:
        return vfio_binding.bind_item(self.host, self.device, self.current, self.to, timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned | None:
        if self.current is None and self.to != VFIO:
            return None
        return vfio_binding.bind_item(self.host, self.device, self.to, self.current, timeout=wait_timeout,
                                      override=self.override)

    def undo_from(self, results: tuple[OpResult, ...], wait_timeout: float) -> Planned | None:
        if all(r.ok for r in results):
            return self.undo_item(wait_timeout)
        if not any(r.ok for r in results):
            return None
        # ops: override, [unbind the old driver], probe, wait for the new one
        unbound = self.current is None or any(r.ok and r.op.path is not None and r.op.path.endswith("/unbind")
                                              for r in results)
        # not unbound: the device is still on its driver, only the override goes back; unbound but the new driver
        # not there: the override goes back and the old driver is probed again
        return vfio_binding.bind_item(self.host, self.device, None, self.current if unbound else None,
                                      timeout=wait_timeout, override=self.override)

    def state_path(self) -> str:
        return sysfs.pci(self.device, "driver")

    def happened(self, snap: Snapshot) -> bool:
        return (snap.link(self.state_path()) or "").rstrip("/").endswith("/" + self.to)

    def undone(self) -> str:
        return f"bound {self.device} back to {self.current}" if self.current else f"unbound {self.device} again"


def prepare_vfio(host: Host, addresses: Iterable[str | PciAddress], *,
                 domains: Iterable[tuple[str, str]] | None = None, for_domain: str | None = None,
                 dry_run: bool = False, timeout: float = 10.0,
                 before_change: Callable[[BindingRecord], None] | None = None
                 ) -> tuple[Change, BindingRecord, Report | None]:
    """Bind every endpoint of the devices' IOMMU groups to vfio-pci (refused, NotAssignable, when the pre-flight
    says no), one :class:`BindDriver` step each in one batch; a failure undoes what moved (ProvisioningError).
    Returns the change, the record of original drivers and the runner's report (None: nothing ran).
    ``before_change(record)`` runs before the first write (only when something is to be bound): a caller that
    keeps the record gets it before the binding, so a record that cannot be kept (a full disk, a bad path)
    stops the binding instead of being lost after it."""
    plan = vfio_binding.plan_prepare(host, addresses, domains=domains, for_domain=for_domain)
    record = plan.record
    steps = [BindDriver(host.name, "", b.address, b.original_driver, VFIO, b.original_override)
             for b in record.bindings]
    ops = tuple(op for s in steps for op in s.item(timeout).ops)
    if not steps:
        return Change(host.name, "iommu.prepare", plan.target, changed=False, dry_run=dry_run, data=plan.data,
                      message="every endpoint is already bound to vfio-pci"), record, None
    if dry_run:
        return Change(host.name, "iommu.prepare", plan.target, changed=True, dry_run=True, ops=ops, data=plan.data,
                      message=f"would bind {len(steps)} device(s) to vfio-pci"), record, None
    if before_change is not None:
        try:
            before_change(record)
        except RecordError as exc:
            raise RecordError(exc.path, exc.errno, f"{exc.reason}: nothing was bound") from None
    vfio_binding.note_prepare(host.name, plan)
    report = run_host(host, steps, what="iommu prepare", wait_timeout=timeout)
    return Change(host.name, "iommu.prepare", plan.target, changed=True, ops=ops, data=plan.data,
                  message=f"bound {len(steps)} device(s) to vfio-pci"), record, report
