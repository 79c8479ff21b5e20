"""build_domain over every template x device mix: schema-valid, accepted by libvirt, round-trips, refuses bad input."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from xmlcheck import (
    AUDIO,
    GPU,
    HOST_CPUS,
    U1,
    U2,
    VF,
    VM_UUID,
    build_case,
    cases,
    check_create,
    non_default_fields,
)

from vgpuvirt.errors import InvalidSpec, XmlError
from vgpuvirt.model import MacAddress, MdevUuid, PciAddress
from vgpuvirt.xml import (
    CpuPinning,
    Disk,
    Domain,
    DomainOptions,
    EvdevInput,
    Graphics,
    GuestAddress,
    HostdevInterface,
    MdevHostdev,
    PciHostdev,
    Tpm,
    VirtioNic,
    build_domain,
)

CASES = cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_is_accepted_by_libvirt_and_round_trips(case: str) -> None:
    _template, kw = CASES[case]
    dom = build_case(case)
    xml = dom.to_xml()
    check_create(xml)
    back = Domain.from_xml(xml)
    assert back.name == kw["name"]
    assert str(back.uuid) == VM_UUID
    assert back.memory_mib == kw["memory_mib"]
    assert back.vcpus == kw["vcpus"]
    devs = back.hostdevs()
    # What went in comes out, except that the builder may give a multi-function group its guest slot.
    want = [*kw.get("mdevs", []), *kw.get("pci", []), *kw.get("nics", [])]
    strip = [dataclasses.replace(d, guest_address=None) for d in devs]
    assert sorted(map(repr, strip)) == sorted(repr(dataclasses.replace(d, guest_address=None)) for d in want)
    for d in want:
        if d.guest_address is not None:
            assert d in devs
    if "cpu_pinning" in kw:
        assert back.cpu_pinning() == kw["cpu_pinning"]


def test_every_builder_field_is_exercised() -> None:
    """Like virt-manager's checkprops: a field no case sets is a field no test proves reaches libvirt."""
    seen: set[tuple[str, str]] = set()
    used_params: set[str] = set()
    for _template, kw in CASES.values():
        used_params.update(kw)
        for value in kw.values():
            non_default_fields(value, seen)
    # Fields whose only non-default values are invalid in a domain; the lint tests exercise them.
    invalid_only = {("MdevHostdev", "boot_order"), ("MdevHostdev", "model")}
    # Newer than the libvirt here (9.0: its schema and parser refuse them); test_peers_conformance compares
    # each with the XML libvirt's and virt-manager's own tests hold.
    invalid_only |= {("PciHostdev", "display"), ("PciHostdev", "ramfb"), ("PciHostdev", "iommufd"),
                     ("PciHostdev", "acpi_nodeset")}
    classes = (MdevHostdev, PciHostdev, HostdevInterface, GuestAddress, Disk, CpuPinning, EvdevInput, VirtioNic,
               DomainOptions)
    every = {(c.__name__, f.name) for c in classes for f in dataclasses.fields(c)}
    missing = every - seen - invalid_only
    assert not missing, f"fields never exercised by a build case: {sorted(missing)}"
    params = set(inspect.signature(build_domain).parameters) - {"template"}
    assert params - used_params == set(), f"build_domain parameters never used: {params - used_params}"


def test_graphics_and_tpm_classes_reach_libvirt() -> None:
    dom = build_case("vdi-plain")
    assert dom.graphics() == [Graphics("spice", "0.0.0.0")]
    assert Tpm.from_element(dom.devices.find("tpm")) == Tpm()  # type: ignore[arg-type]
    dom.set_tpm(Tpm("tpm-tis"))
    dom.set_graphics(Graphics("vnc"))
    back = check_create(dom.to_xml())
    assert Tpm.from_element(back.devices.find("tpm")).model == "tpm-tis"  # type: ignore[arg-type]
    assert [g.kind for g in back.graphics()] == ["vnc"]


def test_gpu_and_audio_share_one_guest_slot_behind_a_root_port() -> None:
    dom = build_case("gaming-passthrough")
    gpu, audio = dom.hostdevs()
    assert isinstance(gpu, PciHostdev) and isinstance(audio, PciHostdev)
    assert gpu.guest_address is not None and audio.guest_address is not None
    assert gpu.guest_address.multifunction and not audio.guest_address.multifunction
    assert gpu.guest_address.pci.device_slot == audio.guest_address.pci.device_slot
    assert (gpu.guest_address.pci.function, audio.guest_address.pci.function) == (0, 1)
    bus = gpu.guest_address.pci.bus
    ports = dom.devices.xpath(f"controller[@type='pci'][@model='pcie-root-port'][@index='{bus}']")
    assert len(ports) == 1


