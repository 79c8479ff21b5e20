"""SR-IOV: set a physical function's VF count (its undo sets the count it had).

Two kinds, because the direction decides where the change runs: taking VFs away (``sriov-disable``) goes early,
right after the vGPUs on them are gone; making VFs (``sriov-enable``, also a change from one non-zero count to
another, which the kernel does through 0) goes after the driver binding, so the VFs come up on the PF's driver.
:func:`vf_count_step` picks the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import HostFacts, HostStep, Phase
from vgpuvirt.host.base import Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services import sriov, sysfs
from vgpuvirt.services.mutation import Planned


@dataclass(frozen=True)
class VfCountStep(HostStep):
    """A PF taken from ``current`` to ``want`` VFs. The base of the two kinds; it has no kind of its own."""

    phase: ClassVar[Phase] = Phase.PREPARE
    host: str
    vm: str
    pf: PciAddress
    current: int
    want: int

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
        return sriov.count_item(self.host, self.pf, self.current, self.want, wait_timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned:
        return sriov.count_item(self.host, self.pf, self.want, self.current, wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.pci(self.pf, "sriov_numvfs")

    def happened(self, snap: Snapshot) -> bool:
        return snap.int(self.state_path()) == self.want

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


def vf_count_step(host: str, pf: PciAddress, current: int, want: int, vm: str = "") -> VfCountStep:
    """The step that takes ``pf`` from ``current`` to ``want`` VFs, of the kind its direction runs as."""
    return DisableVfs(host, vm, pf, current, want) if want == 0 else EnableVfs(host, vm, pf, current, want)
