"""The step contract: one class per kind of change to a host or to its libvirt.

A step is one change on one host (for one VM, or for the host itself: ``vm`` is then ""). Its class owns
everything about that kind:

* ``kind`` (its name in JSON and the registry), ``phase`` and ``rank`` (where it runs: :class:`Phase`, then
  ``rank`` within the phase, lowest first);
* ``describe()``: its line in a dry run, the journal and the report; ``to_dict()``: its JSON;
* ``done_in(facts)``: "already done?" against what the host held when planned (a rerun converges);
* how it runs and how it is undone, in one of two families:

  - :class:`HostStep`: work through the Host (sysfs writes, argv programs). ``item()`` and ``undo_item()`` give
    the services' locked ops (:class:`~vgpuvirt.services.mutation.Planned`); the runner puts consecutive
    HostSteps of a host in ONE locked batch, whatever their kinds. A kind whose undo is known only from the
    host's answer (the id nvidia-smi gave a GPU instance) learns it in ``undo_from(results)``; one whose
    answer can say "not done" (a MIG mode change pending a reset) says so in ``check(results)``.
    ``state_path()`` + ``happened(snap)`` tell, after a cut batch, whether the step took effect. A step that
    makes a device vgpuvirt must find again (teardown, reruns) also writes an entry in the domain's
    provenance metadata (``meta()``) and is rebuilt from it by ``from_meta()`` (``meta_kind`` names it).
  - :class:`DomainStep`: a libvirt call (``run(conn)``, ``undo(conn)``), one at a time.

:class:`~vgpuvirt.change.runner.Runner` runs steps, journals them and undoes exactly what ran. Adding a kind
is one subclass (it registers itself by ``kind``) and one test; see docs/change.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from vgpuvirt.host.base import OpResult, Snapshot
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.services.mutation import Planned
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.refs import DomainRefs

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.libvirt_conn import LibvirtConnection


class Phase(IntEnum):
    """Where a step runs. A verb that re-reads the host between phases (layouts: the VFs SR-IOV made exist
    only then) runs one phase per batch; provisioning runs its host steps in one batch, then its domain steps."""

    PREPARE = 1    # the GPU itself: vGPUs that go away, sizing mode, SR-IOV, driver binding, MIG mode/instances
    DEVICES = 2    # devices made on what PREPARE left: vGPU types on VFs, mdevs, the vGPU scheduler
    DOMAINS = 3    # libvirt: volumes, define, start, migrate, attach, detach


class HostFacts(Protocol):
    """What ``done_in`` may ask of a host as read when planned (provisioning's HostState answers it)."""

    def has_mdev(self, uuid: MdevUuid) -> bool: ...

    def vf_type(self, vf: PciAddress) -> int | None: ...

    def domain_xml(self, name: str) -> str | None: ...

    def mixed_size(self, gpu: PciAddress) -> bool:
        """The GPU is in mixed-size mode now (not merely counted so by the plan)."""
        ...

    def volumes(self, pool: str) -> frozenset[str] | None:
        """The volume names of a storage pool; None: the pool (or libvirt's facts) was not read."""
        ...

#: kind -> class, filled as each step class is defined.
STEP_KINDS: dict[str, type[Step]] = {}
#: provenance entry kind -> the HostStep class that made such a device.
META_KINDS: dict[GpuUse, type[DeviceStep]] = {}


class Step(ABC):
    """One change. Subclasses are frozen dataclasses with ``host`` and ``vm`` fields (``vm`` "" for a change
    to the host itself)."""

    kind: ClassVar[str]
    phase: ClassVar[Phase] = Phase.DEVICES
    #: Order within the phase, lowest first (a removal before what it would block).
    rank: ClassVar[int] = 0
    host: str
    vm: str

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        kind = cls.__dict__.get("kind")
        if isinstance(kind, str):
            if kind in STEP_KINDS:
                raise TypeError(f"step kind {kind!r} is defined twice ({STEP_KINDS[kind].__name__}, {cls.__name__})")
            STEP_KINDS[kind] = cls

    @property
    @abstractmethod
    def target(self) -> str:
        """What the step acts on: an mdev UUID, a VF address, a domain name."""

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def done_in(self, facts: HostFacts) -> bool:
        """Whether the host, as planned from, already holds what this step makes."""

    def kept(self) -> str | None:
        """The line a plan prints when it finds this step already done (``=`` in a dry run); None: no line."""
        return self.describe()

    def details(self) -> dict[str, str]:
        """Kind-specific fields of :meth:`to_dict`."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.kind, "host": self.host, **({"vm": self.vm} if self.vm else {}),
                "target": self.target, **self.details()}


class HostStep(Step):
    """A step done through the Host, in one locked batch with the host's other host steps."""

    #: The undo is read from the host's answer (``undo_from``), even from a failed step's answer.
    undo_learned: ClassVar[bool] = False

    @abstractmethod
    def item(self, wait_timeout: float) -> Planned:
        """The service's locked ops that do the step (capacity re-checked inside the batch)."""

    @abstractmethod
    def undo_item(self, wait_timeout: float) -> Planned | None:
        """The service's locked ops that undo it; None: nothing to undo, or known only from the answer."""

    def undo_from(self, results: tuple[OpResult, ...], wait_timeout: float) -> Planned | None:
        """The undo once the host answered (ran in full or in part). Most kinds know it beforehand; a kind whose
        undo names what the host chose (a GPU instance's id) reads it from ``results``."""
        return self.undo_item(wait_timeout)

    def check(self, results: tuple[OpResult, ...]) -> str | None:
        """Why the step, though its ops succeeded, did not take effect (None: it did); the runner stops there."""
        return None

    @property
    def reload_pending(self) -> bool:
        """It takes effect only at the next load of the driver (a module-parameter file): reported apart."""
        return False

    def state_path(self) -> str | None:
        """The host path whose state says whether the step has happened; None: nothing on the host tells (the
        rollback of a cut batch then undoes it anyway, its undo being harmless when it had not happened)."""
        return None

    def happened(self, snap: Snapshot) -> bool:
        """Whether the host, as read (``state_path()`` included), holds what the step makes."""
        return True

    @abstractmethod
    def undone(self) -> str:
        """What the undo did, for the rollback and teardown reports."""


class DeviceStep(HostStep):
    """A host step that makes a device a VM uses (an mdev, a VF's vGPU type). It writes an entry in the domain's
    provenance metadata (``meta()``) and is rebuilt from it by ``from_meta()`` (``meta_kind`` names the entry):
    teardown and reruns find the device again, and ask ``not_made_for`` before removing it."""

    meta_kind: ClassVar[GpuUse]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        mk = cls.__dict__.get("meta_kind")
        if isinstance(mk, GpuUse):
            META_KINDS[mk] = cls

    @abstractmethod
    def undo_item(self, wait_timeout: float) -> Planned: ...

    @abstractmethod
    def state_path(self) -> str: ...

    @abstractmethod
    def happened(self, snap: Snapshot) -> bool: ...

    @abstractmethod
    def meta(self) -> dict[str, str]:
        """This step's entry in the domain's provenance metadata."""

    @abstractmethod
    def not_made_for(self, own: DomainRefs) -> str | None:
        """None when the device's creation record says it was made for ``vm`` (``own``: the devices of
        vm's live and persistent XML); otherwise why not. Metadata can be copied from another domain,
        so teardown asks this before removing anything."""

    @abstractmethod
    def used_by(self, refs: DomainRefs) -> bool:
        """Whether a domain that references ``refs`` uses this step's device."""

    @classmethod
    @abstractmethod
    def from_meta(cls, host: str, vm: str, entry: Mapping[str, str]) -> DeviceStep: ...


class DomainStep(Step):
    """A libvirt call, one per step, after the host's batch."""

    @property
    def target(self) -> str:
        """The domain it acts on (a kind acting on something else, a volume or a device, says so)."""
        return self.vm

    @abstractmethod
    def run(self, conn: LibvirtConnection) -> None: ...

    @abstractmethod
    def undo(self, conn: LibvirtConnection) -> str:
        """Undo the step; returns what was done (for the rollback report)."""


def step_from_meta(host: str, vm: str, entry: Mapping[str, str]) -> DeviceStep | None:
    """The step that made a provenance entry's device; None for entries no step makes (whole GPUs, VFs)."""
    try:
        cls = META_KINDS.get(GpuUse(entry.get("kind", "")))
    except ValueError:          # a kind this version does not know: nothing it can remove
        return None
    return cls.from_meta(host, vm, entry) if cls is not None else None