def test_pc_machine_uses_a_free_slot_on_bus_0() -> None:
    dom = build_case("gaming-pc-machine")
    addrs = [d.guest_address for d in dom.hostdevs() if isinstance(d, PciHostdev)]
    assert addrs == [GuestAddress(PciAddress(0, 0, 0x10, 0), True), GuestAddress(PciAddress(0, 0, 0x10, 1))]
    assert not dom.devices.xpath("controller[@model='pcie-root-port']")


def test_vgpu_vf_is_unmanaged_and_gets_a_vm_uuid() -> None:
    dom = build_domain("compute", name="vf", memory_mib=4096, vcpus=2, pci=[PciHostdev.vgpu_vf(VF)])
    (dev,) = dom.hostdevs()
    assert isinstance(dev, PciHostdev) and dev.managed is False
    assert dom.uuid is not None
    assert dom.root.find("devices/hostdev").get("managed") == "no"  # type: ignore[union-attr]
    check_create(dom.to_xml())
    plain = build_domain("compute", name="novf", memory_mib=4096, vcpus=2)
    assert plain.uuid is None


def test_nic_vf_is_a_hostdev_interface_with_mac_and_vlan() -> None:
    dom = build_case("compute-nic-vf")
    el = dom.root.find("devices/interface[@type='hostdev']")
    assert el is not None and el.get("managed") == "yes"
    assert el.find("mac").get("address") == "52:54:00:aa:bb:01"  # type: ignore[union-attr]
    assert el.find("vlan/tag").get("id") == "42"  # type: ignore[union-attr]


def test_headless_templates_have_no_emulated_display() -> None:
    for case in ("gaming-passthrough", "compute-mdev-multi"):
        dom = build_case(case)
        assert dom.devices.find("graphics") is None
        assert dom.devices.find("video/model").get("type") == "none"  # type: ignore[union-attr]


def test_vdi_has_uefi_secure_boot_tpm_hyperv() -> None:
    dom = build_case("vdi-mdev")
    r = dom.root
    assert r.find("os").get("firmware") == "efi"  # type: ignore[union-attr]
    assert r.find("os/firmware/feature[@name='secure-boot']").get("enabled") == "yes"  # type: ignore[union-attr]
    assert r.find("features/smm").get("state") == "on"  # type: ignore[union-attr]
    assert r.find("devices/tpm/backend").get("version") == "2.0"  # type: ignore[union-attr]
    assert r.find("features/hyperv/synic") is not None
    assert r.find("os/type").get("machine") == "q35"  # type: ignore[union-attr]
    assert r.find("devices/interface/model").get("type") == "virtio"  # type: ignore[union-attr]
    assert r.find("devices/disk/target").get("bus") == "virtio"  # type: ignore[union-attr]


def test_gaming_cpu_topology_pinning_hugepages_and_hiding() -> None:
    dom = build_case("gaming-passthrough")
    r = dom.root
    topo = r.find("cpu/topology")
    assert topo is not None and (topo.get("cores"), topo.get("threads")) == ("4", "2")
    assert r.find("cpu").get("mode") == "host-passthrough"  # type: ignore[union-attr]
    assert r.find("cpu/feature[@name='arch-capabilities']").get("policy") == "disable"  # type: ignore[union-attr]
    assert r.find("cputune/emulatorpin").get("cpuset") == "0-1"  # type: ignore[union-attr]
    assert [p.get("cpuset") for p in r.findall("cputune/vcpupin")] == [str(c) for c in range(8, 16)]
    assert r.find("memoryBacking/hugepages") is not None
    assert r.find("features/kvm/hidden").get("state") == "on"  # type: ignore[union-attr]
    assert r.find("features/hyperv/vendor_id").get("value") == "vgpuvirt0001"  # type: ignore[union-attr]
    assert len(r.findall("devices/input[@type='evdev']")) == 2


