"""NVIDIA vGPU modes of a whole GPU: mixed-size or equal-size (``nvidia-smi vgpu -shm``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import HostFacts, HostStep, Phase
from vgpuvirt.host.base import Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.nvidia import modes as nvidia_modes
from vgpuvirt.services.pci import sysfs


@dataclass(frozen=True)
class SetMixedSize(HostStep):
    """Switch an idle NVIDIA GPU to mixed-size mode (``--heterogeneous``, ``on``), before the vGPUs planned on it;
    or back to equal-size mode (``on`` False: a layout that says ``sizing: equal``).

    The mode is not in sysfs, so a batch cut mid-flight cannot tell whether it happened (``happened`` is
    False: the rollback leaves the GPU's mode, which holds no device, and says so). It leaves no
    provenance entry: teardown keeps the mode (equal-size sizes fit a mixed-size GPU too)."""

    kind: ClassVar[str] = "mixed-size"
    phase: ClassVar[Phase] = Phase.PREPARE
    rank: ClassVar[int] = 45
    host: str
    vm: str
    gpu: PciAddress
    on: bool = True

    @property
    def target(self) -> str:
        return str(self.gpu)

    def describe(self) -> str:
        if not self.on:
            return f"switch GPU {self.gpu} to equal-size mode (nvidia-smi vgpu -shm 0; it holds no vGPU)"
        return f"switch GPU {self.gpu} to mixed-size mode (nvidia-smi vgpu -shm 1; it holds no vGPU)"

    def details(self) -> dict[str, str]:
        return {"gpu": str(self.gpu), "mode": "mixed-size" if self.on else "equal-size"}

    def done_in(self, facts: HostFacts) -> bool:
        return facts.mixed_size(self.gpu) == self.on

    def item(self, wait_timeout: float) -> Planned:
        return nvidia_modes.mixed_size_item(self.host, self.gpu, self.on)

    def undo_item(self, wait_timeout: float) -> Planned:
        return nvidia_modes.mixed_size_item(self.host, self.gpu, not self.on)

    def state_path(self) -> str:
        return sysfs.pci(self.gpu, "class")

    def happened(self, snap: Snapshot) -> bool:
        return False

    def undone(self) -> str:
        return f"switched GPU {self.gpu} back to {'equal' if self.on else 'mixed'}-size mode"
