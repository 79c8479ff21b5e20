"""GPU-wide NVIDIA vGPU switches done through ``nvidia-smi`` on the host (argv, never a shell string).

Mixed-size (heterogeneous) mode: ``nvidia-smi vgpu -i GPU -shm 1|0`` (NVIDIA vGPU user guide, vGPU 17+).
The driver refuses it while the GPU holds any vGPU ("In use by another client", exit 19) and on GPUs
without the feature ("Not Supported", exit 3): the ops report either as the error they are.
"""

from __future__ import annotations

from vgpuvirt.errors import DeviceBusy, DeviceError
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mutation import Planned

_IN_USE = 19


def nvidia_smi_bus_id(gpu: PciAddress) -> str:
    """nvidia-smi's form of a PCI address: ``00000000:3D:00.0``."""
    return f"{gpu.domain:08X}:{gpu.bus:02X}:{gpu.slot:02X}.{gpu.function}"


def mixed_size_item(host: str, gpu: PciAddress, on: bool, *, timeout: float = 60.0) -> Planned:
    """The op that switches one GPU to mixed-size mode (``on``) or back to equal-size mode."""
    flag = "1" if on else "0"
    op = Op.exec(("nvidia-smi", "vgpu", "-i", nvidia_smi_bus_id(gpu), "-shm", flag), timeout=timeout,
                 group=f"shm:{gpu}")
    mode = "mixed-size" if on else "equal-size"

    def explain(bad: OpResult) -> DeviceError:
        said = (bad.stderr or bad.stdout or bad.error or "").strip().splitlines()[-1:] or ["no output"]
        if bad.rc == _IN_USE:
            return DeviceBusy(host, str(gpu), f"switching to {mode} mode: the GPU holds vGPUs ({said[0]})")
        return DeviceError(host, str(gpu), f"switching to {mode} mode failed (exit {bad.rc}): {said[0]}")

    return Planned("gpu.sizing", str(gpu), (op,), explain, {"gpu": str(gpu), "mode": mode},
                   intent=f"nvidia-smi vgpu -shm {flag}", message=f"{mode} mode", dry_message=f"would set {mode} mode")
