"""SR-IOV: set a physical function's VF count (its undo sets the count it had).

Two kinds, because the direction decides where the change runs: taking VFs away (``sriov-disable``) goes early,
right after the vGPUs on them are gone; making VFs (``sriov-enable``, also a change from one non-zero count to
another, which the kernel does through 0) goes after the driver binding, so the VFs come up on the PF's driver.
:func:`vf_count_step` picks the kind. :func:`set_vf_count` is ``vgpuvirt sriov enable|disable``, :func:`enable_steps`
the preparation of a provisioning run (``provision.run``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from vgpuvirt.change.runner import Report, run_host
from vgpuvirt.change.step import HostFacts, HostStep, Phase
from vgpuvirt.errors import ProvisioningError
from vgpuvirt.host.base import Host, Snapshot
from vgpuvirt.model import PciAddress, VfCount
from vgpuvirt.services.mutation import Change, Planned, note
from vgpuvirt.services.pci import sriov, sysfs
from vgpuvirt.services.pci.sriov import SriovService, VendorToolMissing


@dataclass(frozen=True)
class VfCountStep(HostStep):
    """A PF taken from ``current`` to ``want`` VFs. The base of the two kinds; it has no kind of its own."""

    phase: ClassVar[Phase] = Phase.PREPARE
    host: str
    vm: str
    pf: PciAddress
    current: int
    want: int
    #: through NVIDIA's sriov-manage (what its driver's service runs) rather than sysfs; the undo goes the same way
    via_tool: bool = False

    @property
    def target(self) -> str:
        return str(self.pf)

    def describe(self) -> str:
        return f"set {self.want} SR-IOV VFs on {self.pf} (from {self.current})"

    def details(self) -> dict[str, str]:
        return {"pf": str(self.pf), "from": str(self.current), "to": str(self.want)}

    def done_in(self, facts: HostFacts) -> bool:
        return False        # planned from a fresh read of sriov_numvfs: a count that is already right is not planned

    def item(self, wait_timeout: float) -> Planned:
        if self.via_tool:
            return sriov.tool_item(self.host, self.pf, self.current, self.want, wait_timeout=wait_timeout)
        return sriov.count_item(self.host, self.pf, self.current, self.want, wait_timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned:
        if (self.via_tool and self.current in (0, self.want)) or (self.via_tool and not self.want):
            return sriov.tool_item(self.host, self.pf, self.want, self.current, wait_timeout=wait_timeout)
        return sriov.count_item(self.host, self.pf, self.want, self.current, wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.pci(self.pf, "sriov_numvfs")

    def happened(self, snap: Snapshot) -> bool:
        # moved at all, not only to ``want``: a change through 0 that failed after the 0 left the PF without the
        # VFs it had, which the undo must give back
        return snap.int(self.state_path()) != self.current

    def undone(self) -> str:
        return f"set {self.current} SR-IOV VFs on {self.pf} again"


@dataclass(frozen=True)
class DisableVfs(VfCountStep):
    """Take every VF of a PF away (``want`` 0)."""

    kind: ClassVar[str] = "sriov-disable"
    rank: ClassVar[int] = 20            # after the vGPUs on the VFs went, before the driver binding


@dataclass(frozen=True)
class EnableVfs(VfCountStep):
    """Make ``want`` (> 0) VFs on a PF (through 0 when it had others)."""

    kind: ClassVar[str] = "sriov-enable"
    rank: ClassVar[int] = 40            # after the driver binding: the VFs come up on the PF's driver


def vf_count_step(host: str, pf: PciAddress, current: int, want: int, vm: str = "", *,
                  via_tool: bool = False) -> VfCountStep:
    """The step that takes ``pf`` from ``current`` to ``want`` VFs, of the kind its direction runs as."""
    cls = DisableVfs if want == 0 else EnableVfs
    return cls(host, vm, pf, current, want, via_tool)


def enable_steps(host: Host, pfs: Sequence[PciAddress], *, wait_timeout: float = 30.0) -> list[VfCountStep]:
    """The steps that give each PF all the VFs it supports (a provisioning run's preparation), as planned and
    validated by :meth:`SriovService.plan_count`; PFs that have them already give none."""
    svc = SriovService(host, wait_timeout=wait_timeout)
    plans = [svc.plan_count(pf) for pf in pfs]
    return [vf_count_step(host.name, p.pf, p.current, p.want, via_tool=p.via_tool) for p in plans if p.changed]


def set_vf_count(host: Host, pf: str | PciAddress, count: int | str | VfCount | None = None, *, force: bool = False,
                 dry_run: bool = False, domains: Iterable[tuple[str, str]] | None = None,
                 vendor_tool: bool | None = None, wait_timeout: float = 30.0) -> tuple[Change, Report | None]:
    """Set a PF's VF count (``None``: all it supports; 0 disables) through the runner: the change (its ops, its
    data) and the runner's report (None when nothing ran). Through sriov-manage where the service says so; a host
    without it (exit 127, nothing changed) gets the sysfs way."""
    plan = SriovService(host, wait_timeout=wait_timeout, vendor_tool=vendor_tool).plan_count(
        pf, count, force=force, domains=domains)
    action = "sriov.enable" if plan.want else "sriov.disable"
    if not plan.changed:
        return Change(host.name, action, str(plan.pf), changed=False, dry_run=dry_run, data=plan.data,
                      message=f"{plan.want} VFs already"), None
    step = vf_count_step(host.name, plan.pf, plan.current, plan.want, via_tool=plan.via_tool)
    if dry_run:
        return Change(host.name, action, str(plan.pf), changed=True, dry_run=True, ops=step.item(wait_timeout).ops,
                      data=plan.data, message=f"would set {plan.want} VFs"), None
    note(host.name, action, str(plan.pf), f"{plan.current} -> {plan.want} VFs via {plan.data['via']}")
    data = plan.data
    try:
        report = run_host(host, [step], what=f"setting {plan.want} VFs on {plan.pf}", wait_timeout=wait_timeout)
    except ProvisioningError as exc:
        if not isinstance(exc.cause, VendorToolMissing) or exc.completed:
            raise
        step = replace(step, via_tool=False)          # the tool is not installed and nothing ran: the sysfs way
        data = {**data, "via": "sysfs"}
        report = run_host(host, [step], what=f"setting {plan.want} VFs on {plan.pf}", wait_timeout=wait_timeout)
    return Change(host.name, action, str(plan.pf), changed=True, ops=step.item(wait_timeout).ops, data=data,
                  message=f"{plan.want} VFs"), report
