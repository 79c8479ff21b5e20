"""The nvidia-smi MIG parsers against the real rows in tests/fixtures/hostdata/mig_backed_vgpu.txt (NVIDIA's
docs for the A100 40GB, OpenNebula's H100 NVL transcript), and the simulator's tables against them."""

from __future__ import annotations

import re
from pathlib import Path

from vgpuvirt.services.mig import parse as P
from vgpuvirt.sim import SimHost

HOSTDATA = Path(__file__).resolve().parents[1] / "fixtures" / "hostdata" / "mig_backed_vgpu.txt"


def _section(title: str) -> str:
    """The commented lines of one hostdata section, the leading '# ' (and '#   ') removed."""
    text = HOSTDATA.read_text(encoding="utf-8")
    start = text.index(title)
    end = text.index("#####", text.index("\n", text.index("\n", start) + 1))   # past the title's ### rule
    return "\n".join(re.sub(r"^#\s?", "", ln) for ln in text[start:end].splitlines())


def test_lgip_rows_of_the_a100_40gb_and_the_h100_nvl() -> None:
    a100 = P.parse_lgip(_section("A100 PCIe/SXM 40GB"))
    assert [(p.name, p.id, p.free, p.total, p.memory_gib) for p in a100] == [
        ("1g.5gb", 19, 7, 7, 4.95), ("2g.10gb", 14, 3, 3, 9.90), ("3g.20gb", 9, 2, 2, 19.79),
        ("4g.20gb", 5, 1, 1, 19.79)]
    h100 = P.parse_lgip(_section("H100 NVL 94GB MIG profiles"))
    assert [(p.name, p.id, p.total, p.compute_slices) for p in h100] == [
        ("1g.12gb", 19, 7, 1), ("1g.12gb+me", 20, 1, 1), ("1g.24gb", 15, 4, 1), ("2g.24gb", 14, 3, 2),
        ("3g.47gb", 9, 2, 3), ("4g.47gb", 5, 1, 4), ("7g.94gb", 0, 1, 7)]
    assert all(p.gpu == 0 for p in a100 + h100)


def test_lgi_cgi_and_destroy_messages_of_the_h100_nvl_transcript() -> None:
    text = _section("H100 NVL 94GB MIG profiles")
    gis = P.parse_lgi(text)
    assert [(g.gpu, g.profile, g.profile_id, g.id, g.start, g.size) for g in gis] == [
        (0, "1g.12gb", 19, 13, 6, 1), (0, "2g.24gb", 14, 3, 0, 2)]
    assert P.created_gpu_instances(text) == [(0, 2)]
    # the compute-instance message wraps onto a second line in the transcript
    assert P.created_compute_instances(text) == [(0, 2, 0)]
    assert P.destroyed_compute_instances(text) == [(0, 0, 0)]
    assert P.parse_lgi("No GPU instances found: Not Found\n") == []


def test_lgipp_and_lci_formats() -> None:
    text = "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1\nGPU  0 Profile ID  5 Placement : {0}:4\nnoise\n"
    assert P.parse_lgipp(text) == {(0, 19): ((0, 1, 2, 3, 4, 5, 6), 1), (0, 5): ((0,), 4)}
    row = "|   0      1       MIG 1c.3g.20gb       0         2          2:1     |"
    assert P.parse_lci(row) == [P.ComputeInstance(0, 1, 2, "1c.3g.20gb", 0, 2, 1)]
    assert P.mode_change_pending("Warning: MIG mode is in pending enable state for GPU 00000000:17:00.0:In use")
    assert not P.mode_change_pending("Enabled MIG Mode for GPU 00000000:17:00.0\nAll done.\n")


def test_the_simulators_lgi_row_is_laid_out_like_the_real_one() -> None:
    real = next(ln for ln in _section("H100 NVL 94GB MIG profiles").splitlines() if "13          6:1" in ln).strip()
    host = SimHost.from_profile("a100-sriov")
    assert host.run(["nvidia-smi", "-i", "1", "-mig", "1"]).exit_code == 0
    assert host.run(["nvidia-smi", "mig", "-i", "1", "-cgi", "19"]).exit_code == 0   # a 1g lands at 6:1, GI 13
    rows = [ln for ln in host.run(["nvidia-smi", "mig", "-lgi", "-i", "1"]).stdout.splitlines() if "MIG" in ln]
    # same name length (1g.10gb vs 1g.12gb): the row must match character for character
    assert rows == [real.replace("1g.12gb", "1g.10gb").replace("|   0 ", "|   1 ")]


def test_the_simulators_tables_parse_back_and_the_gpu_index_selects() -> None:
    host = SimHost.from_profile("a100-sriov")
    lgip = P.parse_lgip(host.run(["nvidia-smi", "mig", "-lgip"]).stdout)
    assert [(p.name, p.id, p.free, p.total) for p in lgip][:4] == [
        ("1g.10gb", 19, 0, 7), ("1g.10gb+me", 20, 0, 1), ("1g.20gb", 15, 0, 4), ("2g.20gb", 14, 0, 3)]
    lgi = P.parse_lgi(host.run(["nvidia-smi", "mig", "-lgi"]).stdout)
    assert sorted((g.id, g.profile, g.start) for g in lgi) == [
        (3, "2g.20gb", 0), (4, "2g.20gb", 2), (5, "2g.20gb", 4), (13, "1g.10gb", 6)]
