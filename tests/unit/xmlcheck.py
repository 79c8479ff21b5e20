"""Shared by the XML tests: the template x device-mix cases, and ``check_create`` (libvirt's schema + parser).

Every XML a builder or template produces in the tests goes through :func:`check_create`.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.model import MacAddress, MdevUuid, PciAddress
from vgpuvirt.xml import (
    CpuPinning,
    Disk,
    Domain,
    DomainOptions,
    EvdevInput,
    GuestAddress,
    HostdevInterface,
    MdevHostdev,
    PciHostdev,
    VirtioNic,
    Virtualport,
    build_domain,
    validate,
)

U1 = MdevUuid.parse("e55bf865-6983-4d53-967f-51e8a3bb0f57")
U2 = MdevUuid.parse("3131f5fd-7c04-4a61-92c1-0c37f9547b6b")
U3 = MdevUuid.parse("fa9d3c62-1f4b-4c4a-a0a1-4dbf3d4f2b11")
VM_UUID = "6f1c2a58-2d4e-4f0b-9a63-0c2b5e7d9a10"
GPU = PciAddress.parse("0000:41:00.0")
AUDIO = PciAddress.parse("0000:41:00.1")
VF = PciAddress.parse("0000:41:00.4")
NIC_VF = PciAddress.parse("0000:5e:02.1")
HOST_CPUS = frozenset(range(16))

# The device mixes every template is combined with. display='on' needs graphics, so the headless
# templates get vGPUs without display.
def _mixes(template: str) -> dict[str, dict[str, Any]]:
    display = template == "vdi"
    return {
        "plain": {},
        "mdev": {"mdevs": [MdevHostdev(U1, display=display, ramfb=display)]},
        "mdev-multi": {"mdevs": [MdevHostdev(U1, display=display, ramfb=display),
                                 MdevHostdev(U2, display=display), MdevHostdev(U3)]},
        "passthrough": {"pci": [PciHostdev(GPU, rom_bar=True, rom_file="/usr/share/vgpuvirt/gpu.rom"),
                                PciHostdev(AUDIO)]},
        "vgpu-vf": {"pci": [PciHostdev.vgpu_vf(VF)]},
        "nic-vf": {"nics": [HostdevInterface(NIC_VF, mac=MacAddress.parse("52:54:00:aa:bb:01"), vlan=42)]},
        "mixed": {"mdevs": [MdevHostdev(U1, display=display)],
                  "pci": [PciHostdev.vgpu_vf(VF, guest_address=GuestAddress(PciAddress(0, 0, 0x11, 0)))],
                  "nics": [HostdevInterface(NIC_VF, mac=MacAddress.parse("52:54:00:aa:bb:02"), managed=False,
                                            guest_address=GuestAddress(PciAddress(0, 0, 0x12, 0)))]},
    }


# Per-template settings, chosen so that together they set every option at least once.
_TEMPLATE_KW: dict[str, dict[str, Any]] = {
    "vdi": {"memory_mib": 8192, "vcpus": 4, "disk": Disk("/var/lib/libvirt/images/vdi.qcow2"),
            "options": DomainOptions(secure_boot=True, tpm=True, graphics="spice", graphics_listen="0.0.0.0")},
    "gaming": {"memory_mib": 16384, "vcpus": 8, "host_cpus": HOST_CPUS,
               "cpu_pinning": CpuPinning.from_cpulist("8-15", emulator="0-1"),
               "disk": Disk("/dev/vg0/gaming", format="raw", target="vdb"),
               "options": DomainOptions(kvm_hidden=True, hyperv_vendor_id="vgpuvirt0001", threads_per_core=2,
                                        disable_arch_capabilities=True, virtio_input=True,
                                        evdev=(EvdevInput("/dev/input/by-id/usb-kbd-event-kbd"),
                                               EvdevInput("/dev/input/by-id/usb-mouse-event-mouse", grab_all=False)),
                                        virtio_nics=(VirtioNic("bridge", "br0", MacAddress.parse("52:54:00:00:00:07")),
                                                     ))},
    "compute": {"memory_mib": 262144, "vcpus": 32, "numa_node": 1,
                "options": DomainOptions(numa_mode="preferred", hyperv=False, machine="pc-q35-7.2")},
}


def cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """``{case_name: (template, build_domain kwargs)}`` for every template x device mix."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for template in ("vdi", "gaming", "compute"):
        for mix, devs in _mixes(template).items():
            kw = {"name": f"xml-{template}-{mix}", "uuid": VM_UUID, **_TEMPLATE_KW[template], **devs}
            out[f"{template}-{mix}"] = (template, kw)
    # Option variants the per-template settings above do not reach.
    out["vdi-vnc-plain-cpu"] = ("vdi", {
        "name": "xml-vdi-vnc", "uuid": VM_UUID, "memory_mib": 2048, "vcpus": 2, "validate": True,
        "mdevs": [MdevHostdev(U1, display=True, guest_address=GuestAddress(PciAddress(0, 0, 0x0A, 0)))],
        "pci": [PciHostdev(GPU, managed=False, rom_bar=False, boot_order=1,
                           guest_address=GuestAddress(PciAddress(0, 0, 0x0B, 0), multifunction=True)),
                PciHostdev(AUDIO, managed=False, guest_address=GuestAddress(PciAddress(0, 0, 0x0B, 1)))],
        # an interface hostdev with all it can carry (issue 16: model, boot order, driver queues, virtualport)
        "nics": [HostdevInterface(NIC_VF, mac=MacAddress.parse("52:54:00:aa:bb:03"), model="virtio", boot_order=2,
                                  queues=4, virtualport=Virtualport("802.1Qbh", (("profileid", "vdi-port"),)))],
        "options": DomainOptions(graphics="vnc", hyperv=True, host_passthrough=False, hugepages=True,
                                 virtio_input=False, virtio_nics=(VirtioNic("user"),))})
    out["gaming-pc-machine"] = ("gaming", {
        "name": "xml-gaming-pc", "uuid": VM_UUID, "memory_mib": 8192, "vcpus": 4,
        "pci": [PciHostdev(GPU), PciHostdev(AUDIO)],
        "nics": [HostdevInterface(NIC_VF, driver="vfio",
                                  virtualport=Virtualport("802.1Qbg", (("managerid", "11"), ("typeid", "1193047"),
                                                                       ("typeidversion", "2"))))],
        "options": DomainOptions(machine="pc", secure_boot=False, hugepages=False, host_passthrough=True,
                                 graphics="none", virtio_nics=())})
    # a failover pair (issue 26): NIC VFs whose teaming names a persistent virtio partner, and a function
    # assigned but unseen by the guest
    out["compute-failover"] = ("compute", {
        "name": "xml-compute-failover", "uuid": VM_UUID, "memory_mib": 4096, "vcpus": 2,
        "pci": [PciHostdev(NIC_VF, teaming="ua-backup0"), PciHostdev(AUDIO, unassigned=True)],
        "nics": [HostdevInterface(PciAddress.parse("0000:5e:02.2"), mac=MacAddress.parse("52:54:00:aa:bb:05"),
                                  teaming="ua-backup1")],
        "options": DomainOptions(virtio_nics=(
            VirtioNic("user", mac=MacAddress.parse("52:54:00:aa:bb:04"), alias="ua-backup0", teaming=True),
            VirtioNic("user", mac=MacAddress.parse("52:54:00:aa:bb:05"), alias="ua-backup1", teaming=True)))})
    return out


