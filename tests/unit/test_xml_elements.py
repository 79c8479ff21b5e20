"""Each element class: fixed output, parse what it builds (equal values), normalization of libvirt's spellings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree
from xmlcheck import GPU, U1, VF

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MacAddress, MdevUuid, PciAddress
from vgpuvirt.xml import (
    CpuPinning,
    Disk,
    EvdevInput,
    Graphics,
    GuestAddress,
    HostdevInterface,
    MdevHostdev,
    PciHostdev,
    Tpm,
    VirtioNic,
    Virtualport,
    device_from_element,
    device_xml,
)


def _s(el: etree._Element) -> str:
    return etree.tostring(el, encoding="unicode")


def test_mdev_hostdev_output_is_fixed() -> None:
    dev = MdevHostdev(U1, display=True, ramfb=True, guest_address=GuestAddress(PciAddress(0, 9, 0, 0)))
    assert _s(dev.to_element()) == (
        '<hostdev mode="subsystem" type="mdev" managed="no" model="vfio-pci" display="on" ramfb="on">'
        '<source><address uuid="e55bf865-6983-4d53-967f-51e8a3bb0f57"/></source>'
        '<address type="pci" domain="0x0000" bus="0x09" slot="0x00" function="0x0"/></hostdev>')


def test_pci_hostdev_output_is_fixed() -> None:
    dev = PciHostdev(GPU, rom_bar=False, rom_file="/r.rom",
                     guest_address=GuestAddress(PciAddress(0, 1, 0, 0), multifunction=True))
    assert _s(dev.to_element()) == (
        '<hostdev mode="subsystem" type="pci" managed="yes"><driver name="vfio"/>'
        '<source><address domain="0x0000" bus="0x41" slot="0x00" function="0x0"/></source>'
        '<rom bar="off" file="/r.rom"/>'
        '<address type="pci" domain="0x0000" bus="0x01" slot="0x00" function="0x0" multifunction="on"/></hostdev>')


def test_hostdev_interface_output_is_fixed() -> None:
    dev = HostdevInterface(VF, mac=MacAddress.parse("52:54:00:AA:BB:01"), vlan=42)
    assert _s(dev.to_element()) == (
        '<interface type="hostdev" managed="yes"><mac address="52:54:00:aa:bb:01"/>'
        '<source><address type="pci" domain="0x0000" bus="0x41" slot="0x00" function="0x4"/></source>'
        '<vlan><tag id="42"/></vlan></interface>')


def test_real_p100_mdev_hostdev_parses() -> None:
    # hostdata/nodedev_xml.txt section 4 (REAL, P100 host)
    el = etree.fromstring(
        "<hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>"
        "<source><address uuid='E55BF865-6983-4D53-967F-51E8A3BB0F57'/></source>"
        "<address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/></hostdev>")
    dev = device_from_element(el)
    assert dev == MdevHostdev(U1, guest_address=GuestAddress(PciAddress(0, 0, 7, 0)))


def test_decimal_and_hex_spellings_normalize_to_equal_values() -> None:
    hexa = etree.fromstring("<hostdev mode='subsystem' type='pci' managed='yes'><source>"
                            "<address domain='0x0000' bus='0x41' slot='0x00' function='0x1'/></source></hostdev>")
    dec = etree.fromstring("<hostdev mode='subsystem' type='pci' managed='on'><source>"
                           "<address domain='0' bus='65' slot='0' function='1'/></source></hostdev>")
    assert PciHostdev.from_element(hexa) == PciHostdev.from_element(dec) == PciHostdev(PciAddress(0, 0x41, 0, 1))


@pytest.mark.parametrize("xml, err", [
    ("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source/></hostdev>", "source UUID"),
    ("<hostdev mode='subsystem' type='mdev' model='vfio-pci' display='maybe'>"
     "<source><address uuid='e55bf865-6983-4d53-967f-51e8a3bb0f57'/></source></hostdev>", "on/off"),
    ("<hostdev mode='subsystem' type='pci'><source><address bus='0x400' slot='0' function='0'/></source></hostdev>",
     "PCI"),
    ("<interface type='hostdev'><mac address='zz'/><source><address type='pci' bus='1' slot='0' function='0'/>"
     "</source></interface>", "MAC"),
])
def test_malformed_elements_raise_invalid_spec(xml: str, err: str) -> None:
    with pytest.raises(InvalidSpec, match=err):
        device_from_element(etree.fromstring(xml))


def test_other_devices_are_not_gpu_devices() -> None:
    assert device_from_element(etree.fromstring("<interface type='network'/>")) is None
    assert device_from_element(etree.fromstring("<hostdev mode='capabilities' type='storage'/>")) is None


def test_device_xml_is_the_element() -> None:
    dev = MdevHostdev(U1)
    assert device_from_element(etree.fromstring(device_xml(dev))) == dev


pci_addrs = st.builds(PciAddress, st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F),
                      st.integers(0, 7))
guest = st.none() | st.builds(GuestAddress, pci_addrs, st.booleans())
uuids = st.uuids().map(MdevUuid.parse)
macs = st.lists(st.integers(0, 255), min_size=6, max_size=6).map(
    lambda b: MacAddress(":".join(f"{x:02x}" for x in [b[0] & 0xFE, *b[1:]])))
boot = st.none() | st.integers(1, 100)


@given(st.builds(MdevHostdev, uuids, st.booleans(), st.booleans(), guest, boot, st.just("vfio-pci"))
       | st.builds(MdevHostdev, uuids, st.just(False), st.just(False), guest, boot,
                   st.sampled_from(["vfio-ccw", "vfio-ap"])))
def test_mdev_round_trip(dev: MdevHostdev) -> None:
    assert MdevHostdev.from_element(dev.to_element()) == dev


def test_non_pci_mdevs_carry_no_display_attribute() -> None:
    # libvirt supports display only on vfio-pci mdevs (and lints display='off' on a vfio-ccw one as an error)
    for model in ("vfio-ccw", "vfio-ap"):
        el = MdevHostdev(MdevUuid.parse("90c6c135-ad44-41d0-b1b7-bae47de48627"), model=model).to_element()
        assert el.get("display") is None and el.get("ramfb") is None
        with pytest.raises(InvalidSpec, match="only with model vfio-pci"):
            MdevHostdev(MdevUuid.parse("90c6c135-ad44-41d0-b1b7-bae47de48627"), display=True, model=model)
    assert MdevHostdev(MdevUuid.parse("90c6c135-ad44-41d0-b1b7-bae47de48627")).to_element().get("display") == "off"


@given(st.builds(PciHostdev, pci_addrs, st.booleans(), st.none() | st.booleans(),
                 st.none() | st.sampled_from(["/usr/share/rom/gpu.rom", "/a b.rom"]), guest, boot))
def test_pci_round_trip(dev: PciHostdev) -> None:
    assert PciHostdev.from_element(dev.to_element()) == dev


vports = st.none() | st.builds(Virtualport, st.just("802.1Qbh"), st.just((("profileid", "p1"),))) \
    | st.builds(Virtualport, st.just("802.1Qbg"),
                st.just((("managerid", "11"), ("typeid", "1193047"), ("typeidversion", "2"))))


@given(st.builds(HostdevInterface, pci_addrs, st.none() | macs, st.none() | st.integers(0, 4095), st.booleans(),
                 guest, st.none() | st.sampled_from(["virtio", "e1000e", "rtl8139"]), boot,
                 st.none(), st.none() | st.integers(1, 16), vports)
       | st.builds(HostdevInterface, pci_addrs, driver=st.just("vfio")))
def test_interface_round_trip(dev: HostdevInterface) -> None:
    assert HostdevInterface.from_element(dev.to_element()) == dev


@pytest.mark.parametrize("value", [
    Disk("/img/a.qcow2"), Disk("/dev/vg/x", format="raw", target="sdb"), Graphics(), Graphics("vnc", "::1"),
    Tpm(), Tpm("tpm-tis"), EvdevInput("/dev/input/event3"), EvdevInput("/dev/input/by-id/m", grab_all=False),
    VirtioNic(), VirtioNic("bridge", "br0", MacAddress("52:54:00:00:00:01")), VirtioNic("user"),
    CpuPinning((3, 1, 2), frozenset({0, 5})), CpuPinning((4,)),
])
def test_part_round_trip(value: Disk | Graphics | Tpm | EvdevInput | VirtioNic | CpuPinning) -> None:
    assert type(value).from_element(value.to_element()) == value


def test_cpu_pinning_from_cpulist() -> None:
    p = CpuPinning.from_cpulist("4-7", emulator="0-1,3")
    assert p.vcpu_cpus == (4, 5, 6, 7) and p.emulator_cpus == {0, 1, 3}
    assert _s(p.to_element()).endswith('<emulatorpin cpuset="0-1,3"/></cputune>')
    with pytest.raises(InvalidSpec):
        CpuPinning((1, 1))
    with pytest.raises(InvalidSpec):
        CpuPinning(())
    bad = etree.fromstring("<cputune><vcpupin vcpu='1' cpuset='3'/></cputune>")
    with pytest.raises(InvalidSpec, match="one entry per vCPU"):
        CpuPinning.from_element(bad)


def test_gvtg_hostdev_from_hostdata_section_c() -> None:
    # hostdata/gvtg_sysfs.txt section C: display + ramfb, no guest address
    el = etree.fromstring("<hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='on' "
                          "ramfb='on'><source><address uuid='fa9d3c62-1f4b-4c4a-a0a1-4dbf3d4f2b11'/></source>"
                          "</hostdev>")
    dev = MdevHostdev.from_element(el)
    assert dev == MdevHostdev(MdevUuid("fa9d3c62-1f4b-4c4a-a0a1-4dbf3d4f2b11"), display=True, ramfb=True)
    assert etree.tostring(dev.to_element(), method="c14n") == etree.tostring(el, method="c14n")
