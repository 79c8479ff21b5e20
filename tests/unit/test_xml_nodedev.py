"""Node-device XML as libvirt prints it (hostdata/nodedev_xml.txt), parsed into normalized values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vgpuvirt.errors import XmlError
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.xml import parse_nodedev, parse_nodedevs

HOSTDATA = Path(__file__).resolve().parents[1] / "fixtures" / "hostdata" / "nodedev_xml.txt"

# Section 1 of hostdata/nodedev_xml.txt (REAL, P100), kept here so the test does not depend on that file.
P100 = """<device>
  <name>pci_0000_3b_00_0</name>
  <path>/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0</path>
  <parent>pci_0000_3a_00_0</parent>
  <driver><name>nvidia</name></driver>
  <capability type='pci'>
    <class>0x030200</class><domain>0</domain><bus>59</bus><slot>0</slot><function>0</function>
    <product id='0x15f8'>GP100GL [Tesla P100 PCIe 16GB]</product>
    <vendor id='0x10de'>NVIDIA Corporation</vendor>
    <capability type='mdev_types'>
      <type id='nvidia-88'><name>GRID P100-1A</name><deviceAPI>vfio-pci</deviceAPI>
        <availableInstances>0</availableInstances></type>
      <type id='nvidia-294'><name>GRID P100-8C</name><deviceAPI>vfio-pci</deviceAPI>
        <availableInstances>0</availableInstances></type>
    </capability>
    <iommuGroup number='35'>
      <address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/>
      <address domain='0x0000' bus='0x3a' slot='0x00' function='0x0'/>
    </iommuGroup>
    <numa node='0'/>
  </capability>
