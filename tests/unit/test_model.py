"""Validated values (vgpuvirt.model): every accepted form, every refusal, round trips."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import (
    DomainName,
    DriverName,
    MacAddress,
    MdevTypeId,
    MdevUuid,
    PciAddress,
    SysPath,
    VfCount,
    VgpuTypeId,
    format_cpulist,
    parse_cpulist,
)
from vgpuvirt.provision.request import VmRequest, parse_resolution
from vgpuvirt.xml import CpuPinning

pci = st.builds(PciAddress, st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))


# ---------------------------------------------------------------- PciAddress
@pytest.mark.parametrize("text", ["0000:3b:00.0", "3b:00.0", "0000:3B:00.0", "3B:00.0", " 0000:3b:00.0\n", "0:3b:0.0"])
def test_pci_forms_parse_to_one_value(text: str) -> None:
    a = PciAddress.parse(text)
    assert a == PciAddress(0, 0x3B, 0, 0)
    assert str(a) == "0000:3b:00.0"


def test_pci_renders_libvirt_nodedev_and_nvml_forms() -> None:
    a = PciAddress.parse("0001:AF:1f.7")
    assert a.libvirt_attrs() == {"domain": "0x0001", "bus": "0xaf", "slot": "0x1f", "function": "0x7"}
    assert a.nvml_bus_id == "00000001:AF:1F.7"
    assert PciAddress.from_nvml("00000001:AF:1F.7") == a
    assert PciAddress.from_libvirt("0x0001", "0xaf", "0x1f", "0x7") == a
    assert PciAddress.from_libvirt("1", "175", "31", "7") == a  # libvirt also accepts decimal
    assert a.device_slot == (1, 0xAF, 0x1F)
    assert PciAddress.parse(a) is a


@pytest.mark.parametrize("bad", [
    "", "3b:00", "3b.00.0", "3b:00.8", "zz:00.0", "3b:20.0", "0000:3b:00.0.0", "00000:3b:00.0x", "10000:3b:00.0",
    "0000:3b:00.0;reboot", "0000:3b:00.0 0000:3c:00.0", "../3b:00.0", "0000:3b:00.-1", "０000:3b:00.0",
])
def test_pci_bad_text_names_value_and_form(bad: str) -> None:
    with pytest.raises(InvalidSpec) as ei:
        PciAddress.parse(bad)
    assert repr(bad) in str(ei.value)
    assert ei.value.value == bad
    assert "0000:3b:00.0" in ei.value.expected or "0x" in ei.value.expected


@pytest.mark.parametrize("bad", [None, 0x3B00, b"0000:3b:00.0", ["0000:3b:00.0"]])
def test_pci_non_text_refused(bad: object) -> None:
    with pytest.raises(InvalidSpec):
        PciAddress.parse(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [(0x10000, 0, 0, 0), (0, 0x100, 0, 0), (0, 0, 0x20, 0), (0, 0, 0, 8),
                                  (-1, 0, 0, 0), (True, 0, 0, 0), (0, "3b", 0, 0)])
def test_pci_out_of_range_fields_refused(args: tuple[object, ...]) -> None:
    with pytest.raises(InvalidSpec):
        PciAddress(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [("0xg", "0", "0", "0"), ("0", "0x100", "0", "0"), ("", "0", "0", "0")])
def test_pci_bad_libvirt_attrs_refused(bad: tuple[str, str, str, str]) -> None:
    with pytest.raises(InvalidSpec):
        PciAddress.from_libvirt(*bad)


@pytest.mark.parametrize("bad", ["0000:3b:00.0", "00000000:3B:00", "x"])
def test_pci_bad_nvml_refused(bad: str) -> None:
    if bad == "0000:3b:00.0":  # 4-digit domains are valid NVML input too
        assert PciAddress.from_nvml(bad) == PciAddress(0, 0x3B, 0, 0)
        return
    with pytest.raises(InvalidSpec):
        PciAddress.from_nvml(bad)


@given(pci)
def test_pci_round_trips(a: PciAddress) -> None:
    assert PciAddress.parse(str(a)) == a
    assert PciAddress.parse(str(a).upper()) == a
    assert PciAddress.from_libvirt(**a.libvirt_attrs()) == a
    assert PciAddress.from_nvml(a.nvml_bus_id) == a
    if a.domain == 0:
        assert PciAddress.parse(str(a)[5:]) == a  # the short bb:ss.f form


@given(pci, pci)
def test_pci_order_is_numeric(a: PciAddress, b: PciAddress) -> None:
    assert (a < b) == ((a.domain, a.bus, a.slot, a.function) < (b.domain, b.bus, b.slot, b.function))


# ---------------------------------------------------------------- MdevUuid
def test_uuid_is_normalized_to_lower_case() -> None:
    u = MdevUuid.parse(" 83B8F4F2-509F-382F-3C1E-E6BFE0FA1001 ")
    assert str(u) == "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
    assert MdevUuid.parse(uuid.UUID(str(u))) == u
    assert MdevUuid.parse(u) is u
    assert MdevUuid.parse(str(MdevUuid.generate())) is not None


@pytest.mark.parametrize("bad", ["", "83b8f4f2509f382f3c1ee6bfe0fa1001", "83b8f4f2-509f-382f-3c1e-e6bfe0fa100",
                                 "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001x", "g3b8f4f2-509f-382f-3c1e-e6bfe0fa1001",
                                 "{83b8f4f2-509f-382f-3c1e-e6bfe0fa1001}", "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001;id",
                                 None, 12])
def test_uuid_bad_refused(bad: object) -> None:
    with pytest.raises(InvalidSpec) as ei:
        MdevUuid.parse(bad)  # type: ignore[arg-type]
    assert "8-4-4-4-12" in str(ei.value)


def test_uuid_constructor_wants_canonical_form() -> None:
    with pytest.raises(InvalidSpec):
        MdevUuid("83B8F4F2-509F-382F-3C1E-E6BFE0FA1001")


@given(st.uuids())
def test_uuid_round_trips(u: uuid.UUID) -> None:
    m = MdevUuid.parse(str(u).upper())
    assert str(m) == str(u)
    assert MdevUuid.parse(str(m)) == m


# ---------------------------------------------------------------- type ids, counts, names
@pytest.mark.parametrize(("text", "driver"), [
    ("nvidia-231", "nvidia"), ("i915-GVTg_V5_4", "i915"), (" nvidia-1155 ", "nvidia"),
    ("mtty-2", "mtty"), ("nvidia-A100-4C", "nvidia"),
])
def test_mdev_type_ids(text: str, driver: str) -> None:
    t = MdevTypeId.parse(text)
    assert str(t) == text.strip()
    assert t.driver == driver


@pytest.mark.parametrize("bad", ["", "nvidia", "-231", "nvidia-", "nvidia-..", "nvidia-a/b", "nvidia-1 2",
                                 "nvidia-$(id)", "../nvidia-1", "nvidia-" + "x" * 64, None])
def test_mdev_type_id_bad_refused(bad: object) -> None:
    with pytest.raises(InvalidSpec) as ei:
        MdevTypeId.parse(bad)  # type: ignore[arg-type]
    assert "nvidia-231" in str(ei.value)


@pytest.mark.parametrize(("value", "want"), [("1155", 1155), ("nvidia-1155", 1155), (1155, 1155), (" 7 ", 7)])
def test_vgpu_type_ids(value: object, want: int) -> None:
    assert VgpuTypeId.parse(value).value == want  # type: ignore[arg-type]
    assert str(VgpuTypeId.parse(value)) == str(want)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, "abc", "1155x", "", "0x483", 1.5, 2**31, "nvidia-"])
def test_vgpu_type_id_bad_refused(bad: object) -> None:
    with pytest.raises(InvalidSpec):
        VgpuTypeId.parse(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "want"), [("0", 0), ("16", 16), (65535, 65535), (" 4 ", 4)])
def test_vf_counts(value: object, want: int) -> None:
    c = VfCount.parse(value)  # type: ignore[arg-type]
    assert int(c) == want
    assert str(c) == str(want)


@pytest.mark.parametrize("bad", [-1, 65536, "65536", True, "1.5", "", "0x10", "4;reboot", 2.0])
def test_vf_count_bad_refused(bad: object) -> None:
    with pytest.raises(InvalidSpec) as ei:
        VfCount.parse(bad)  # type: ignore[arg-type]
    assert "0..65535" in str(ei.value)


@pytest.mark.parametrize("ok", ["win10-desk01", "vm_1", "a", "gpu.vm+2", "x" * 64])
def test_domain_names(ok: str) -> None:
    assert str(DomainName.parse(ok)) == ok


@pytest.mark.parametrize("bad", ["", "-vm", ".vm", "vm 1", "vm/1", "vm;id", "x" * 65, "vm\n", None])
def test_domain_name_bad_refused(bad: object) -> None:
    with pytest.raises(InvalidSpec):
        DomainName.parse(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "-x", "vfio pci", "a/b", "$(id)"])
def test_driver_name_bad_refused(bad: str) -> None:
    assert str(DriverName("vfio-pci")) == "vfio-pci"
    with pytest.raises(InvalidSpec):
        DriverName(bad)


def test_mac_addresses() -> None:
    assert str(MacAddress.parse(" 52:54:00:AB:cd:EF ")) == "52:54:00:ab:cd:ef"
    for bad in ("01:00:5e:00:00:01", "52:54:00:ab:cd", "52-54-00-ab-cd-ef", "52:54:00:ab:cd:eg", ""):
        with pytest.raises(InvalidSpec):
            MacAddress.parse(bad)


# ---------------------------------------------------------------- cpulists, paths
@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("", set()), ("5", {5}),
                                            ("0-1\n", {0, 1})])
def test_cpulists(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["3-1", "a", "1,,2", "1-", "-1", "0-3;8"])
def test_cpulist_bad_refused(bad: str) -> None:
    with pytest.raises(InvalidSpec):
        parse_cpulist(bad)


@given(st.sets(st.integers(0, 4095), max_size=64))
def test_cpulist_round_trips(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@pytest.mark.parametrize("bad", ["sys/bus", "/sys/../etc/shadow", "/sys/./bus", "/sys/bus/..", "/sys\0x", "/sys\nx",
                                 "", ".."])
def test_syspath_refuses_escapes(bad: str) -> None:
    with pytest.raises(InvalidSpec):
        SysPath(bad)


def test_syspath_accepts_globs_and_dotted_names() -> None:
    for ok in ("/", "/sys/bus/pci/devices/*/vendor", "/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types",
               "/sys/x/.hidden", "/sys/x/a..b"):
        assert str(SysPath(ok)) == ok


@pytest.mark.parametrize(("cls", "good"), [
    (MdevUuid, "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"), (MdevTypeId, "nvidia-231"), (DomainName, "vm1"),
    (DriverName, "vfio-pci"), (MacAddress, "52:54:00:12:34:56"),
])
def test_constructors_refuse_a_trailing_newline(cls: type, good: str) -> None:
    # `$` in a regex also matches before a final newline: "vm1\n" must not pass as a name written to a host
    assert str(cls(good)) == good
    with pytest.raises(InvalidSpec):
        cls(good + "\n")



@pytest.mark.parametrize("bad", [0, b"0-3", 1.5, ["0"]])
@pytest.mark.parametrize("call", [
    parse_cpulist,
    PciAddress.from_nvml,
    lambda v: PciAddress.from_libvirt("0x0000", "0x3b", v, "0x0"),
    parse_resolution,
    lambda v: VmRequest("vm1", host_cpus=v),
    lambda v: VmRequest("vm1", gpus=v),
    CpuPinning.from_cpulist,
    CpuPinning,
], ids=["parse_cpulist", "from_nvml", "from_libvirt", "parse_resolution", "VmRequest.host_cpus", "VmRequest.gpus",
        "CpuPinning.from_cpulist", "CpuPinning"])
def test_a_value_of_the_wrong_type_is_refused_as_invalid(call: Callable[[object], object], bad: object) -> None:
    # found by tests/fuzz: a number or None from YAML/JSON (Ansible, request files) gave AttributeError/TypeError
    with pytest.raises(InvalidSpec):
        call(bad)


def test_a_pci_address_formatted_once_still_compares_hashes_and_copies_by_its_fields() -> None:
    # str() is cached on the instance (placement formats the same addresses thousands of times): the cache
    # must not take part in equality, hashing, ordering, repr, asdict, replace or pickling
    import dataclasses
    import pickle
    a, b = PciAddress.parse("0000:3b:00.0"), PciAddress.parse("3b:00.0")
    assert str(a) == "0000:3b:00.0" and str(a) == str(a)
    assert a == b and hash(a) == hash(b) and not a < b and repr(a) == repr(b)
    assert dataclasses.asdict(a) == {"domain": 0, "bus": 0x3B, "slot": 0, "function": 0}
    c = dataclasses.replace(a, function=1)
    assert str(c) == "0000:3b:00.1"
    d = pickle.loads(pickle.dumps(a))
    assert d == b and str(d) == "0000:3b:00.0"
    assert {a: 1}[b] == 1