def test_compute_numatune_from_device_node() -> None:
    dom = build_case("compute-mdev-multi")
    mem = dom.root.find("numatune/memory")
    assert mem is not None and (mem.get("mode"), mem.get("nodeset")) == ("preferred", "1")
    assert dom.memory_mib == 262144


# -- refusals: raised before libvirt sees anything ------------------------------------------------------------
def _vdi(**kw: object) -> Domain:
    base: dict[str, object] = {"name": "bad", "memory_mib": 2048, "vcpus": 2}
    base.update(kw)
    return build_domain("vdi", **base)  # type: ignore[arg-type]


def test_two_ramfb_is_refused_naming_both_devices() -> None:
    with pytest.raises(XmlError) as ei:
        _vdi(mdevs=[MdevHostdev(U1, display=True, ramfb=True), MdevHostdev(U2, display=True, ramfb=True)])
    assert "ramfb-multiple" in str(ei.value) and str(U1) in str(ei.value) and str(U2) in str(ei.value)


def test_display_without_graphics_is_refused() -> None:
    with pytest.raises(XmlError, match=f"display-without-graphics: mdev {U1}"):
        _vdi(mdevs=[MdevHostdev(U1, display=True)], options=DomainOptions(graphics="none"))
    with pytest.raises(XmlError, match="display-without-graphics"):
        build_domain("gaming", name="g", memory_mib=2048, vcpus=2, mdevs=[MdevHostdev(U1, display=True)])


def test_bad_mac_is_refused_at_construction() -> None:
    with pytest.raises(InvalidSpec, match="MAC address"):
        HostdevInterface(VF, mac=MacAddress.parse("52:54:00:zz:00:01"))
    with pytest.raises(InvalidSpec, match="unicast"):
        HostdevInterface(VF, mac="01:00:5e:00:00:01")  # type: ignore[arg-type]


def test_unknown_template_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="one of vdi, gaming, compute"):
        _template_build("desktop")
    with pytest.raises(InvalidSpec, match="existing domain XML file"):
        _template_build(str(tmp_path / "missing.xml"))
    notdomain = tmp_path / "net.xml"
    notdomain.write_text("<network><name>x</name></network>")
    with pytest.raises(XmlError, match="expected <domain>"):
        _template_build(notdomain)


def _template_build(template: str | Path) -> Domain:
    return build_domain(template, name="t", memory_mib=1024, vcpus=1)


def test_cpu_list_the_host_lacks_is_refused() -> None:
    with pytest.raises(XmlError) as ei:
        _vdi(vcpus=2, cpu_pinning=CpuPinning.from_cpulist("14-15", emulator="0"), host_cpus=frozenset(range(8)))
    assert "cpu-not-on-host" in str(ei.value) and "14" in str(ei.value)
    _vdi(vcpus=2, cpu_pinning=CpuPinning.from_cpulist("6-7", emulator="0"), host_cpus=frozenset(range(8)))


def test_pinning_must_cover_every_vcpu() -> None:
    with pytest.raises(InvalidSpec, match="one host CPU per vCPU"):
        _vdi(vcpus=4, cpu_pinning=CpuPinning.from_cpulist("2-3"), host_cpus=HOST_CPUS)


def test_boot_order_on_mdev_and_duplicates_are_refused() -> None:
    with pytest.raises(XmlError, match="boot-order-mdev"):
        _vdi(mdevs=[MdevHostdev(U1, boot_order=1)])
    with pytest.raises(XmlError, match="already"):
        _vdi(mdevs=[MdevHostdev(U1), MdevHostdev(U1)])
    with pytest.raises(XmlError, match="already"):
        _vdi(pci=[PciHostdev(GPU)], nics=[HostdevInterface(GPU)])


@pytest.mark.parametrize("bad", [
    {"name": "-bad"}, {"name": "a b"}, {"memory_mib": 0}, {"vcpus": 0}, {"numa_node": -1},
    {"uuid": "not-a-uuid"}, {"mdevs": ["e55bf865-6983-4d53-967f-51e8a3bb0f57"]},
])
def test_bad_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        _vdi(**bad)


@pytest.mark.parametrize("bad", [
    {"graphics": "sdl"}, {"hyperv_vendor_id": "thirteen-char"}, {"hyperv_vendor_id": "a,b"},
    {"threads_per_core": 0}, {"machine": "q35; rm"},
])
def test_bad_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        DomainOptions(**bad)  # type: ignore[arg-type]


