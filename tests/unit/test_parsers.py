"""Parsers against every hostdata format (tests/fixtures/hostdata), real transcripts included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.services.pci import parsers as P

HOSTDATA = Path(__file__).resolve().parents[1] / "fixtures" / "hostdata"


def hostdata(name: str) -> str:
    return (HOSTDATA / name).read_text()


# -- NVIDIA description ---------------------------------------------------------------------

def test_real_t4_description_line() -> None:
    d = P.parse_nvidia_description(
        "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16\n")
    assert (d.num_heads, d.frl, d.framebuffer_mib, d.max_resolution, d.max_instances) == (4, 45, 1024, "5120x2880", 16)
    assert d.recognised


def _t4_table() -> list[tuple[str, str, str]]:
    rows = re.findall(r"^# (nvidia-\d+) \| (GRID T4-\w+)\s*\| (num_heads=.*?max_instance=\d+)",
                      hostdata("nvidia_t4_sysfs.txt"), re.M)
    assert len(rows) == 17
    return rows


def test_every_t4_table_row_agrees_with_its_name() -> None:
    # The framebuffer in the description and the size in the name are two sources for the same fact.
    for type_id, name, desc in _t4_table():
        d = P.parse_nvidia_description(desc)
        c = P.classify_vgpu_name(name)
        assert d.framebuffer_mib == c.framebuffer_gib * 1024, (type_id, name)
        assert d.max_instances == 16384 // d.framebuffer_mib, (type_id, name)
        assert c.board == "T4" and c.series in "QBAC" and not c.mig_backed
        assert d.frl == (45 if c.series == "B" else 60), name


def test_real_p100_mdevctl_description_lines() -> None:
    lines = re.findall(r"^#\s+Description: (num_heads=.*)$", hostdata("nvidia_t4_sysfs.txt"), re.M)
    assert lines
    for line in lines:
        d = P.parse_nvidia_description(line)
        assert d.framebuffer_mib in (2048, 8192) and d.max_instances in (2, 8) and d.num_heads in (1, 4)


@pytest.mark.parametrize("text", [None, "", "virtual display, 640x480 framebuffer",
                                  "virtual display, 4 MB video memory", "garbage ==== ,,,"])
def test_unknown_description_formats_give_empty_fields(text: str | None) -> None:
    assert not P.parse_nvidia_description(text).recognised
    assert not P.parse_gvtg_description(text).recognised


def test_bad_values_become_none_not_errors() -> None:
    d = P.parse_nvidia_description("num_heads=four, frl_config=60, framebuffer=lots, max_resolution=big, "
                                   "max_instance=8, new_key=1")
    assert (d.num_heads, d.frl, d.framebuffer_mib, d.max_resolution, d.max_instances) == (None, 60, None, None, 8)


# -- GVT-g -----------------------------------------------------------------------------------

def test_gvtg_multiline_descriptions_from_sysfs_and_mdevctl_agree() -> None:
    text = hostdata("gvtg_sysfs.txt")
    sysfs = dict(re.findall(r"mdev_supported_types/(i915-GVTg_V5_\d)/description = \"(.*)\"", text))
    joined = dict(re.findall(r"^#\s+(i915-GVTg_V5_\d)\n#\s+Available.*\n#\s+Device API.*\n#\s+Description: (.*)$",
                             text, re.M))
    assert set(sysfs) == {"i915-GVTg_V5_1", "i915-GVTg_V5_2", "i915-GVTg_V5_4", "i915-GVTg_V5_8"}
    assert set(joined) == set(sysfs)
    for tid, raw in sysfs.items():
        a = P.parse_gvtg_description(raw.encode().decode("unicode_escape"))
        b = P.parse_gvtg_description(joined[tid])
        assert a == b and a.recognised
    v54 = P.parse_gvtg_description(sysfs["i915-GVTg_V5_4"].encode().decode("unicode_escape"))
    assert v54.to_dict() == {"low_gm_mib": 128, "high_gm_mib": 512, "fence": 4, "resolution": "1920x1200",
                             "weight": 4}


# -- creatable_vgpu_types ----------------------------------------------------------------------

def test_real_l40s_creatable_listing_keeps_driver_order() -> None:
    text = hostdata("nvidia_vfio_vendor_specific.txt")
    start = text.index("ID    : vGPU Name\n1145")
    block = text[start:text.index("# (note: list is NOT sorted")]
    rows = P.parse_creatable_vgpu_types(block)
    assert len(rows) == 23
    assert rows[0] == (1145, "NVIDIA L40S-1B") and rows[-1] == (2164, "NVIDIA L40S-3B")
    assert (1155, "NVIDIA L40S-24Q") in rows


def test_real_rtx6000_ada_listing_and_headerless_h200_rows() -> None:
    text = hostdata("nvidia_vfio_vendor_specific.txt")
    ada = "\n".join(ln[2:] for ln in text.splitlines() if re.match(r"^# (ID    :|9[45]\d\s+:)", ln))
    rows = P.parse_creatable_vgpu_types(ada)
    assert [r[0] for r in rows] == list(range(941, 951))
    assert rows[0][1] == "NVIDIA RTX6000-Ada-1Q"
    assert P.parse_creatable_vgpu_types("1428 : NVIDIA H200X-141C\n1414 : NVIDIA H200X-1-18C\n") == [
        (1428, "NVIDIA H200X-141C"), (1414, "NVIDIA H200X-1-18C")]


@pytest.mark.parametrize("text", ["ID    : vGPU Name\n", "", None, "\n\n", "nonsense line\n"])
def test_header_only_or_garbage_means_nothing_creatable(text: str | None) -> None:
    assert P.parse_creatable_vgpu_types(text) == []


# -- type names --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "board", "series", "fb", "profile"), [
    ("GRID T4-2Q", "T4", "Q", 2, None),
    ("GRID T4-2B4", "T4", "B", 2, None),
    ("NVIDIA A10-4Q", "A10", "Q", 4, None),
    ("NVIDIA L40S-24Q", "L40S", "Q", 24, None),
    ("GRID A100D-80C", "A100D", "C", 80, None),
    ("GRID A100D-1-10C", "A100D", "C", 10, "1g.10gb"),
    ("NVIDIA H200X-1-18C", "H200X", "C", 18, "1g.18gb"),
    ("NVIDIA H200X-141C", "H200X", "C", 141, None),
    ("GRID A100-1-5CME", "A100", "C", 5, "1g.5gb+me"),
    ("NVIDIA RTX6000-Ada-1Q", "RTX6000-Ada", "Q", 1, None),
    ("NVIDIA RTX Pro 6000 Blackwell DC-1-2Q", "RTX Pro 6000 Blackwell DC", "Q", 2, "1g.2gb"),
])
def test_classify_vgpu_names(name: str, board: str, series: str, fb: int, profile: str | None) -> None:
    c = P.classify_vgpu_name(name)
    assert (c.board, c.series, c.framebuffer_gib, c.gi_profile, c.mig_backed) == (
        board, series, fb, profile, profile is not None)


def test_every_mig_table_name_maps_to_its_gpu_instance_profile() -> None:
    rows = re.findall(r"^#\s+(A100D?-\d-\d+C(?:ME)?)\s+\|?\s*(?:nvidia-\d+|\(newer[^)]*\))?\s*\|?\s*"
                      r"(\dg\.\d+gb(?:\+me)?)", hostdata("mig_backed_vgpu.txt"), re.M)
    assert len(rows) >= 12
    for name, profile in rows:
        assert P.classify_vgpu_name("GRID " + name).gi_profile == profile, name


@pytest.mark.parametrize("name", ["GVTg_V5_4", "Single port serial", "mdpy-vga", "", None, "NVIDIA A10", "-4Q"])
def test_non_nvidia_names_are_unclassified(name: str | None) -> None:
    assert P.classify_vgpu_name(name) == P.VgpuClass()


# -- small sysfs values --------------------------------------------------------------------------

def test_small_value_parsers() -> None:
    assert P.parse_hex_id("0x10DE\n") == "0x10de" and P.parse_hex_id("2236") == "0x2236"
    assert P.parse_hex_id("nope") is None and P.parse_hex_id(None) is None
    assert P.parse_numa_node("-1") is None and P.parse_numa_node("1") == 1 and P.parse_numa_node("x") is None
    assert P.parse_reset_methods("flr bus\n") == ["flr", "bus"] and P.parse_reset_methods(None) is None
    assert P.parse_reset_methods("") == []
    assert P.parse_driver_override("(null)\n") is None and P.parse_driver_override("vfio-pci") == "vfio-pci"
    assert P.pci_or_none("0000:3B:00.0") == PciAddress.parse("3b:00.0") and P.pci_or_none("mtty") is None


# -- domain XML ------------------------------------------------------------------------------------

def test_real_mdev_hostdev_and_pci_hostdev_from_hostdata() -> None:
    text = hostdata("nodedev_xml.txt")
    mdev = text[text.index("<hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>"):]
    mdev = mdev[:mdev.index("</hostdev>") + len("</hostdev>")]
    pci = text[text.index("<hostdev mode='subsystem' type='pci' managed='yes'>"):]
    pci = pci[:pci.index("</hostdev>") + len("</hostdev>")]
    nic = ("<interface type='hostdev' managed='yes'><source><address type='pci' domain='0x0000' bus='0x5e' "
           "slot='0x10' function='0x2'/></source></interface>")
    refs = P.domain_device_refs(f"<domain type='kvm'><name>vm</name><devices>{mdev}{pci}{nic}</devices></domain>")
    assert refs.error is None
    assert refs.mdevs == {MdevUuid.parse("e55bf865-6983-4d53-967f-51e8a3bb0f57")}
    assert refs.pci == {PciAddress.parse("0000:41:00.0"), PciAddress.parse("0000:5e:10.2")}


def test_domain_refs_normalise_case_and_survive_bad_xml() -> None:
    xml = ("<domain><devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
           "<address uuid='E55BF865-6983-4D53-967F-51E8A3BB0F57'/></source></hostdev>"
           "<hostdev type='mdev'><source><address uuid='not-a-uuid'/></source></hostdev></devices></domain>")
    assert P.domain_device_refs(xml).mdevs == {MdevUuid.parse("e55bf865-6983-4d53-967f-51e8a3bb0f57")}
    bad = P.domain_device_refs("<domain><devices>")
    assert bad.error and not bad.mdevs and not bad.pci


def test_domain_refs_never_resolve_entities() -> None:
    xml = ('<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
           "<domain><name>&x;</name><devices/></domain>")
    refs = P.domain_device_refs(xml)
    assert not refs.mdevs and not refs.pci
