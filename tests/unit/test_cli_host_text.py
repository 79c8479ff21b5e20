"""Text a host provides (type names, descriptions, driver names) reaches the terminal as plain text.

A simulated host whose files carry rich markup, SGR escapes and an OSC-8 hyperlink: ``types``,
``inventory`` and ``plan --explain`` print them escaped and exit 0 (``[/x]`` used to crash ``types``
with a rich MarkupError, and the escape sequences went to the user's terminal as they were)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.cli.context import plain, printable
from vgpuvirt.sim import materialize

MARKUP = "[/x]"
SGR = "\x1b[31m"
OSC8 = "\x1b]8;;http://evil\x07"
EVIL = f"{MARKUP}{SGR}{OSC8}"
DRIVER_EVIL = f"[red]{SGR}\x1b]8;;evil\x07"    # no "/": it would end the link name
GPU = "sys/bus/pci/devices/0000:3b:00.0"


@pytest.fixture
def evil_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "host"
    materialize("t4x2", str(root))
    t = root / GPU / "mdev_supported_types/nvidia-231"
    for f, text in (("name", f"GRID T4-2Q{EVIL}"),
                    ("description", f"num_heads=4, frl_config=60, framebuffer=2048M{EVIL}, max_resolution=7680x4320, "
                                    "max_instance=8")):
        (t / f).chmod(0o644)
        (t / f).write_text(text)
    (root / GPU / "driver").unlink()
    os.symlink(f"../../../../bus/pci/drivers/nvi{DRIVER_EVIL}dia", root / GPU / "driver")
    monkeypatch.setenv("COLUMNS", "1000")   # rich would wrap the table cells at 80 columns
    return root


def _clean(out: str) -> None:
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert "\\x1b]8;;http://evil\\x07" in out or "\\x1b[31m" in out


@pytest.mark.parametrize("verb", [["types"], ["inventory"], ["types", "--parent", "0000:3b:00.0"]])
def test_listings_print_host_text_escaped(evil_tree: Path, verb: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sysfs-root", str(evil_tree), *verb, "--no-nvidia-smi", "--nvml", "no"]) == 0
    out, err = capsys.readouterr()
    _clean(out + err)
    assert f"GRID T4-2Q{MARKUP}\\x1b[31m" in out          # the markup shows as text, not as a tag


def test_inventory_shows_the_driver_name_escaped(evil_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sysfs-root", str(evil_tree), "inventory", "--no-nvidia-smi", "--nvml", "no"]) == 0
    out = capsys.readouterr().out
    _clean(out)
    assert "nvi[red]\\x1b[31m\\x1b]8;;evil\\x07dia" in out


def test_plan_explain_prints_host_text_escaped(evil_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sysfs-root", str(evil_tree), "plan", "--connect", "test:///default", "--gpu", "nvidia-231",
                 "--explain"]) == 0
    out, err = capsys.readouterr()
    _clean(out + err)
    assert MARKUP in out


@pytest.mark.parametrize("text, shown", [
    ("GRID T4-2Q[/x]", "GRID T4-2Q\\[/x]"),
    ("a\x1b[31mb", "a\\x1b[31mb"),
    ("\x1b]8;;http://evil\x07link", "\\x1b]8;;http://evil\\x07link"),
    ("two\nlines\r", "two\\x0alines\\x0d"),
    ("c1\x9bdel\x7f", "c1\\x9bdel\\x7f"),
    ("bidi\u202eevil\u2066", "bidi\\u202eevil\\u2066"),
    ("GRID T4-2Q ok", "GRID T4-2Q ok"),
])
def test_plain_escapes_markup_and_every_control_character(text: str, shown: str) -> None:
    assert plain(text) == shown
    assert printable(text) == shown.replace("\\[", "[")
