"""Hostile files given to every CLI verb that reads a YAML, JSON or XML file (issue 27): a device, a FIFO, a huge
file, a directory, bytes that are not UTF-8, a NUL byte, a YAML merge key, 100,000 levels of nesting and a
megabyte-long name are each one line on stderr, exit 2, no traceback, and the error echoes at most a few hundred
characters of what it read."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpuvirt.cli import main

VALID_LAYOUT = "version: v1\nconfigs:\n  all:\n    - devices: all\n      mode: passthrough\n"

#: shape -> (what to make at the path; None: the path is given as is)
SHAPES: dict[str, Callable[[Path], str]] = {
    "/dev/zero": lambda d: "/dev/zero",
    "fifo": lambda d: (os.mkfifo(d / "f"), str(d / "f"))[1],
    "directory": lambda d: str(d),
    "huge": lambda d: _write(d, b"version: v1\n#" + b"x" * (5 << 20) + b"\n"),
    "not utf-8": lambda d: _write(d, b"version: v1\nconfigs: {a: [{devices: all, mode: \xff}]}\n"),
    "nul": lambda d: _write(d, b"version: v1\nconfigs: {a: [{devices: all, mode: pass\0through}]}\n"),
    "merge key": lambda d: _write(d, b"version: v1\nconfigs:\n  a:\n    - &e {devices: all, mode: passthrough}\n"
                                     b"  b:\n    - <<: *e\n"),
    "deep": lambda d: _write(d, b"version: v1\nconfigs: " + b"[" * 100000 + b"]" * 100000 + b"\n"),
    "deep json": lambda d: _write(d, b'{"version": "v1", "configs": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
    "long name": lambda d: _write(d, ("version: v1\nconfigs: {a: [{devices: [" + "x" * (1 << 20)
                                      + "], mode: passthrough}]}\n").encode()),
}

#: verb -> argv with FILE standing for the hostile path
VERBS: dict[str, list[str]] = {
    "layout plan": ["--host", "sim:t4x2", "layout", "plan", "FILE"],
    "layout import": ["layout", "import", "FILE", "--from", "mig-parted"],
    "iommu release --record": ["--host", "sim:t4x2", "iommu", "release", "--record", "FILE"],
    "iommu check --domain-xml": ["--host", "sim:t4x2", "iommu", "check", "0000:3b:00.0", "--domain-xml", "FILE"],
    "xml lint": ["xml", "lint", "FILE"],
    "sim fault --file": ["sim", "fault", "t4x2", "0000:3b:00.0", "xid", "79", "--file", "FILE"],
}


def _write(d: Path, data: bytes) -> str:
    p = d / "file.yaml"
    p.write_bytes(data)
    return str(p)


#: what every reader refuses before parsing (a --domain-xml file is XML: YAML shapes mean nothing to it)
FILE_SHAPES = ("/dev/zero", "fifo", "directory", "huge", "not utf-8", "nul")


@pytest.mark.parametrize(("verb", "shape"), [(v, s) for v in VERBS for s in SHAPES
                                              if v != "iommu check --domain-xml" or s in FILE_SHAPES])
def test_a_hostile_file_is_one_line(tmp_path: Path, verb: str, shape: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = SHAPES[shape](tmp_path)
    argv = [path if a == "FILE" else a for a in VERBS[verb]]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc != 0, out[:300]
    assert err.count("\n") == 1 and "Traceback" not in err, err[:2000]
    assert len(err) < 1000, f"{len(err)} characters echoed"


@pytest.mark.parametrize(("shape", "said"), [
    ("merge key", "merge keys (<<) are not supported"), ("deep", "nested deeper than 32 levels"),
    ("nul", "without NUL bytes (one at byte 51)"), ("not utf-8", "UTF-8 text (byte 47 is 0xff)"),
    ("/dev/zero", "a regular file"), ("fifo", "a regular file"), ("huge", "at most 4194304 bytes"),
    ("long name", "(1048578 characters)"),
])
def test_the_layout_file_errors_say_what_is_wrong(tmp_path: Path, shape: str, said: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = SHAPES[shape](tmp_path)
    assert main(["--host", "sim:t4x2", "layout", "plan", path]) == 2
    assert said in capsys.readouterr().err


def test_a_valid_layout_still_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "ok.yaml"
    p.write_text(VALID_LAYOUT)
    assert main(["--host", "sim:t4x2", "layout", "plan", str(p)]) == 0
