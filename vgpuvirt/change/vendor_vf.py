"""NVIDIA vGPU 17+ on SR-IOV VFs: give a VF a vGPU type (its undo resets it to 0), or take it away (its undo gives it
back)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import DeviceStep, HostFacts, HostStep, Phase
from vgpuvirt.host.base import Snapshot
from vgpuvirt.model import PciAddress, VgpuTypeId
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.vgpu import vendor as vendor_vgpu
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.refs import DomainRefs


@dataclass(frozen=True)
class SetVfType(DeviceStep):
    """Give an NVIDIA vGPU 17+ VF a vGPU type (``nvidia/current_vgpu_type``)."""

    kind: ClassVar[str] = "set-vf-type"
    rank: ClassVar[int] = 60
    meta_kind: ClassVar[GpuUse] = GpuUse.VENDOR_VF
    host: str
    vm: str
    vf: PciAddress
    type: VgpuTypeId

    @property
    def target(self) -> str:
        return str(self.vf)

    def describe(self) -> str:
        return f"set vGPU type {self.type} on VF {self.vf}" + (f" (for {self.vm})" if self.vm else "")

    def kept(self) -> str:
        return f"vGPU type {self.type} on VF {self.vf}"

    def details(self) -> dict[str, str]:
        return {"parent": str(self.vf), "type": str(self.type)}

    def done_in(self, facts: HostFacts) -> bool:
        return facts.vf_type(self.vf) == self.type.value

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
        return {"kind": GpuUse.VENDOR_VF, "vf": str(self.vf), "type": str(self.type)}

    def not_made_for(self, own: DomainRefs) -> str | None:
        # A VF has no name-derived identity; the domain vgpuvirt defined for it holds it as a hostdev.
        return None if self.vf in own.pci else f"VF {self.vf} is not a hostdev of {self.vm}"

    def used_by(self, refs: DomainRefs) -> bool:
        return self.vf in refs.pci

    @classmethod
    def from_meta(cls, host: str, vm: str, entry: Mapping[str, str]) -> SetVfType:
        return cls(host, vm, PciAddress.parse(entry["vf"]), VgpuTypeId.parse(entry["type"]))


@dataclass(frozen=True)
class ClearVfType(HostStep):
    """Take an NVIDIA vGPU 17+ VF's vGPU type away (write 0); its undo gives the VF its type back."""

    kind: ClassVar[str] = "clear-vf-type"
    phase: ClassVar[Phase] = Phase.PREPARE
    rank: ClassVar[int] = 10              # before everything the vGPU would block (sizing, SR-IOV, drivers)
    host: str
    vm: str
    vf: PciAddress
    type: VgpuTypeId
    name: str | None = None               # the type's short name ("L40S-8Q") for the plan line

    @property
    def target(self) -> str:
        return str(self.vf)

    def describe(self) -> str:
        return f"clear vGPU type {self.name or self.type} from VF {self.vf}"

    def details(self) -> dict[str, str]:
        return {"parent": str(self.vf), "type": str(self.type)}

    def done_in(self, facts: HostFacts) -> bool:
        return facts.vf_type(self.vf) == 0

    def item(self, wait_timeout: float) -> Planned:
        return vendor_vgpu.release_item(self.host, self.vf, wait_timeout=wait_timeout)

    def undo_item(self, wait_timeout: float) -> Planned:
        return vendor_vgpu.assign_item(self.host, self.vf, self.type, wait_timeout=wait_timeout)

    def state_path(self) -> str:
        return sysfs.vf_type(self.vf)

    def happened(self, snap: Snapshot) -> bool:
        return snap.text(self.state_path()) == "0"

    def undone(self) -> str:
        return f"set vGPU type {self.name or self.type} on VF {self.vf} again"