@cache
def _test_conn() -> Any:
    try:
        import libvirt
    except ImportError:
        require_part("libvirt-python", False, "pip install 'vgpuvirt[libvirt]' (needs libvirt-dev)")
        raise
    libvirt.registerErrorHandler(lambda *_a: None, None)  # errors come back as exceptions; keep stderr quiet
    return libvirt.open("test:///default")


def check_create(xml: str) -> Domain:
    """Validate ``xml`` with libvirt's RelaxNG schema, then define it on ``test:///default`` (libvirt's parser).

    libvirt's own formatting of the result must still show the same GPU devices.
    """
    validate(xml)
    conn = _test_conn()
    virdom = conn.defineXML(xml)
    try:
        back = Domain.from_xml(virdom.XMLDesc(0))
    finally:
        virdom.undefine()
    mine = Domain.from_xml(xml)
    assert back.gpu_devices() == mine.gpu_devices()
    return back


def build_case(name: str) -> Domain:
    template, kw = cases()[name]
    return build_domain(template, **kw)


def non_default_fields(obj: object, seen: set[tuple[str, str]]) -> None:
    """Record ``(Class, field)`` for every dataclass field set to a non-default value, recursively."""
    if isinstance(obj, (list, tuple)):
        for item in obj:
            non_default_fields(item, seen)
        return
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING  # required: always exercised
        if value != default:
            seen.add((type(obj).__name__, f.name))
        non_default_fields(value, seen)
