"""The CLI's error line: one line on the terminal, whatever text the failure carries (found by tests/fuzz)."""

from __future__ import annotations

import pytest

from vgpuvirt.cli import main


@pytest.mark.parametrize("bad", ["test:///\x0c", "test:///a\rb", "test:///\x1b[31mred", "test:///\u2028x",
                                 "test:///\x85y", "test:///\x0bz"])
def test_the_error_line_escapes_control_characters(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    rc = main(["--host", "sim:t4x2", "inventory", "--connect", bad])
    err = capsys.readouterr().err
    assert rc != 0
    assert len(err.splitlines()) == 1, err
    assert err.startswith("vgpuvirt: error: ")
    assert "\x1b" not in err


@pytest.mark.parametrize("verb", [["xml", "lint"], ["xml", "devices"], ["--host", "sim:t4x2", "gc", "--domain-xml"],
                                  ["--host", "sim:t4x2", "iommu", "check", "0000:3b:00.0", "--domain-xml"]])
@pytest.mark.parametrize("content", [b"\x80", b"\xff\xfe<domain/>", b"<domain>\xc3</domain>"])
def test_a_file_that_is_not_utf8_gets_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path, verb: list[str],
                                                       content: bytes) -> None:
    f = tmp_path / "dom.xml"
    f.write_bytes(content)
    rc = main([*verb, str(f)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("vgpuvirt: error: ") and len(err.splitlines()) == 1, err