</device>"""


def test_p100_with_mdev_types() -> None:
    d = parse_nodedev(P100)
    assert d.address == PciAddress.parse("0000:3b:00.0")  # <bus>59</bus> is decimal
    assert (d.vendor_id, d.product_id, d.pci_class) == (0x10DE, 0x15F8, 0x030200)
    assert d.driver == "nvidia" and d.numa_node == 0 and d.iommu_group == 35
    assert d.iommu_group_members == (PciAddress.parse("3b:00.0"), PciAddress.parse("3a:00.0"))
    assert [t.type_id for t in d.mdev_types] == [MdevTypeId("nvidia-88"), MdevTypeId("nvidia-294")]
    assert d.mdev_types[1].name == "GRID P100-8C" and d.mdev_types[1].available_instances == 0
    assert d.name == "pci_0000_3b_00_0"


def test_sriov_pf_and_vf() -> None:
    pf = parse_nodedev("""<device><name>pci_0000_41_00_0</name><capability type='pci'>
        <domain>0</domain><bus>65</bus><slot>0</slot><function>0</function><product id='0x2236'/>
        <vendor id='0x10de'/><capability type='virt_functions' maxCount='32'>
        <address domain='0x0000' bus='0x41' slot='0x00' function='0x4'/>
        <address domain='0x0000' bus='0x41' slot='0x00' function='0x5'/></capability></capability></device>""")
    assert pf.max_vfs == 32 and pf.vfs == (PciAddress.parse("41:00.4"), PciAddress.parse("41:00.5"))
    assert pf.numa_node is None  # omitted when the kernel says -1
    vf = parse_nodedev("""<device><name>pci_0000_41_00_4</name><capability type='pci'>
        <domain>0</domain><bus>65</bus><slot>0</slot><function>4</function>
        <capability type='phys_function'><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/>
        </capability></capability></device>""")
    assert vf.phys_function == PciAddress.parse("41:00.0") and "phys_function" in vf.capabilities


def test_modern_mdev_node() -> None:
    # Modern (mdevctl-backed) form; its full shape is INFERRED in hostdata, the name format is REAL.
    d = parse_nodedev("""<device><name>mdev_e55bf865_6983_4d53_967f_51e8a3bb0f57_0000_3b_00_0</name>
        <parent>pci_0000_3b_00_0</parent><driver><name>nvidia-vgpu-vfio</name></driver>
        <capability type='mdev'><type id='nvidia-294'/><uuid>e55bf865-6983-4d53-967f-51e8a3bb0f57</uuid>
        <parent_addr>0000:3b:00.0</parent_addr><iommuGroup number='151'/></capability></device>""")
    assert d.mdev_type == "nvidia-294"
    assert d.mdev_uuid == MdevUuid("e55bf865-6983-4d53-967f-51e8a3bb0f57")
    assert d.mdev_parent == PciAddress.parse("3b:00.0") and d.iommu_group == 151


def test_hostdata_file_all_devices() -> None:
    # The notes file has comments containing '--', which XML forbids; strip them first.
    text = re.sub(r"<!--.*?-->", "", HOSTDATA.read_text(), flags=re.S)
    devs = parse_nodedevs(text)
    assert [d.name for d in devs] == ["pci_0000_3b_00_0", "pci_0000_41_00_0",
                                      "mdev_4b20d080_1b54_4048_85b3_a6a62d165c01"]
    assert len(devs[0].mdev_types) == 4 and devs[1].max_vfs == 32 and devs[1].iommu_group == 44
    # old naming (libvirt < 7.8) has no <uuid>: it is taken from the name
    assert devs[2].mdev_uuid == MdevUuid("4b20d080-1b54-4048-85b3-a6a62d165c01")


def test_bad_nodedev() -> None:
    with pytest.raises(XmlError, match="node-device"):
        parse_nodedev("<domain/>")
    with pytest.raises(XmlError, match="well-formed"):
        parse_nodedevs("<device>")
    with pytest.raises(XmlError, match="pci_x"):
        parse_nodedev("<device><name>pci_x</name><capability type='pci'><bus>999</bus></capability></device>")


def test_one_bad_device_is_reported_and_the_others_are_read() -> None:
    good = "<device><name>pci_0000_3b_00_0</name><capability type='pci'><domain>0</domain><bus>59</bus>" \
           "<slot>0</slot><function>0</function></capability></device>"
    bad = "<device><name>pci_odd</name><capability type='pci'><bus>999</bus></capability></device>"
    devs = parse_nodedevs(good + bad + good.replace("59", "60").replace("3b", "3c"))
    assert [d.name for d in devs] == ["pci_0000_3b_00_0", "pci_0000_3c_00_0"]
    assert len(devs.errors) == 1 and "pci_odd" in devs.errors[0] and "999" in devs.errors[0]


def test_test_driver_node_files_and_odd_type_ids() -> None:
    # a test-driver node file holds node devices beside domains (whose own <device> children are no nodes);
    # libvirt accepts any type id (its own tests use foo1): read as written, typed only when driver-name
    text = ("<node><domain type='test'><name>d</name><devices><device>1</device></devices></domain>"
            "<device><name>pci_0000_02_10_7</name><capability type='pci'><domain>0</domain><bus>2</bus>"
            "<slot>16</slot><function>7</function><capability type='mdev_types'>"
            "<type id='foo1'><deviceAPI>vfio-pci</deviceAPI><availableInstances>1</availableInstances></type>"
            "<type id='i915-GVTg_V5_4'><deviceAPI>vfio-pci</deviceAPI><availableInstances>2</availableInstances>"
            "</type><type id='bad id'><deviceAPI>vfio-pci</deviceAPI></type></capability></capability></device>"
            "</node>")
    (dev,) = parse_nodedevs(text)
    assert [t.id for t in dev.mdev_types] == ["foo1", "i915-GVTg_V5_4"]
    assert [t.type_id for t in dev.mdev_types] == [None, MdevTypeId("i915-GVTg_V5_4")]
    assert [t.available_instances for t in dev.mdev_types] == [1, 2]
    # an id no libvirt writes (a space in it) is still left out, and named
    assert any("'bad id'" in e and "left out" in e for e in parse_nodedevs(text).errors)
    with pytest.raises(XmlError, match="bad id"):
        parse_nodedev(text[text.index("<device><name>pci"):text.index("</node>")])


def test_mdev_types_under_css_and_ap_parents_and_a_ccw_parent_address() -> None:
    css = ("<device><name>css_0_0_fffe</name><parent>computer</parent><capability type='css'><cssid>0x0</cssid>"
           "<ssid>0x0</ssid><devno>0xfffe</devno><capability type='mdev_types'><type id='vfio_ccw-io'>"
           "<name>I/O subchannel</name><deviceAPI>vfio-ccw</deviceAPI><availableInstances>1</availableInstances>"
           "</type></capability></capability></device>")
    mdev = ("<device><name>mdev_c60cc60c_c60c_c60c_c60c_c60cc60cc60c_0_0_0052</name><capability type='mdev'>"
            "<type id='vfio_ccw-io'/><uuid>c60cc60c-c60c-c60c-c60c-c60cc60cc60c</uuid>"
            "<parent_addr>0.0.0052</parent_addr><iommuGroup number='4'/></capability></device>")
    devs = parse_nodedevs(css + mdev)
    assert devs.errors == []
    assert [(str(t.id), t.device_api) for t in devs[0].mdev_types] == [("vfio_ccw-io", "vfio-ccw")]
    assert devs[1].mdev_parent is None and devs[1].mdev_parent_addr == "0.0.0052"
    assert str(devs[1].mdev_uuid) == "c60cc60c-c60c-c60c-c60c-c60cc60cc60c"
