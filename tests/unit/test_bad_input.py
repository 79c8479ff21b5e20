"""Bad input to every lifecycle entry point is refused with InvalidSpec before the host sees anything.

The host double records every call; each test asserts it recorded none."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lifecycle_doubles import RecordingHost

from vgpuvirt.change.driver import prepare_vfio
from vgpuvirt.change.mdev_service import MdevService
from vgpuvirt.change.sriov import set_vf_count
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VfCount, VgpuTypeId
from vgpuvirt.services.iommu import api as iommu
from vgpuvirt.services.iommu.api import BindingRecord
from vgpuvirt.services.pci.sriov import SriovService
from vgpuvirt.services.vgpu import gc
from vgpuvirt.services.vgpu.vendor import VendorVgpuService

GOOD_PCI = "0000:3b:00.0"
GOOD_UUID = "a1b2c3d4-0000-4000-8000-000000000001"
GOOD_TYPE = "nvidia-231"

INJECTIONS = [
    "; rm -rf /", "$(reboot)", "`id`", "| cat /etc/shadow", "&& halt", "\n", "x\0y", "../../etc/passwd",
    "..", "/", "'", '"', "0000:3b:00.0; reboot", "0000:3b:00.0\nrm", "nvidia-231 && reboot",
    "nvidia-231/../../x", "nvidia-..", "-rf", "--help", " ", "",
]


def _valid(parse: Callable[[Any], Any], value: Any) -> bool:
    try:
        parse(value)
    except InvalidSpec:
        return False
    except Exception:
        return False
    return True


def _refused(call: Callable[[RecordingHost], Any]) -> None:
    host = RecordingHost()
    with pytest.raises(InvalidSpec):
        call(host)
    assert host.calls == [], f"the host was called before validation: {host.calls}"


anything = st.one_of(st.text(max_size=40), st.sampled_from(INJECTIONS), st.integers(), st.none(),
                     st.floats(allow_nan=True), st.booleans(), st.binary(max_size=8))


# ---------------------------------------------------------------- addresses


@settings(max_examples=150, deadline=None)
@given(bad=anything)
def test_bad_pci_address_is_refused_everywhere(bad: Any) -> None:
    assume(bad is not None and not _valid(PciAddress.parse, bad))
    _refused(lambda h: MdevService(h).create(bad, GOOD_TYPE, GOOD_UUID))
    _refused(lambda h: MdevService(h).ensure(GOOD_UUID, bad, GOOD_TYPE))
    _refused(lambda h: VendorVgpuService(h).assign(1155, vf=bad))
    _refused(lambda h: VendorVgpuService(h).assign(1155, pf=bad))
    _refused(lambda h: VendorVgpuService(h).release(bad))
    _refused(lambda h: set_vf_count(h, bad, 4))
    _refused(lambda h: set_vf_count(h, bad, 0))
    _refused(lambda h: SriovService(h).report(bad))
    _refused(lambda h: iommu.check_assignable(h, [GOOD_PCI, bad]))
    _refused(lambda h: prepare_vfio(h, [bad]))
    _refused(lambda h: iommu.release(h, [bad]))


# ---------------------------------------------------------------- UUIDs


@settings(max_examples=150, deadline=None)
@given(bad=anything)
def test_bad_uuid_is_refused_everywhere(bad: Any) -> None:
    assume(bad is not None and not _valid(MdevUuid.parse, bad))
    _refused(lambda h: MdevService(h).create(GOOD_PCI, GOOD_TYPE, bad))
    _refused(lambda h: MdevService(h).remove(bad))
    _refused(lambda h: MdevService(h).ensure(bad, GOOD_PCI, GOOD_TYPE))
    _refused(lambda h: MdevService(h).ensure(bad, state="absent"))


@given(u=st.uuids())
def test_uuid_case_and_form_normalize(u: Any) -> None:
    # the kernel names devices %pUl: lower case; upper-case input must not create a second identity
    assert MdevUuid.parse(str(u).upper()) == MdevUuid.parse(str(u)) == MdevUuid.parse(u)


# ---------------------------------------------------------------- type ids


@settings(max_examples=150, deadline=None)
@given(bad=anything)
def test_bad_mdev_type_is_refused(bad: Any) -> None:
    assume(not _valid(MdevTypeId.parse, bad))
    _refused(lambda h: MdevService(h).create(GOOD_PCI, bad, GOOD_UUID))
    _refused(lambda h: MdevService(h).ensure(GOOD_UUID, GOOD_PCI, bad))


@settings(max_examples=150, deadline=None)
@given(bad=anything)
def test_bad_vgpu_type_is_refused(bad: Any) -> None:
    assume(not _valid(VgpuTypeId.parse, bad))
    _refused(lambda h: VendorVgpuService(h).assign(bad))
    _refused(lambda h: VendorVgpuService(h).assign(bad, vf="0000:3d:00.4"))


@pytest.mark.parametrize("bad", ["nvidia-231;reboot", "nvidia-231 x", "nvidia/231", "nvidia-..", "-nvidia",
                                 "nvidia-$(id)", "nvidia-`id`", "nvidia-231|x"])
def test_type_ids_with_shell_or_path_characters(bad: str) -> None:
    _refused(lambda h: MdevService(h).create(GOOD_PCI, bad))


# ---------------------------------------------------------------- VF counts


@settings(max_examples=150, deadline=None)
@given(bad=st.one_of(st.integers(max_value=-1), st.integers(min_value=VfCount.MAX + 1), st.floats(),
                     st.booleans(), st.sampled_from(["1e3", "0x10", "4;reboot", "-1", " ", "four", "$(x)"]),
                     st.text(max_size=8)))
def test_bad_vf_count_is_refused(bad: Any) -> None:
    assume(not _valid(VfCount.parse, bad))
    _refused(lambda h: set_vf_count(h, GOOD_PCI, bad))


# ---------------------------------------------------------------- everything else


@pytest.mark.parametrize("bad", ["transient;x", "", "PERSISTENT", "auto"])
def test_bad_persistence_is_refused(bad: str) -> None:
    _refused(lambda h: MdevService(h).create(GOOD_PCI, GOOD_TYPE, GOOD_UUID, persist=bad))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["present;x", "", "gone"])
def test_bad_state_is_refused(bad: str) -> None:
    _refused(lambda h: MdevService(h).ensure(GOOD_UUID, GOOD_PCI, GOOD_TYPE, state=bad))  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", [[], [""], ["mdevctl", ""]])
def test_bad_mdevctl_prefix_is_refused(prefix: list[str]) -> None:
    _refused(lambda h: MdevService(h, mdevctl=prefix))


@pytest.mark.parametrize("record", [
    {"bindings": [{"address": GOOD_PCI, "original_driver": "nvidia; reboot"}]},
    {"bindings": [{"address": GOOD_PCI, "original_driver": "../../x"}]},
    {"bindings": [{"address": GOOD_PCI, "original_driver": "snd_hda_intel", "original_override": "a b"}]},
    {"bindings": [{"address": "../x", "original_driver": "nvidia"}]},
    {"bindings": [{"original_driver": "nvidia"}]},
    {"nothing": []},
])
def test_bad_binding_record_is_refused(record: dict[str, Any]) -> None:
    _refused(lambda h: iommu.release(h, BindingRecord.from_dict(record)))


def test_empty_address_list_is_refused() -> None:
    _refused(lambda h: iommu.check_assignable(h, []))
    _refused(lambda h: prepare_vfio(h, []))


def test_malformed_domain_xml_stops_gc_before_reading() -> None:
    _refused(lambda h: gc.collect(h, [("vm1", "<domain><devices>")], dry_run=False))


def test_hostile_names_never_become_paths() -> None:
    # the validated values render only to characters that cannot leave a sysfs directory
    for v in (PciAddress.parse("3B:0.7"), MdevUuid.parse(GOOD_UUID.upper()), MdevTypeId.parse("i915-GVTg_V5_4")):
        assert re.fullmatch(r"[0-9A-Za-z:._-]+", str(v)) and ".." not in str(v)


# ---------------------------------------------------------------- bad input at the CLI and from the host
# Each is refused with one line on stderr and a non-zero exit, no traceback, nothing on stdout.


def _one_line_error(capsys: pytest.CaptureFixture[str], rc: int, fragment: str) -> None:
    out, err = capsys.readouterr()
    assert rc != 0
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("vgpuvirt: error: ") and "Traceback" not in err, err
    assert fragment in err, err


@pytest.mark.parametrize("disk", ["/var/lib/a\x01.qcow2", "/v\x1b[31m.img", "/v\x7f", "/v\udcff.img"])
def test_xml_build_disk_with_a_control_character(disk: str, capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.cli import main
    rc = main(["xml", "build", "--template", "vdi", "--name", "vm1", "--disk", disk])
    _one_line_error(capsys, rc, "invalid disk path")


def test_an_xml_attribute_lxml_refuses_is_invalid_input() -> None:
    from vgpuvirt.xml.element import make
    with pytest.raises(InvalidSpec, match="<source> file"):
        make("source", {"file": "/a\x02b"})


@pytest.mark.parametrize("words", ["mdevctl 'x", 'mdevctl "x', "mdevctl \\"])
def test_mdevctl_words_with_an_unbalanced_quote(words: str, capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.cli import main
    _one_line_error(capsys, main(["--host", "sim:t4x2", "mdev", "--mdevctl", words, "list", "--defined"]),
                    "invalid --mdevctl")


def _sim_file(tmp_path: Any, kind: str) -> str:
    import os
    p = tmp_path / f"profile-{kind}.yaml"
    if kind == "binary":
        p.write_bytes(b"\xf5\x00\xff\xfe" + os.urandom(64))
    elif kind == "huge":
        p.write_bytes(b"name: x\n" + b"#" * (2 << 20) + b"\n")
    elif kind == "deep":
        p.write_text("[" * 5000 + "]" * 5000)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "zero":
        return "/dev/zero"
    return str(p)


@pytest.mark.parametrize("kind, fragment", [
    ("binary", "not UTF-8 text"), ("huge", "larger than"), ("deep", "nested too deeply"),
    ("fifo", "not a regular file"), ("dir", "not a regular file"), ("zero", "not a regular file"),
])
def test_sim_profile_file_that_is_no_profile(tmp_path: Any, kind: str, fragment: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.cli import main
    _one_line_error(capsys, main(["--host", f"sim:{_sim_file(tmp_path, kind)}", "inventory"]), fragment)


class _MdevctlHost(RecordingHost):
    """A host whose mdevctl answers ``list --defined --dumpjson`` with the given text."""

    def __init__(self, answer: str) -> None:
        super().__init__()
        self.answer = answer

    def run(self, argv: Any, *, stdin: str | None = None, timeout: float | None = None,
            idempotent: bool = False) -> Any:
        from vgpuvirt.host.base import Result
        self.calls.append(("run", tuple(argv)))
        return Result(tuple(argv), 0, self.answer, "")


@pytest.mark.parametrize("answer", ["[" * 100_000 + "]" * 100_000,
                                    '[{"0000:3b:00.0": ' + "[" * 5000 + "]" * 5000 + "}]", "[{" * 3000, "not json"])
def test_mdevctl_json_from_the_host_nested_or_broken(answer: str) -> None:
    from vgpuvirt.errors import DeviceError
    host = _MdevctlHost(answer)
    with pytest.raises(DeviceError, match="unreadable mdevctl JSON"):
        MdevService(host).list(defined=True)
    assert all(kind != "apply" for kind, _ in host.calls)


def test_mdevctl_json_of_the_real_depth_still_parses() -> None:
    from vgpuvirt.services.vgpu.mdev_state import parse_mdevctl_defined
    text = ('[{"0000:3b:00.0": [{"a1b2c3d4-0000-4000-8000-000000000001": {"mdev_type": "nvidia-231", '
            '"start": "auto", "attrs": [{"x": "[{\\"]"}]}}]}]')
    assert [d.type for d in parse_mdevctl_defined(text)[MdevUuid.parse(GOOD_UUID)]] == ["nvidia-231"]


@pytest.mark.parametrize("options, fragment", [
    ({"bogus": True}, "invalid domain option 'bogus'"),
    ({"hugepages": "no"}, "domain option hugepages"),
    ({"secure_boot": 1}, "domain option secure_boot"),
    ({"threads_per_core": "2"}, "domain option threads_per_core"),
    ({"threads_per_core": True}, "domain option threads_per_core"),
    ({"evdev": 5}, "domain option evdev"),
    ({"evdev": [{"device": "/dev/input/x", "bogus": 1}]}, "domain option evdev"),
    ({"virtio_nics": [{"kind": "network", "source": "default", "speed": 10}]}, "domain option virtio_nics"),
    ({"virtio_nics": "default"}, "domain option virtio_nics"),
    ({"graphics": ["spice"]}, "domain option graphics"),
])
def test_domain_options_of_unknown_keys_or_wrong_types(options: dict[str, Any], fragment: str) -> None:
    from vgpuvirt.provision.request import VmRequest
    with pytest.raises(InvalidSpec, match=re.escape(fragment)):
        VmRequest(name="vm1", options=options)


def test_domain_options_of_the_right_types_are_accepted() -> None:
    from vgpuvirt.provision.request import VmRequest
    from vgpuvirt.xml import DomainOptions
    vm = VmRequest(name="vm1", options={"hugepages": True, "graphics": None, "threads_per_core": 2,
                                        "evdev": ["/dev/input/by-id/kbd"], "virtio_nics": [{"kind": "user"}]})
    opts = DomainOptions.from_mapping(vm.domain_settings())
    assert opts.hugepages is True and opts.threads_per_core == 2 and opts.evdev[0].device == "/dev/input/by-id/kbd"
    assert opts.virtio_nics is not None and opts.virtio_nics[0].kind == "user"


@pytest.mark.parametrize("kw", [{"machine": 0}, {"hyperv_vendor_id": 0}, {"threads_per_core": True}, {"hyperv": 1},
                                {"graphics_listen": None}])
def test_domain_options_in_python_refuse_a_value_of_the_wrong_type(kw: dict[str, object]) -> None:
    from vgpuvirt.xml import DomainOptions

    with pytest.raises(InvalidSpec, match="domain option"):
        DomainOptions(**kw)  # type: ignore[arg-type]
