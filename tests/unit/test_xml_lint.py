"""Each lint rule fires on the problem it names, names the device, and stays quiet on a clean domain."""

from __future__ import annotations

import pytest
from xmlcheck import U1, U2, build_case

from vgpuvirt.errors import XmlError
from vgpuvirt.xml import Domain, check, lint

DEV_U1 = f"<source><address uuid='{U1}'/></source>"
DEV_U2 = f"<source><address uuid='{U2}'/></source>"
PCI41 = "<source><address domain='0' bus='0x41' slot='0' function='0'/></source>"


def _dom(devices: str, extra: str = "", os_boot: str = "") -> Domain:
    return Domain.from_xml(f"<domain type='kvm'><name>lint</name><memory>1048576</memory><vcpu>2</vcpu>{extra}"
                           f"<os><type>hvm</type>{os_boot}</os><devices>{devices}</devices></domain>")


def _mdev(attrs: str, inner: str = "", src: str = DEV_U1) -> str:
    return f"<hostdev mode='subsystem' type='mdev' model='vfio-pci' {attrs}>{src}{inner}</hostdev>"


CASES = {
    "ramfb-multiple": (_mdev("display='on' ramfb='on'") + _mdev("display='on' ramfb='on'", src=DEV_U2)
                       + "<graphics type='vnc'/>", f"mdev {U1}, mdev {U2}"),
    "ramfb-without-display": (_mdev("ramfb='on'"), f"mdev {U1}"),
    "display-without-graphics": (_mdev("display='on'"), f"mdev {U1}"),
    "display-model": ("<hostdev mode='subsystem' type='mdev' model='vfio-ap' display='off'>" + DEV_U1
                      + "</hostdev>", f"mdev {U1}"),
    "boot-order-mdev": (_mdev("", "<boot order='1'/>"), f"mdev {U1}"),
    "rom-on-mdev": (_mdev("", "<rom bar='off'/>"), f"mdev {U1}"),
    "duplicate-hostdev": ("<hostdev mode='subsystem' type='pci'>" + PCI41 + "</hostdev>"
                          "<interface type='hostdev'><source><address type='pci' domain='0x0000' bus='0x41' "
                          "slot='0x00' function='0x0'/></source></interface>", "NIC VF 0000:41:00.0"),
    "duplicate-guest-address": (_mdev("", "<address type='pci' bus='0' slot='7' function='0'/>")
                                + _mdev("", "<address type='pci' bus='0' slot='0x07' function='0'/>", src=DEV_U2),
                                f"mdev {U1}, mdev {U2}"),
    "multifunction-incomplete": ("<hostdev mode='subsystem' type='pci'>" + PCI41
                                 + "<address type='pci' bus='1' slot='0' function='1'/></hostdev>",
                                 "PCI hostdev 0000:41:00.0"),
    "bad-mac": ("<interface type='network'><mac address='52:54:00:zz:00:01'/></interface>",
                "interface 52:54:00:zz:00:01"),
    # issue 16: what libvirt refuses for mdevs (its hostdev-mdev-invalid-target-address / -src-address-invalid)
    "mdev-address-type": (_mdev("", "<address type='drive' controller='0' bus='0' target='0' unit='1'/>"),
                          f"mdev {U1}"),
    "mdev-source": (_mdev("", src=PCI41), "mdev ?"),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_and_names_the_device(code: str) -> None:
    devices, label = CASES[code]
    problems = lint(_dom(devices))
    assert [p.code for p in problems] == [code], problems
    assert problems[0].device == label
    with pytest.raises(XmlError) as ei:
        check(_dom(devices))
    assert ei.value.problems == [str(problems[0])]


def test_multicast_mac() -> None:
    (p,) = lint(_dom("<interface type='hostdev'><mac address='01:00:5e:00:00:01'/></interface>"))
    assert p.code == "bad-mac" and "multicast" in p.message


def test_boot_order_mixed_with_os_boot() -> None:
    dom = _dom("<hostdev mode='subsystem' type='pci'>" + PCI41 + "<boot order='1'/></hostdev>",
               os_boot="<boot dev='hd'/>")
    assert [p.code for p in lint(dom)] == ["boot-order-mixed"]


def test_cpus_the_host_lacks() -> None:
    tune = "<cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='9'/><emulatorpin cpuset='0-1'/></cputune>"
    dom = _dom("", extra=tune)
    assert lint(dom) == []  # without the host's CPU set nothing can be said
    (p,) = lint(dom, host_cpus=frozenset(range(8)))
    assert p.code == "cpu-not-on-host" and p.device == "vcpupin vcpu 1" and "9" in p.message
    assert lint(_dom("", extra="<cputune><vcpupin vcpu='5' cpuset='1'/></cputune>"))[0].code == "vcpupin-range"


@pytest.mark.parametrize("case", ["vdi-mixed", "gaming-passthrough", "compute-mdev-multi"])
def test_built_domains_are_clean(case: str) -> None:
    assert lint(build_case(case), host_cpus=frozenset(range(16))) == []


def _chipset(machine: str, slot: str, functions: tuple[int, ...]) -> Domain:
    ctrls = "".join(f"<controller type='usb' index='{i}'><address type='pci' domain='0x0000' bus='0x00' "
                    f"slot='{slot}' function='{f:#x}'/></controller>" for i, f in enumerate(functions))
    return Domain.from_xml(f"<domain type='kvm'><name>lint</name><memory>1048576</memory><vcpu>1</vcpu>"
                           f"<os><type machine='{machine}'>hvm</type></os><devices>{ctrls}</devices></domain>")


@pytest.mark.parametrize("machine,slot", [("pc", "0x01"), ("pc-i440fx-8.2", "0x01"), ("q35", "0x1f"),
                                          ("pc-q35-7.2", "0x1f")])
def test_functions_beside_the_chipsets_own_function_0_are_fine(machine: str, slot: str) -> None:
    # libvirt's dumpxml puts IDE/USB at 00:01.1/.2 (i440fx) and SATA at 00:1f.2 (q35): function 0 is the
    # built-in ISA/LPC bridge, which the XML never lists
    assert lint(_chipset(machine, slot, (1, 2))) == []


@pytest.mark.parametrize("machine,slot", [("pc", "0x1f"), ("q35", "0x01"), ("pc", "0x03")])
def test_other_slots_still_need_function_0(machine: str, slot: str) -> None:
    assert [p.code for p in lint(_chipset(machine, slot, (1, 2)))] == ["multifunction-incomplete"]


def test_usb_hostdevs_with_the_same_bus_and_device_numbers_are_no_duplicate_pci_devices() -> None:
    usb = ("<hostdev mode='subsystem' type='usb' managed='yes'><source><vendor id='0x03f0'/>"
           "<product id='0x7e04'/><address bus='1' device='{}'/></source></hostdev>")
    assert lint(_dom(usb.format(20) + usb.format(21))) == []
