"""What one placed GPU gives a VM: the one mapping from a use (:class:`~vgpuvirt.usage.GpuUse`) to

* the step that makes its device (an mdev, a vGPU type on a vGPU 17+ VF; None when the device exists already:
  a whole GPU, a plain VF, which libvirt binds to vfio-pci itself, ``managed='yes'``),
* its devices in the domain XML (the hostdevs),
* its entry in the domain's provenance metadata (how teardown, reruns and detach find it again).

Provisioning (:mod:`.plan`) and hot-plug (:mod:`.hotplug`) both take these from
:meth:`~vgpuvirt.provision.placement.Assignment.attachment`; neither spells the mapping itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.step import DeviceStep
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.hostdev import GpuDevice, MdevHostdev, PciHostdev

#: NVIDIA documents vgpu_params on the mdev only: the frame rate limiter is turned off there, nowhere else.
FRL_OFF = "frame_rate_limiter=0"


@dataclass(frozen=True)
class Attachment:
    use: GpuUse
    step: DeviceStep | None               # what makes the device; None: it exists (whole GPU, plain VF)
    devices: tuple[GpuDevice, ...]        # the hostdevs of the VM's domain
    entry: Mapping[str, str]              # the provenance entry

    @property
    def target(self) -> str:
        """The device as the VM's XML and its provenance name it: an mdev UUID, else the PCI address."""
        d = self.devices[0]
        return str(d.uuid) if isinstance(d, MdevHostdev) else str(d.address)


def attachment(host: str, vm: str, use: GpuUse, slot: PciAddress, type_id: str, *,
               functions: tuple[PciAddress, ...] = (), uuid: MdevUuid | None = None, with_audio: bool = False,
               frl_off: bool = False, display: bool = False) -> Attachment:
    """The attachment of a device of ``use`` at ``slot`` for ``vm`` (see the module docstring). ``uuid``: the
    mdev's (derived from the VM's name by the caller); ``functions``: a whole GPU's, passed through with it when
    ``with_audio``; ``display``: the mdev is the VM's display (with ramfb)."""
    if frl_off and not (use is GpuUse.MDEV and type_id.startswith("nvidia-")):
        # a vGPU 17+ VF's equivalent of vgpu_params is not documented
        raise InvalidSpec("GPU request", f"frl=off for {vm}", "an NVIDIA mdev vGPU: the frame rate limiter "
                          f"of a {use} device ({type_id} on {slot}) cannot be turned off through vgpu_params")
    if use is GpuUse.MDEV:
        if uuid is None:
            raise InvalidSpec("mdev UUID", None, f"the UUID of {vm}'s vGPU on {slot}")
        mdev = CreateMdev(host, vm, uuid, slot, MdevTypeId.parse(type_id), FRL_OFF if frl_off else None)
        return Attachment(use, mdev, (MdevHostdev(uuid, display=display, ramfb=display),), mdev.meta())
    if use is GpuUse.VENDOR_VF:
        vf = SetVfType(host, vm, slot, VgpuTypeId.parse(type_id))
        return Attachment(use, vf, (PciHostdev.vgpu_vf(slot),), vf.meta())
    if use is GpuUse.VF:
        return Attachment(use, None, (PciHostdev(slot),), {"kind": GpuUse.VF, "address": str(slot)})
    if use is GpuUse.WHOLE:
        funcs = functions if with_audio and functions else (slot,)
        return Attachment(use, None, tuple(PciHostdev(f) for f in funcs), {"kind": GpuUse.WHOLE,
                                                                           "address": str(slot)})
    raise InvalidSpec("GPU use", str(use), "a use placement attaches (mdev, vendor-vf, vf, whole)")