def test_topology_must_divide_vcpus() -> None:
    with pytest.raises(InvalidSpec, match="threads per core"):
        build_domain("gaming", name="g", memory_mib=2048, vcpus=3, options=DomainOptions(threads_per_core=2))


def test_user_template_keeps_what_the_builder_does_not_manage(tmp_path: Path) -> None:
    src = tmp_path / "mine.xml"
    src.write_text(
        "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>"
        "<name>tpl</name><uuid>11111111-2222-3333-4444-555555555555</uuid>"
        "<metadata><app:info xmlns:app='http://example.com/app'>keep me</app:info></metadata>"
        "<memory unit='KiB'>1048576</memory><vcpu>1</vcpu>"
        "<os><type arch='x86_64' machine='q35'>hvm</type></os>"
        "<devices><serial type='pty'/><graphics type='vnc'/></devices>"
        "<qemu:commandline><qemu:arg value='-no-hpet'/></qemu:commandline></domain>")
    dom = build_domain(src, name="mine", memory_mib=2048, vcpus=2, mdevs=[MdevHostdev(U1, display=True)])
    xml = dom.to_xml()
    check_create(xml)
    assert "keep me" in xml and "-no-hpet" in xml and "<serial" in xml
    assert dom.uuid is None  # the template's UUID is never copied into a VM
    again = build_domain(str(src), name="mine2", memory_mib=2048, vcpus=2)
    assert again.devices.find("hostdev") is None  # each build starts from a fresh copy
    assert isinstance(MdevUuid.parse(str(U1)), MdevUuid)


def test_evdev_and_nic_values_are_checked() -> None:
    with pytest.raises(InvalidSpec, match="/dev/input"):
        EvdevInput("/etc/passwd")
    with pytest.raises(InvalidSpec):
        VirtioNic("network", "bad name")
    with pytest.raises(InvalidSpec):
        Disk("relative.qcow2")
    with pytest.raises(InvalidSpec):
        PciHostdev(GPU, rom_file="gpu.rom")
    with pytest.raises(InvalidSpec):
        HostdevInterface(VF, vlan=4096)
    assert PciHostdev(AUDIO).address.function == 1


def test_multifunction_keeps_the_host_function_numbers() -> None:
    # issue 16: docs/xml.md promises the host's function numbers (GPU .0, USB-C controller .2 with .1 not
    # passed): the guest sees .0 and .2, not .0 and .1
    usb_c = PciAddress(GPU.domain, GPU.bus, GPU.slot, 2)
    dom = build_domain("gaming", name="fn-keep", memory_mib=2048, vcpus=2,
                       pci=[PciHostdev(usb_c), PciHostdev(GPU)])
    got = {d.address: d.guest_address for d in dom.hostdevs() if isinstance(d, PciHostdev)}
    assert got[GPU] is not None and got[usb_c] is not None
    assert (got[GPU].pci.function, got[GPU].multifunction) == (0, True)
    assert (got[usb_c].pci.function, got[usb_c].multifunction) == (2, False)
    assert got[GPU].pci.device_slot == got[usb_c].pci.device_slot


def test_functions_without_function_0_are_not_grouped() -> None:
    # a guest slot needs a function 0: without it each function gets its own slot from libvirt
    dom = build_domain("gaming", name="fn-no0", memory_mib=2048, vcpus=2, pci=[PciHostdev(AUDIO),
                       PciHostdev(PciAddress(GPU.domain, GPU.bus, GPU.slot, 2))])
    assert [d.guest_address for d in dom.hostdevs() if isinstance(d, PciHostdev)] == [None, None]


def test_a_failover_pair_survives_libvirts_parser() -> None:
    """teaming (both sides) and an unassigned address are read back from libvirt's own formatting."""
    dom = build_case("compute-failover")
    back = check_create(dom.to_xml())
    teams = sorted((type(d).__name__, getattr(d, "teaming", None) or "", getattr(d, "unassigned", False))
                   for d in back.hostdevs())
    assert teams == [("HostdevInterface", "ua-backup1", False), ("PciHostdev", "", True),
                     ("PciHostdev", "ua-backup0", False)]
    partners = [VirtioNic.from_element(el) for el in back.root.iterfind("devices/interface[@type='user']")]
    assert sorted((n.alias, n.teaming) for n in partners) == [("ua-backup0", True), ("ua-backup1", True)]
