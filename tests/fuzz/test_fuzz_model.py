"""Every validated value (vgpuvirt.model, the provisioning requests, the XML parts) against any input.

A value either constructs (and then renders to a form that parses back to itself) or is refused with a
one-line InvalidSpec; no other exception escapes. See tests/fuzz/fuzzkit.py for the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fuzzkit import anything, count, fuzz_settings, junk_text, refuses_cleanly
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
from vgpuvirt.provision.request import VgpuRequest, VmRequest, parse_resolution
from vgpuvirt.xml import CpuPinning, Disk, EvdevInput, Graphics, GuestAddress, Tpm, VirtioNic

N = 400

# (name, parse, render): render(parse(x)) must parse back to an equal value
VALUES: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("PciAddress", PciAddress.parse, str),
    ("MdevUuid", MdevUuid.parse, str),
    ("MdevTypeId", MdevTypeId.parse, str),
    ("VgpuTypeId", VgpuTypeId.parse, str),
    ("VfCount", VfCount.parse, str),
    ("DomainName", DomainName.parse, str),
    ("MacAddress", MacAddress.parse, str),
    ("DriverName", DriverName, lambda v: v.value),
    ("SysPath", SysPath, lambda v: v.value),
    ("GuestAddress", GuestAddress.parse, lambda v: v.pci),
    ("PciAddress.from_nvml", PciAddress.from_nvml, lambda v: v.nvml_bus_id),
]

# near-valid inputs: valid forms with one character changed, so the edges of each grammar are probed
SEEDS = ["0000:3b:00.0", "3b:00.7", "ffff:ff:1f.7", "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", "nvidia-231",
         "i915-GVTg_V5_4", "1155", "nvidia-1155", "65535", "vm-001", "52:54:00:12:34:56", "vfio-pci",
         "/sys/bus/pci/devices", "00000000:3B:00.0", "0-3,8,10-11"]


@st.composite
def near_valid(draw: st.DrawFn) -> str:
    s = draw(st.sampled_from(SEEDS))
    i = draw(st.integers(0, len(s)))
    mode = draw(st.sampled_from(["insert", "replace", "delete", "pad"]))
    c = draw(st.one_of(st.characters(), st.sampled_from(list("0123456789abcdefABCDEF:.-_ \n\t/\x00g"))))
    if mode == "insert":
        return s[:i] + c + s[i:]
    if mode == "replace":
        return s[:i] + c + s[i + 1:]
    if mode == "delete":
        return s[:i] + s[i + 1:]
    return c * draw(st.integers(1, 3)) + s + c * draw(st.integers(0, 2))


inputs = st.one_of(anything(), near_valid(), st.sampled_from(SEEDS))


@pytest.mark.parametrize(("name", "parse", "render"), VALUES, ids=[v[0] for v in VALUES])
def test_value_parses_or_refuses(name: str, parse: Callable[[Any], Any], render: Callable[[Any], Any]) -> None:
    @fuzz_settings(N)
    @given(x=inputs)
    def case(x: Any) -> None:
        count(f"model:{name}")
        v = refuses_cleanly(lambda: parse(x))
        if v is not None:
            again = parse(render(v))
            assert again == v, f"{name}: {x!r} -> {v!r} -> {render(v)!r} -> {again!r}"

    case()


@fuzz_settings(N)
@given(x=st.one_of(anything(), near_valid()))
def test_cpulist_parses_or_refuses(x: Any) -> None:
    count("model:parse_cpulist")
    cpus = refuses_cleanly(lambda: parse_cpulist(x))
    if cpus is not None:
        assert parse_cpulist(format_cpulist(cpus)) == cpus


@fuzz_settings(200)
@given(a=st.tuples(anything(8), anything(8), anything(8), anything(8)))
def test_pci_from_libvirt_parses_or_refuses(a: tuple[Any, Any, Any, Any]) -> None:
    count("model:PciAddress.from_libvirt")
    v = refuses_cleanly(lambda: PciAddress.from_libvirt(*a))
    if v is not None:
        assert PciAddress.from_libvirt(**v.libvirt_attrs()) == v


GPU_SPECS = ["nvidia-231", "GRID T4-2Q", "passthrough", "vf", "fb>=2G,series=Q", "fb>=2048,heads>=2",
             "res>=3840x2160", "mig=no", "vendor=nvidia", "mode=passthrough,boot_vga=yes", "series=q,fb>=1G"]


@st.composite
def gpu_spec(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(GPU_SPECS), junk_text(20),
                                    st.builds(lambda k, op, v: f"{k}{op}{v}",
                                              st.sampled_from(["fb", "heads", "res", "mig", "vendor", "series",
                                                               "mode", "boot_vga", "audio", "display", "x", ""]),
                                              st.sampled_from([">=", "=", "<=", "==", ">", ""]),
                                              junk_text(10))),
                          min_size=1, max_size=4))
    return ",".join(parts)


@fuzz_settings(N)
@given(text=st.one_of(gpu_spec(), junk_text()))
def test_vgpu_request_parse(text: str) -> None:
    count("request:VgpuRequest.parse")
    refuses_cleanly(lambda: VgpuRequest.parse(text))


@fuzz_settings(N)
@given(kw=st.fixed_dictionaries({}, optional={
    "type": anything(), "min_framebuffer_mib": anything(), "min_heads": anything(), "series": anything(),
    "min_resolution": anything(), "mig_backed": anything(), "vendor": anything(),
    "mode": st.one_of(st.sampled_from(["vgpu", "passthrough", "vf"]), anything())}))
def test_vgpu_request_fields(kw: dict[str, Any]) -> None:
    count("request:VgpuRequest")
    refuses_cleanly(lambda: VgpuRequest(**kw))


@fuzz_settings(N)
@given(name=st.one_of(st.sampled_from(["vm-1", "desk_2"]), anything()),
       kw=st.fixed_dictionaries({}, optional={
           "gpus": st.one_of(st.just(()), st.just((VgpuRequest(),)), anything()),
           "template": anything(), "memory_mib": anything(), "vcpus": anything(), "host_cpus": anything(),
           "numa_node": anything(), "numa_strict": anything(), "disk": anything(), "start": anything(),
           "host": anything()}))
def test_vm_request(name: Any, kw: dict[str, Any]) -> None:
    count("request:VmRequest")
    refuses_cleanly(lambda: VmRequest(name, **kw))


@fuzz_settings(200)
@given(prefix=anything(), n=anything())
def test_vm_request_pool(prefix: Any, n: Any) -> None:
    count("request:VmRequest.pool")
    vms = refuses_cleanly(lambda: VmRequest.pool(prefix, n) if isinstance(n, int) and n < 50 else
                          VmRequest.pool(prefix, n if not isinstance(n, int) else -1))
    assert vms is None or all(isinstance(v, VmRequest) for v in vms)


@fuzz_settings(200)
@given(x=anything())
def test_parse_resolution(x: Any) -> None:
    count("request:parse_resolution")
    r = refuses_cleanly(lambda: parse_resolution(x))
    assert r is None or (isinstance(r, tuple) and len(r) == 2)


PARTS: list[tuple[str, Callable[..., Any], Any]] = [
    ("Disk", lambda a, b: Disk(a, b), st.tuples(anything(), st.one_of(st.just("qcow2"), anything()))),
    ("Graphics", lambda a, b: Graphics(a, b), st.tuples(st.one_of(st.just("spice"), anything()),
                                                        st.one_of(st.just("127.0.0.1"), anything()))),
    ("Tpm", lambda a, b: Tpm(a), st.tuples(anything(), st.none())),
    ("EvdevInput", lambda a, b: EvdevInput(a, b), st.tuples(anything(), anything())),
    ("VirtioNic", lambda a, b: VirtioNic(a, b), st.tuples(anything(), anything())),
    ("CpuPinning.from_cpulist", lambda a, b: CpuPinning.from_cpulist(a, b),
     st.tuples(st.one_of(near_valid(), anything()), st.one_of(st.just(""), near_valid(), anything()))),
    ("CpuPinning", lambda a, b: CpuPinning(a, b),
     st.tuples(st.one_of(st.lists(st.integers(-2, 5000), max_size=4).map(tuple), anything()),
               st.one_of(st.frozensets(st.integers(-2, 5000), max_size=3), anything()))),
]


@pytest.mark.parametrize(("name", "make", "args"), PARTS, ids=[p[0] for p in PARTS])
def test_xml_part_constructs_or_refuses(name: str, make: Callable[..., Any], args: Any) -> None:
    @fuzz_settings(250)
    @given(ab=args)
    def case(ab: tuple[Any, Any]) -> None:
        count(f"xml-part:{name}")
        v = refuses_cleanly(lambda: make(*ab))
        if v is not None and hasattr(v, "to_element"):
            v.to_element()  # a value that constructed must also build

    case()


def test_invalid_spec_is_a_value_error() -> None:
    # the fuzz contract relies on it: API callers catch ValueError
    assert issubclass(InvalidSpec, ValueError)


# ---------------------------------------------------------------- issue 27: the shapes that got through

_LABEL = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-\u00e9", min_size=0, max_size=70)


@fuzz_settings(300)
@given(labels=st.lists(_LABEL, min_size=1, max_size=5), dot=st.booleans())
def test_ssh_host_names_are_resolvable_or_refused(labels: list[str], dot: bool) -> None:
    """A host name constructs only when the resolver can be asked about it (getaddrinfo's IDNA codec raised a
    UnicodeError traceback for an empty or over-long label)."""
    from vgpuvirt.host.ssh import SSHHost
    count("model:SSHHost hostname")
    name = ".".join(labels) + ("." if dot else "")
    h = refuses_cleanly(lambda: SSHHost(name))
    if h is not None:
        encoded = name.rstrip(".").encode("idna")       # what getaddrinfo does first: it must not raise
        assert all(0 < len(x) <= 63 for x in encoded.split(b"."))


_CONTROL = st.sampled_from(["\n", "\r", "\r\n", "\x00", "\x01", "\x1b", "\t", "\x7f", "\x0b", "\x0c", "\x85"])
TEXT_FIELDS: list[tuple[str, str, Callable[[str], Any]]] = [
    ("machine", "pc-q35-8.2", lambda v: _opts(machine=v)),
    ("hyperv_vendor_id", "vgpuvirt", lambda v: _opts(hyperv=True, hyperv_vendor_id=v)),
    ("VirtioNic.source", "default", lambda v: VirtioNic("network", v)),
    ("Disk.target", "vdb", lambda v: Disk("/var/lib/libvirt/images/a.qcow2", "qcow2", target=v)),
    ("rom_file", "/usr/share/vgabios.rom", lambda v: _hostdev(rom_file=v)),
]


def _opts(**kw: Any) -> Any:
    from vgpuvirt.xml.templates import DomainOptions
    return DomainOptions(**kw)


def _hostdev(**kw: Any) -> Any:
    from vgpuvirt.xml.hostdev import PciHostdev
    return PciHostdev(PciAddress.parse("0000:3b:00.0"), **kw).to_element()


@pytest.mark.parametrize(("name", "good", "make"), TEXT_FIELDS, ids=[f[0] for f in TEXT_FIELDS])
def test_a_control_character_anywhere_is_refused(name: str, good: str, make: Callable[[str], Any]) -> None:
    """A trailing newline (``$`` matched before it) or a control character (an lxml ValueError) is refused."""
    make(good)

    @fuzz_settings(150)
    @given(ch=_CONTROL, at=st.integers(0, len(good)))
    def case(ch: str, at: int) -> None:
        count(f"xml-part:{name} control character")
        value = good[:at] + ch + good[at:]
        if ch == "\x85" and name in ("rom_file",):
            return                      # NEL is printable Latin-1 in a path, and XML carries it
        with pytest.raises(InvalidSpec):
            make(value)

    case()
