"""Existing domains: list GPU devices, edit without losing anything, attach/detach XML."""

from __future__ import annotations

import pytest
from lxml import etree
from xmlcheck import GPU, U1, U2, VF, build_case, check_create

from vgpuvirt.errors import XmlError
from vgpuvirt.model import MacAddress, PciAddress
from vgpuvirt.xml import Domain, GuestAddress, HostdevInterface, MdevHostdev, PciHostdev, device_xml

# A domain as libvirt dumps it (KiB units, aliases, controllers, metadata, a qemu namespace element).
EXISTING = """<domain type='kvm' id='3' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>desk-007</name>
  <uuid>6f1c2a58-2d4e-4f0b-9a63-0c2b5e7d9a10</uuid>
  <metadata><vdi:pool xmlns:vdi='http://example.com/vdi'>floor-3</vdi:pool></metadata>
  <memory unit='KiB'>4194304</memory>
  <currentMemory unit='KiB'>4194304</currentMemory>
  <vcpu placement='static'>2</vcpu>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><boot dev='hd'/></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/img/d7.qcow2'/>
      <target dev='vda' bus='virtio'/></disk>
    <interface type='network'><mac address='52:54:00:11:22:33'/><source network='default'/>
      <model type='virtio'/></interface>
    <interface type='hostdev' managed='yes'><mac address='52:54:00:aa:bb:01'/>
      <source><address type='pci' domain='0x0000' bus='0x5e' slot='0x02' function='0x1'/></source>
      <vlan><tag id='42'/></vlan></interface>
    <graphics type='spice' autoport='yes'><listen type='address' address='127.0.0.1'/></graphics>
    <video><model type='none'/></video>
    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='on'>
      <source><address uuid='e55bf865-6983-4d53-967f-51e8a3bb0f57'/></source>
      <alias name='hostdev0'/>
      <address type='pci' domain='0x0000' bus='0x07' slot='0x00' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>
      <address type='pci' domain='0x0000' bus='0x08' slot='0x00' function='0x0'/>
    </hostdev>
    <memballoon model='virtio'/>
  </devices>
  <qemu:commandline><qemu:arg value='-no-hpet'/></qemu:commandline>
</domain>"""


def _c14n(el: etree._Element) -> bytes:
    return etree.tostring(el, method="c14n")


def test_lists_gpu_devices() -> None:
    dom = Domain.from_xml(EXISTING)
    gd = dom.gpu_devices()
    assert gd.mdev_uuids == [U1]
    assert gd.pci_addresses == [GPU]
    assert gd.interfaces == [PciAddress.parse("5e:02.1")]
    assert gd.to_dict() == {"mdev_uuids": [str(U1)], "pci_addresses": ["0000:41:00.0"],
                            "interfaces": ["0000:5e:02.1"]}
    assert dom.name == "desk-007" and dom.memory_mib == 4096 and dom.vcpus == 2


def test_edit_keeps_everything_else() -> None:
    dom = Domain.from_xml(EXISTING)
    before = Domain.from_xml(EXISTING)
    dom.add_device(MdevHostdev(U2))
    dom.remove_device(U2)
    assert _c14n(dom.root) == _c14n(before.root)
    dom.add_device(PciHostdev(PciAddress.parse("41:00.1")))
    dom.remove_device(GPU)
    xml = dom.to_xml()
    for kept in ("floor-3", "-no-hpet", "hostdev0", "/img/d7.qcow2", "52:54:00:11:22:33", "pc-q35-7.2"):
        assert kept in xml
    check_create(xml)
    assert Domain.from_xml(xml).gpu_devices().pci_addresses == [PciAddress.parse("41:00.1")]


def test_new_devices_go_where_libvirt_writes_them() -> None:
    dom = Domain.from_xml(EXISTING)
    dom.add_device(MdevHostdev(U2))
    dom.add_device(HostdevInterface(VF, mac=MacAddress.parse("52:54:00:aa:bb:09")))
    tags = [el.tag for el in dom.devices]
    assert tags.index("hostdev") > tags.index("video")
    assert tags[-1] == "memballoon"
    last_iface = max(i for i, t in enumerate(tags) if t == "interface")
    assert dom.devices[last_iface].find("mac").get("address") == "52:54:00:aa:bb:09"  # type: ignore[union-attr]
    assert last_iface < tags.index("graphics")


def test_attach_and_detach_xml() -> None:
    dom = Domain.from_xml(EXISTING)
    attach = device_xml(MdevHostdev(U2, guest_address=GuestAddress(PciAddress(0, 9, 0, 0))))
    assert "3131f5fd-7c04-4a61-92c1-0c37f9547b6b" in attach
    detach = dom.detach_xml(U1)
    assert "hostdev0" in detach and "bus=\"0x07\"" in detach  # the domain's own element, with its address
    assert PciAddress.parse("41:00.0") in Domain.from_xml(EXISTING).gpu_devices().pci_addresses
    # Both are valid device XML for libvirt: put them in a domain and let libvirt parse it.
    host = build_case("vdi-plain")
    host.devices.append(etree.fromstring(attach))
    check_create(host.to_xml())


def test_duplicates_and_missing_devices_are_errors() -> None:
    dom = Domain.from_xml(EXISTING)
    with pytest.raises(XmlError, match="already"):
        dom.add_device(MdevHostdev(U1, display=False))
    with pytest.raises(XmlError, match="no such device"):
        dom.remove_device(U2)
    with pytest.raises(XmlError, match="no such device"):
        dom.detach_xml(VF)


def test_not_a_domain_or_not_xml() -> None:
    with pytest.raises(XmlError, match="<domain>"):
        Domain.from_xml("<network/>")
    with pytest.raises(XmlError, match="well-formed"):
        Domain.from_xml("<domain>")


def test_entities_are_not_expanded() -> None:
    evil = ("<?xml version='1.0'?><!DOCTYPE d [<!ENTITY x SYSTEM 'file:///etc/passwd'>]>"
            "<domain><name>&x;</name></domain>")
    dom = Domain.from_xml(evil)
    assert "root:" not in dom.to_xml()


def test_copy_is_independent() -> None:
    dom = Domain.from_xml(EXISTING)
    other = dom.copy()
    other.remove_device(U1)
    assert dom.gpu_devices().mdev_uuids == [U1]
