"""``nvidia-smi --query-gpu``: parsed in R580's real spellings (the H100 transcript), rendered the same way by the
simulator, and giving the same readings as ``-q -x`` on every simulated profile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vgpuvirt import sim
from vgpuvirt.model import PciAddress
from vgpuvirt.services.nvidia.query_gpu import QUERY_GPU_ARGV, QUERY_GPU_FIELDS, parse_query_gpu
from vgpuvirt.services.nvidia.readings import parse_readings

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h100-580" / "query-gpu"
H100 = PciAddress.parse("0000:00:06.0")


def _field_by_field() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (REAL / "query-gpu-field-by-field.csv").read_text().splitlines():
        name, _, value = line.partition(",")
        out.setdefault(name, value)
    return out


def _real_header_units() -> dict[str, str]:
    header = (REAL / "nvidia-smi-query.csv").read_text().splitlines()[0]
    return {c.strip().split(" [")[0]: c.strip() for c in header.split(",")}


def _sim(profile: str) -> sim.SimHost:
    h = sim.SimHost.from_profile(profile)
    h.model.telemetry.clock = lambda: 1_700_200_000.0
    return h


def _shape(value: str) -> str:
    """What a value looks like: '[...]' (not available), its unit suffix, a bare number, or text."""
    v = value.strip()
    if v.startswith("[") and v.endswith("]"):
        return "[]"
    m = re.fullmatch(r"-?\d+(?:\.\d+)?( MiB| %| W| MHz)?", v)
    return f"number{m.group(1) or ''}" if m else "text"


def test_the_real_r580_answer_parses_into_the_readings() -> None:
    real = _field_by_field()
    units = _real_header_units()
    header = ", ".join(units.get(f, f) if f in units else f for f in QUERY_GPU_FIELDS)
    header = header.replace("memory.reserved", "memory.reserved [MiB]").replace(
        "clocks.current.graphics", "clocks.current.graphics [MHz]")
    row = ", ".join(real[f] for f in QUERY_GPU_FIELDS)
    report = parse_query_gpu(header + "\n" + row + "\n")
    assert report.error is None and report.driver_version == "580.159.04"
    r = report.readings[H100]
    assert (r.name, r.fb_total_mib, r.fb_used_mib, r.temperature_c, r.power_w, r.power_limit_w) == (
        "NVIDIA H100 80GB HBM3", 81559, 0, 36.0, 73.48, 700.0)
    assert (r.sm_clock_mhz, r.memory_clock_mhz, r.performance_state) == (345, 2619, "P0")
    # an H100 remaps rows and retires no pages: [N/A] is None, never 0
    mr = r.memory_repair
    assert (mr.retired_sbe, mr.retired_dbe, mr.retired_pending) == (None, None, None)
    assert (mr.remapped_correctable, mr.remapped_uncorrectable, mr.remap_pending, mr.remap_failure) == (0, 0, False,
                                                                                                      False)
    assert (r.pcie.gen_current, r.pcie.gen_max, r.pcie.width_current, r.pcie.width_max) == (5, 5, 16, 16)
    assert report.mig_mode[H100] == ("Disabled", "Disabled")


def test_every_field_asked_exists_on_r580() -> None:
    real = _field_by_field()
    assert [f for f in QUERY_GPU_FIELDS if f not in real] == []


@pytest.mark.parametrize("profile", sim.list_profiles())
def test_the_simulator_spells_each_field_as_r580_does(profile: str) -> None:
    h = _sim(profile)
    r = h.run(list(QUERY_GPU_ARGV))
    if r.exit_code == 9:          # no NVIDIA GPU on the nvidia driver: nvidia-smi's own failure
        assert "couldn't communicate with the NVIDIA driver" in r.stderr
        return
    assert r.exit_code == 0 and r.stderr == ""
    real, units = _field_by_field(), _real_header_units()
    header, *rows = r.stdout.splitlines()
    columns = [c.strip() for c in header.split(", ")]
    for f, col in zip(QUERY_GPU_FIELDS, columns, strict=True):
        if f in units:
            assert col == units[f]                    # the unit in the header, as R580 writes it
    for row in rows:
        for f, value in zip(QUERY_GPU_FIELDS, row.split(", "), strict=True):
            # where the H100 printed a value: the same unit (a simulated board may lack it: then [N/A]); where it
            # printed [N/A] (retired pages on a board that remaps rows) it shows no shape to hold others to
            if _shape(real[f]) != "[]":
                assert _shape(value) in (_shape(real[f]), "[]"), (f, value, real[f])
            assert value not in ("N/A", "Not Supported", "")             # never unbracketed


@pytest.mark.parametrize("profile", sim.list_profiles())
def test_query_gpu_gives_the_readings_of_q_x(profile: str) -> None:
    h = _sim(profile)
    xml = h.run(["nvidia-smi", "-q", "-x"])
    report = parse_query_gpu(h.run(list(QUERY_GPU_ARGV)).stdout)
    if not xml.ok:
        assert report.readings == {}
        return
    assert report.error is None
    assert report.readings == parse_readings(xml.stdout)


@pytest.mark.parametrize(("text", "why"), [("", "no output"), ("index, name\n0, x\n", "unexpected header")])
def test_an_answer_that_is_not_ours_is_an_error_not_readings(text: str, why: str) -> None:
    report = parse_query_gpu(text)
    assert report.readings == {} and why in (report.error or "")


def test_an_unknown_field_fails_as_nvidia_smi_does() -> None:
    r = _sim("t4x2").run(["nvidia-smi", "--query-gpu=index,bogus", "--format=csv"])
    assert r.exit_code == 2 and 'Field "bogus" is not a valid field to query.' in r.stderr
