"""Mediated devices: create a vGPU (its undo removes it), remove one (its undo creates it again)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from vgpuvirt.change.identity import made_for
from vgpuvirt.change.step import DeviceStep, HostFacts, HostStep, Phase
from vgpuvirt.host.base import Op, Snapshot
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.vgpu import mdev_ops as mdev_svc
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.refs import DomainRefs


@dataclass(frozen=True)
class CreateMdev(DeviceStep):
    """Create one mdev vGPU of ``type`` on ``parent`` with a UUID derived from the VM."""

    kind: ClassVar[str] = "create-mdev"
    phase: ClassVar[Phase] = Phase.DEVICES
    rank: ClassVar[int] = 70
    meta_kind: ClassVar[GpuUse] = GpuUse.MDEV
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
        vm = f" (for {self.vm})" if self.vm else ""          # a layout's vGPU is for no VM yet
        return f"create vGPU {self.type} {self.uuid} on {self.parent}{params}{vm}"

    def kept(self) -> str:
        return f"vGPU {self.type} {self.uuid} on {self.parent}"

    def details(self) -> dict[str, str]:
        return {"parent": str(self.parent), "type": str(self.type)}

    def done_in(self, facts: HostFacts) -> bool:
        return facts.has_mdev(self.uuid)

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
        return {"kind": GpuUse.MDEV, "uuid": str(self.uuid), "parent": str(self.parent), "type": str(self.type)}

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
class RemoveMdev(HostStep):
    """Remove an mdev vGPU (a layout taking a GPU to fewer, or other, vGPUs); its undo creates it again with its
    UUID, type and parent, so a domain that names it finds it again."""

    kind: ClassVar[str] = "remove-mdev"
    phase: ClassVar[Phase] = Phase.PREPARE
    rank: ClassVar[int] = 10              # before everything the vGPU would block (sizing, SR-IOV, drivers)
    host: str
    vm: str
    uuid: MdevUuid
    parent: PciAddress
    type: MdevTypeId
    name: str | None = None               # the type's short name ("A10-4Q") for the plan line

    @property
    def target(self) -> str:
        return str(self.uuid)

    def describe(self) -> str:
        return f"remove mdev {self.uuid} ({self.name or self.type}) from {self.parent}"

    def details(self) -> dict[str, str]:
        return {"parent": str(self.parent), "type": str(self.type)}

    def done_in(self, facts: HostFacts) -> bool:
        return not facts.has_mdev(self.uuid)

    def item(self, wait_timeout: float) -> Planned:
        return mdev_svc.remove_item(self.host, self.uuid, wait_timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned:
        return mdev_svc.create_item(self.host, mdev_svc.MdevSpec(self.parent, self.type, self.uuid),
                                    wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.mdev(self.uuid)

    def happened(self, snap: Snapshot) -> bool:
        return not snap.has(self.state_path())

    def undone(self) -> str:
        return f"created mdev {self.uuid} ({self.name or self.type}) on {self.parent} again"
