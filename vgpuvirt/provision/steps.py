"""Provisioning steps: one class per kind of step.

A step is one thing a plan does on one host for one VM. Its class owns everything about that kind:

* ``describe()``: the line a dry run and the journal print; ``to_dict()``: its JSON (``action`` = ``kind``);
* ``done_in(state)``: "already done?" against what the host holds when planned (a rerun converges);
* how it runs and how it is undone, in one of two families:

  - :class:`HostStep`: sysfs work through the Host. ``item()`` and ``undo_item()`` return the services'
    locked ops (:class:`~vgpuvirt.services.mutation.Planned`); apply runs every HostStep of a host in ONE
    batch, whatever their kinds. ``state_path()`` + ``happened(snap)`` tell, after a cut batch, whether
    the step took effect. A step that makes a device vgpuvirt must find again (teardown, reruns) also
    writes an entry in the domain's provenance metadata (``meta()``) and is rebuilt from it by
    ``from_meta()`` (``meta_kind`` names the entry).
  - :class:`DomainStep`: a libvirt call (``run(conn)``, ``undo(conn)``), after the host's batch.

Adding a kind is one subclass (it registers itself by ``kind``) plus the service call it wraps; see
docs/provision.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from vgpuvirt.errors import XmlError
from vgpuvirt.host.base import Op, Snapshot
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.provision.identity import made_for
from vgpuvirt.services import mdev as mdev_svc
from vgpuvirt.services import nvidia_modes, sysfs, vendor_vgpu
from vgpuvirt.services.mutation import Planned
from vgpuvirt.xml.domain import Domain, parse_xml
from vgpuvirt.xml.refs import DomainRefs

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision.state import HostState

#: kind -> class, filled as each step class is defined.
STEP_KINDS: dict[str, type[Step]] = {}
#: provenance entry kind -> the HostStep class that made such a device.
META_KINDS: dict[str, type[HostStep]] = {}


class Step(ABC):
    """One step of a plan. Subclasses are frozen dataclasses with ``host`` and ``vm`` fields."""

    kind: ClassVar[str]
    #: Order within one host's steps: host batch (0), then define (1), then start (2).
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
    def done_in(self, state: HostState) -> bool:
        """Whether the host, as planned from, already holds what this step makes."""

    def kept(self) -> str | None:
        """The line a plan prints when it finds this step already done (``=`` in a dry run); None: no line."""
        return self.describe()

    def details(self) -> dict[str, str]:
        """Kind-specific fields of :meth:`to_dict`."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.kind, "host": self.host, "vm": self.vm, "target": self.target, **self.details()}


class HostStep(Step):
    """A step done through the Host in the host's one locked batch."""

    meta_kind: ClassVar[str | None] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        mk = cls.__dict__.get("meta_kind")
        if isinstance(mk, str):
            META_KINDS[mk] = cls

    @abstractmethod
    def item(self, wait_timeout: float) -> Planned:
        """The service's locked ops that do the step (capacity re-checked inside the batch)."""

    @abstractmethod
    def undo_item(self, wait_timeout: float) -> Planned:
        """The service's locked ops that undo it."""

    @abstractmethod
    def state_path(self) -> str:
        """The host path whose state says whether the step has happened."""

    @abstractmethod
    def happened(self, snap: Snapshot) -> bool:
        """Whether the host, as read (``state_path()`` included), holds what the step makes."""

    @abstractmethod
    def undone(self) -> str:
        """What the undo did, for the rollback and teardown reports."""

    def meta(self) -> dict[str, str] | None:
        """This step's entry in the domain's provenance metadata (None: it leaves none)."""
        return None

    def not_made_for(self, own: DomainRefs) -> str | None:
        """None when the device's creation record says it was made for ``vm`` (``own``: the devices of
        vm's live and persistent XML); otherwise why not. Metadata can be copied from another domain,
        so teardown asks this before removing anything; a kind without such a record is refused."""
        return f"vgpuvirt keeps no creation record for {self.kind} devices"

    def used_by(self, refs: DomainRefs) -> bool:
        """Whether a domain that references ``refs`` uses this step's device."""
        return False

    @classmethod
    def from_meta(cls, host: str, vm: str, entry: Mapping[str, str]) -> HostStep:
        raise NotImplementedError(f"{cls.__name__} is not rebuilt from metadata")


