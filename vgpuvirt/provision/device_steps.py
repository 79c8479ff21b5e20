"""The host step that makes an assignment's device (an mdev, a vGPU 17+ VF's type), from the VM's request:
one mapping from a placement's kind to its change, for the plan."""

from __future__ import annotations

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.step import DeviceStep
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MdevTypeId, VgpuTypeId
from vgpuvirt.provision.placement import Assignment
from vgpuvirt.provision.request import VmRequest


def device_step(vm: VmRequest, a: Assignment) -> DeviceStep | None:
    """The step that makes an assignment's device; None when the device exists already (whole GPU, VF)."""
    frl_off = vm.gpus[a.index].frl is False
    if frl_off and not (a.kind == "mdev" and a.type.id.startswith("nvidia-")):
        # NVIDIA documents vgpu_params on the mdev only; a vGPU 17+ VF's equivalent is not documented.
        raise InvalidSpec("GPU request", f"frl=off for {vm.name}", "an NVIDIA mdev vGPU: the frame rate limiter "
                          f"of a {a.kind} device ({a.type.id} on {a.slot}) cannot be turned off through vgpu_params")
    if a.kind == "mdev":
        return CreateMdev(a.host, vm.name, mdev_uuid_for(vm.name, a.index), a.slot, MdevTypeId.parse(a.type.id),
                          "frame_rate_limiter=0" if frl_off else None)
    if a.kind == "vendor-vf":
        return SetVfType(a.host, vm.name, a.slot, VgpuTypeId.parse(a.type.id))
    return None
