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


@pytest.mark.parametrize("content", [b"\x80\n", b":\n", b"12ab\n", b"\xc2\xa0\n"])
def test_sim_umount_with_a_pid_file_that_holds_no_pid_is_a_one_line_error(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path, content: bytes) -> None:
    pid_file = tmp_path / "pid"
    pid_file.write_bytes(content)
    rc = main(["sim", "umount", str(tmp_path / "not-mounted"), "--pid-file", str(pid_file)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("vgpuvirt: error: ") and len(err.splitlines()) == 1, err
    assert pid_file.read_bytes() == content  # nothing removed


def test_a_name_that_is_not_utf8_is_printed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    # argv holds undecodable bytes as surrogates; echoing one to a UTF-8 stdout raised UnicodeEncodeError
    rc = main(["--host", "sim:t4x2", "teardown", "--connect", "test:///default", "vm\udc80"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert "vm\\udc80" in out + err
    assert rc in (0, 1)


@pytest.mark.parametrize("content", [b"[" * 5000, b'{"a": ' * 3000 + b"1" + b"}" * 3000])
def test_iommu_release_with_a_deeply_nested_record_is_a_one_line_error(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path, content: bytes) -> None:
    record = tmp_path / "rec.json"
    record.write_bytes(content)
    rc = main(["--host", "sim:desktop", "iommu", "release", "--record", str(record)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("vgpuvirt: error: ") and len(err.splitlines()) == 1, err


def test_messages_show_values_not_python_reprs(capsys):
    """Issue 28 item 11: ``['sim:t4x2@a', ...]``, ``--connect None`` and ``invalid --connect 'test:///default'``
    (for a URI nobody gave) reached users."""
    assert main(["--host", "sim:t4x2@a", "--host", "sim:t4x2@b", "inventory"]) != 0
    err = capsys.readouterr().err
    assert "invalid --host 'sim:t4x2@a', 'sim:t4x2@b': expected one host" in err and "[" not in err
    assert main(["--host", "sim:t4x2", "gc", "--apply"]) != 0
    err = capsys.readouterr().err
    assert "--connect not given: expected a libvirt URI" in err and "None" not in err
    assert main(["--host", "sim:t4x2", "attach", "test", "--gpu", "nvidia-231"]) != 0
    err = capsys.readouterr().err
    assert "invalid --connect" not in err and "libvirt driver for hot-plug 'test:///default'" in err


def test_a_long_list_is_summarised():
    from vgpuvirt.errors import InvalidSpec
    msg = str(InvalidSpec("VM names", [f"vm-{i:03d}" for i in range(1, 41)], "unique names"))
    assert msg == "invalid VM names 'vm-001', 'vm-002', ... 'vm-040' (40 values): expected unique names"
    assert str(InvalidSpec("DEVICE", None, "one of the VM's GPU devices")) == (
        "DEVICE not given: expected one of the VM's GPU devices")