class DomainStep(Step):
    """A libvirt call, one per step, after the host's batch."""

    @abstractmethod
    def run(self, conn: LibvirtConnection) -> None: ...

    @abstractmethod
    def undo(self, conn: LibvirtConnection) -> str:
        """Undo the step; returns what was done (for the rollback report)."""


def step_from_meta(host: str, vm: str, entry: Mapping[str, str]) -> HostStep | None:
    """The step that made a provenance entry's device; None for entries no step makes (whole GPUs, VFs)."""
    cls = META_KINDS.get(entry.get("kind", ""))
    return cls.from_meta(host, vm, entry) if cls is not None else None


# -- the kinds ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateMdev(HostStep):
    """Create one mdev vGPU of ``type`` on ``parent`` with a UUID derived from the VM."""

    kind: ClassVar[str] = "create-mdev"
    meta_kind: ClassVar[str | None] = "mdev"
    host: str
    vm: str
    uuid: MdevUuid
    parent: PciAddress
    type: MdevTypeId
    vgpu_params: str | None = None          # NVIDIA's nvidia/vgpu_params, written before any VM opens it

    @property
    def target(self) -> str:
        return str(self.uuid)

    def describe(self) -> str:
        params = f" with vgpu_params {self.vgpu_params}" if self.vgpu_params else ""
        return f"create vGPU {self.type} {self.uuid} on {self.parent}{params} (for {self.vm})"

    def kept(self) -> str:
        return f"vGPU {self.type} {self.uuid} on {self.parent}"

    def details(self) -> dict[str, str]:
        return {"parent": str(self.parent), "type": str(self.type)}

    def done_in(self, state: HostState) -> bool:
        return self.uuid in state.existing_mdevs

    def item(self, wait_timeout: float) -> Planned:
        spec = mdev_svc.MdevSpec(self.parent, self.type, self.uuid)
        planned = mdev_svc.create_item(self.host, spec, wait_timeout=wait_timeout)
        if not self.vgpu_params:
            return planned
        # In the create's group and batch: the VM is defined and started only after this batch.
        params = Op.write(f"{self.state_path()}/nvidia/vgpu_params", self.vgpu_params, group=f"create:{self.uuid}")
        return replace(planned, ops=(*planned.ops, params))

    def undo_item(self, wait_timeout: float) -> Planned:
        return mdev_svc.remove_item(self.host, self.uuid, wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.mdev(self.uuid)

    def happened(self, snap: Snapshot) -> bool:
        return snap.has(self.state_path())

    def undone(self) -> str:
        return f"removed vGPU {self.uuid}"

    def meta(self) -> dict[str, str]:
        return {"kind": "mdev", "uuid": str(self.uuid), "parent": str(self.parent), "type": str(self.type)}

    def not_made_for(self, own: DomainRefs) -> str | None:
        # The UUID is derived from the VM name: copied metadata names the other VM's UUIDs.
        if made_for(self.uuid, self.vm):
            return None
        return f"its UUID is not one vgpuvirt derives from the name {self.vm} (metadata copied from another domain?)"

    def used_by(self, refs: DomainRefs) -> bool:
        return self.uuid in refs.mdevs

    @classmethod
    def from_meta(cls, host: str, vm: str, entry: Mapping[str, str]) -> CreateMdev:
        return cls(host, vm, MdevUuid.parse(entry["uuid"]), PciAddress.parse(entry["parent"]),
                   MdevTypeId.parse(entry["type"]))


@dataclass(frozen=True)
class SetVfType(HostStep):
    """Give an NVIDIA vGPU 17+ VF a vGPU type (``nvidia/current_vgpu_type``)."""

    kind: ClassVar[str] = "set-vf-type"
    meta_kind: ClassVar[str | None] = "vendor-vf"
    host: str
    vm: str
    vf: PciAddress
    type: VgpuTypeId

    @property
    def target(self) -> str:
        return str(self.vf)

    def describe(self) -> str:
        return f"set vGPU type {self.type} on VF {self.vf} (for {self.vm})"

    def kept(self) -> str:
        return f"vGPU type {self.type} on VF {self.vf}"

    def details(self) -> dict[str, str]:
        return {"parent": str(self.vf), "type": str(self.type)}

    def done_in(self, state: HostState) -> bool:
        return state.vf_types.get(self.vf) == self.type.value

    def item(self, wait_timeout: float) -> Planned:
        return vendor_vgpu.assign_item(self.host, self.vf, self.type, wait_timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned:
        return vendor_vgpu.release_item(self.host, self.vf, wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.vf_type(self.vf)

    def happened(self, snap: Snapshot) -> bool:
        return snap.text(self.state_path()) == str(self.type)

    def undone(self) -> str:
        return f"reset VF {self.vf}"

    def meta(self) -> dict[str, str]:
        return {"kind": "vendor-vf", "vf": str(self.vf), "type": str(self.type)}

    def not_made_for(self, own: DomainRefs) -> str | None:
        # A VF has no name-derived identity; the domain vgpuvirt defined for it holds it as a hostdev.
        return None if self.vf in own.pci else f"VF {self.vf} is not a hostdev of {self.vm}"

    def used_by(self, refs: DomainRefs) -> bool:
        return self.vf in refs.pci

    @classmethod
    def from_meta(cls, host: str, vm: str, entry: Mapping[str, str]) -> SetVfType:
        return cls(host, vm, PciAddress.parse(entry["vf"]), VgpuTypeId.parse(entry["type"]))


@dataclass(frozen=True)
class DefineDomain(DomainStep):
    """Define the VM's domain from the XML the plan built (provenance metadata included)."""

    kind: ClassVar[str] = "define"
    rank: ClassVar[int] = 1
    host: str
    vm: str
    xml: str = field(repr=False, compare=False)

    @property
    def target(self) -> str:
        return self.vm

    def describe(self) -> str:
        return f"define domain {self.vm}"

    def kept(self) -> str:
        return f"domain {self.vm}"

    def done_in(self, state: HostState) -> bool:
        return self.vm in state.domains

    def run(self, conn: LibvirtConnection) -> None:
        conn.define(self.xml)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.undefine(self.vm)
        return f"undefined domain {self.vm}"


@dataclass(frozen=True)
class StartDomain(DomainStep):
    kind: ClassVar[str] = "start"
    rank: ClassVar[int] = 2
    host: str
    vm: str

    @property
    def target(self) -> str:
        return self.vm

    def describe(self) -> str:
        return f"start domain {self.vm}"

    def kept(self) -> None:
        return None          # a running domain is already listed by its kept define

    def done_in(self, state: HostState) -> bool:
        xml = state.domains.get(self.vm)
        if xml is None:
            return False
        try:
            return Domain(parse_xml(xml)).running
        except XmlError:
            return False

    def run(self, conn: LibvirtConnection) -> None:
        conn.start(self.vm)

    def undo(self, conn: LibvirtConnection) -> str:
        conn.destroy(self.vm)
        return f"destroyed domain {self.vm}"


@dataclass(frozen=True)
class SetMixedSize(HostStep):
    """Switch an idle NVIDIA GPU to mixed-size mode (``--heterogeneous``), before the vGPUs planned on it.

    The mode is not in sysfs, so a batch cut mid-flight cannot tell whether it happened (``happened`` is
    False: the rollback leaves the GPU's mode, which holds no device, and says so). It leaves no
    provenance entry: teardown keeps the mode (equal-size sizes fit a mixed-size GPU too)."""

    kind: ClassVar[str] = "mixed-size"
    host: str
    vm: str
    gpu: PciAddress

    @property
    def target(self) -> str:
        return str(self.gpu)

    def describe(self) -> str:
        return f"switch GPU {self.gpu} to mixed-size mode (nvidia-smi vgpu -shm 1; it holds no vGPU)"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu)}

    def done_in(self, state: HostState) -> bool:
        return any(g.address == self.gpu and g.budget.sizing == "mixed" and not g.switch_to_mixed for g in state.gpus)

    def item(self, wait_timeout: float) -> Planned:
        return nvidia_modes.mixed_size_item(self.host, self.gpu, True)

    def undo_item(self, wait_timeout: float) -> Planned:
        return nvidia_modes.mixed_size_item(self.host, self.gpu, False)

    def state_path(self) -> str:
        return sysfs.pci(self.gpu, "class")

    def happened(self, snap: Snapshot) -> bool:
        return False

    def undone(self) -> str:
        return f"switched GPU {self.gpu} back to equal-size mode"
