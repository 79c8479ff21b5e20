"""Layout files: parse, dump back equal, and every bad input named by file, line and key."""

from __future__ import annotations

import pytest

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout import GpuLayout, LayoutFileError, Selector, dump_layout, parse_layout
from vgpuvirt.model import PciAddress

GOOD = """\
version: v1
configs:
  day:
    - devices: all
      mode: vgpu
      vgpu-devices:
        A10-4Q: fill
      sizing: equal
    - devices: [1, "0000:41:00.0", NVIDIA A100-SXM4-40GB]
      mode: mig-vgpu
      mig-devices: {"1g.10gb": 4, "3g.40gb": 1}
      vgpu-devices: {A100-1-10C: 4}
      scheduler: {policy: equal-share, timeslice-ms: 2}
  night:
    - devices: all
      mode: passthrough
"""


def test_parse_and_dump_round_trip() -> None:
    lay = parse_layout(GOOD, "good.yaml")
    assert lay.names == ["day", "night"]
    day = lay.config("day")
    assert day.entries[0].layout.vgpu_devices[0].fill
    assert day.entries[1].layout.mig_devices == (("1g.10gb", 4), ("3g.40gb", 1))
    assert day.entries[1].line == 9
    assert parse_layout(dump_layout(lay)) == lay


def test_selectors_and_override_order() -> None:
    day = parse_layout(GOOD).config("day")
    gpus = [(PciAddress.parse("0000:41:00.0"), "NVIDIA A10"), (PciAddress.parse("0000:3b:00.0"), "NVIDIA A10"),
            (PciAddress.parse("0000:81:00.0"), "NVIDIA A100-SXM4-40GB"), (PciAddress.parse("0000:c1:00.0"), "x")]
    got = {str(a): e.layout.mode for a, e in day.resolve(gpus).items()}
    # index 1 (by address) is 41:00.0; the A100 by product name; the rest stay on "all"
    assert got == {"0000:3b:00.0": "vgpu", "0000:41:00.0": "mig-vgpu", "0000:81:00.0": "mig-vgpu",
                   "0000:c1:00.0": "vgpu"}
    assert Selector.parse("3B:00.0") == Selector("address", "0000:3b:00.0")


def test_config_choice() -> None:
    lay = parse_layout(GOOD, "good.yaml")
    with pytest.raises(InvalidSpec, match="several configs"):
        lay.config()
    with pytest.raises(InvalidSpec, match="one of day, night"):
        lay.config("evening")


@pytest.mark.parametrize(("text", "where"), [
    ("version: v2\nconfigs: {}\n", "f.yaml:1: version:"),
    ("configs: {a: []}\n", "f.yaml:1: version: missing"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgu\n", "f.yaml:5: configs.a[0].mode:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n      sriov-vfs: -1\n",
     "f.yaml:6: configs.a[0].sriov-vfs:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n      vgpu-devices: {A: lots}\n",
     "f.yaml:6: configs.a[0].vgpu-devices.A:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: passthrough\n      vgpu-devices: {A: 1}\n",
     "f.yaml:6: configs.a[0].vgpu-devices:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: mig\n      mig-devices: {1x.5gb: 1}\n",
     "f.yaml:6: configs.a[0].mig-devices.1x.5gb:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      modes: vgpu\n",
     "f.yaml:5: configs.a[0].modes: unknown key"),
    ("version: v1\nversion: v1\n", "f.yaml:2: version: duplicate key"),
    ("a: [\n", "f.yaml:2: not valid YAML"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n      driver: 'x;rm'\n",
     "f.yaml:6: configs.a[0].driver:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: [true]\n      mode: off\n", "f.yaml:4: configs.a[0].devices[0]:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n      vgpu-devices: {A: fill, B: fill}\n",
     "f.yaml:6: configs.a[0].vgpu-devices:"),
    ("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n      scheduler: {policy: fair}\n",
     "f.yaml:6: configs.a[0].scheduler:"),
    ("version: v1\nconfigs:\n  'bad name':\n    - {devices: all, mode: off}\n", "f.yaml:3: configs.bad name:"),
    ("", "f.yaml: empty file"),
])
def test_bad_input_names_file_line_key(text: str, where: str) -> None:
    with pytest.raises(LayoutFileError) as exc:
        parse_layout(text, "f.yaml")
    assert str(exc.value).startswith(where), str(exc.value)
    assert "\n" not in str(exc.value)


def test_model_rules() -> None:
    with pytest.raises(InvalidSpec, match="driver"):
        GpuLayout(mode="passthrough", driver="nvidia")
    with pytest.raises(InvalidSpec, match="sriov-vfs"):
        GpuLayout(mode="passthrough", sriov_vfs=4)
    assert GpuLayout(mode="mig").resolved_mig() and not GpuLayout(mode="vgpu").resolved_mig()


def test_unquoted_off_is_the_mode_off() -> None:
    lay = parse_layout("version: v1\nconfigs:\n  a:\n    - {devices: all, mode: off}\n")
    assert lay.config().entries[0].layout.mode == "off"


def _nested(levels: int) -> str:
    # the root mapping is level 1, "configs" a mapping at level 2, then lists down to `levels`
    return "version: v1\nconfigs:\n  day:\n" + "    " + "[" * (levels - 3) + "1" + "]" * (levels - 3) + "\n"


def test_nesting_stops_at_32_levels_where_the_composer_reaches_the_33rd() -> None:
    with pytest.raises(LayoutFileError) as ok:
        parse_layout(_nested(32), "lab.yaml")
    assert "nested deeper" not in str(ok.value)          # refused for what it holds, not for its depth
    with pytest.raises(LayoutFileError) as deep:
        parse_layout(_nested(33), "lab.yaml")
    assert str(deep.value) == "lab.yaml:4: nested deeper than 32 levels"
    # 100,000 levels: refused at the same place (the scanner stopped there, not at the file's end)
    with pytest.raises(LayoutFileError) as deeper:
        parse_layout(_nested(100_000), "lab.yaml")
    assert str(deeper.value) == "lab.yaml:4: nested deeper than 32 levels"
