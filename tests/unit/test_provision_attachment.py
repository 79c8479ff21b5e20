"""Issue 23 item 3: a placed GPU's attachment (the step that makes its device, its hostdevs, its provenance
entry) is the one mapping from a use to those three; provisioning's domain and hot-plug both take it, and
teardown finds a whole GPU or a VF again through the entry it leaves."""

from __future__ import annotations

import pytest
from provision_fixtures import desktop_host, l40s_host, t4_host

from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.provision import VgpuRequest, VmRequest, plan
from vgpuvirt.provision.placement import Assignment
from vgpuvirt.provision.plan import mdev_uuid_for
from vgpuvirt.provision.request import TypeProfile
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml import Domain, MdevHostdev, PciHostdev
from vgpuvirt.xml.provenance import Provenance

GPU = PciAddress.parse("0000:01:00.0")
AUDIO = PciAddress.parse("0000:01:00.1")


def _a(use: GpuUse, type_id: str, slot: PciAddress = GPU) -> Assignment:
    return Assignment("vm1", 0, "h", GPU, slot, use, TypeProfile(type_id, type_id, "nvidia"), (GPU, AUDIO))


def test_each_use_yields_its_step_its_hostdevs_and_its_record() -> None:
    m = _a(GpuUse.MDEV, "nvidia-231").attachment(display=True)
    u = mdev_uuid_for("vm1", 0)
    assert isinstance(m.step, CreateMdev) and m.step.uuid == u and m.step.parent == GPU
    assert m.devices == (MdevHostdev(u, display=True, ramfb=True),)
    assert dict(m.entry) == {"kind": "mdev", "uuid": str(u), "parent": str(GPU), "type": "nvidia-231"}

    vf = PciAddress.parse("0000:41:00.4")
    v = _a(GpuUse.VENDOR_VF, "nvidia-1155", vf).attachment()
    assert isinstance(v.step, SetVfType) and v.step.vf == vf and v.step.type.value == 1155
    assert v.devices == (PciHostdev.vgpu_vf(vf),)
    assert dict(v.entry) == {"kind": "vendor-vf", "vf": str(vf), "type": "1155"}

    p = _a(GpuUse.VF, "vf", vf).attachment()
    assert p.step is None and p.devices == (PciHostdev(vf),)
    assert dict(p.entry) == {"kind": "vf", "address": str(vf)}

    w = _a(GpuUse.WHOLE, "passthrough").attachment(with_audio=True)
    assert w.step is None and w.devices == (PciHostdev(GPU), PciHostdev(AUDIO))
    assert dict(w.entry) == {"kind": "whole", "address": str(GPU)}
    assert _a(GpuUse.WHOLE, "passthrough").attachment().devices == (PciHostdev(GPU),)


def test_the_frame_rate_limiter_is_turned_off_on_an_nvidia_mdev_only() -> None:
    m = _a(GpuUse.MDEV, "nvidia-231").attachment(frl_off=True)
    assert isinstance(m.step, CreateMdev) and m.step.vgpu_params == "frame_rate_limiter=0"
    with pytest.raises(InvalidSpec, match="frame rate limiter"):
        _a(GpuUse.VENDOR_VF, "nvidia-1155", PciAddress.parse("0000:41:00.4")).attachment(frl_off=True)


@pytest.mark.parametrize(("inv", "req", "template", "want"), [
    (desktop_host, VgpuRequest(mode="passthrough"), "gaming", {"kind": "whole", "address": "0000:01:00.0"}),
    (t4_host, VgpuRequest(type="nvidia-231"), "vdi", {"kind": "mdev", "parent": "0000:3b:00.0",
                                                      "type": "nvidia-231"}),
    (l40s_host, VgpuRequest(type="nvidia-1148"), "vdi", {"kind": "vendor-vf", "type": "1148"}),
])
def test_a_planned_domain_records_its_attachment(inv, req, template, want) -> None:
    """The domain the plan defines carries each GPU's entry: teardown, reruns and detach find a whole GPU (and
    its audio function's owner) through it, and its hostdevs are the attachment's."""
    p = plan([inv()], [VmRequest("att-vm", gpus=(req,), template=template, start=False)])
    (a,) = p.assignments
    (define,) = [s for s in p.steps if s.kind == "define"]
    xml = define.xml  # type: ignore[attr-defined]
    prov = Provenance.read(xml)
    assert prov is not None
    (entry,) = [dict(e) for e in prov.gpus]
    assert entry.items() >= want.items()
    att = a.attachment(with_audio=True)
    assert entry == dict(att.entry)
    devs = Domain.from_xml(xml).gpu_devices()
    assert {str(d) for d in (*devs.mdev_uuids, *devs.pci_addresses)} == {att.target} | (
        {str(f) for f in a.functions} if a.kind is GpuUse.WHOLE else set())
