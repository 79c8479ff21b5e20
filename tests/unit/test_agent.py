"""The batch agent's protocol (vgpuvirt.host.agent.handle) on a real temporary tree."""

from __future__ import annotations

import ast
import base64
import errno
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpuvirt.host import agent


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for dev in ("0000:3b:00.0", "0000:3c:00.0"):
        d = tmp_path / "sys/bus/pci/devices" / dev
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "numvfs").write_text("0\n")
    (tmp_path / "sys/bus/pci/devices/0000:3b:00.0/sub").mkdir()
    return tmp_path


def handle(tree: Path, **request: object) -> dict[str, object]:
    return agent.handle({"root": str(tree), **request})


@pytest.mark.parametrize("bad", ["/sys/../etc", "/sys/./x", "sys/bus", "/sys/*/..", "/a\0b"])
def test_reads_with_dot_components_are_refused_whole(tree: Path, bad: str) -> None:
    out = handle(tree, reads=["/sys/bus/pci/devices/*/vendor", bad])
    assert out["fatal"] == "refused"
    assert "entries" not in out  # nothing at all was read


def test_op_with_dotdot_path_fails_alone(tree: Path) -> None:
    (tree / "escape").write_text("keep\n")
    out = handle(tree, on_error="continue", ops=[
        {"op": "write", "path": "/sys/bus/../../escape", "value": "x"},
        {"op": "write", "path": "/sys/bus/pci/devices/0000:3b:00.0/numvfs", "value": "2"},
    ])
    ops = out["ops"]
    assert isinstance(ops, list)
    assert ops[0]["ok"] is False and ops[0]["errno"] == errno.EINVAL
    assert ops[1]["ok"] is True
    assert (tree / "escape").read_text() == "keep\n"


def test_unknown_op_and_bad_values_are_per_item_einval(tree: Path) -> None:
    out = handle(tree, on_error="continue", ops=[
        {"op": "format_disk", "path": "/sys"},
        {"op": "write", "path": "/sys/bus/pci/devices/0000:3b:00.0/numvfs", "value": 7},
        {"op": "exec", "argv": "reboot"},
    ])
    assert [o["errno"] for o in out["ops"]] == [errno.EINVAL] * 3  # type: ignore[attr-defined]


def test_wire_format_is_stable(tree: Path) -> None:
    out = handle(tree, reads=["/sys/bus/pci/devices/0000:3b:00.0/*"])
    assert out["v"] == agent.PROTOCOL
    assert out["entries"] == {
        "/sys/bus/pci/devices/0000:3b:00.0/numvfs": ["f", "0\n", None],
        "/sys/bus/pci/devices/0000:3b:00.0/sub": ["d", None, None],
        "/sys/bus/pci/devices/0000:3b:00.0/vendor": ["f", "0x10de\n", None],
    }


def test_main_speaks_json_on_stdin_and_stdout(tree: Path) -> None:
    # the same file runs as the remote agent: as a script, request on stdin, response on stdout
    req = json.dumps({"root": str(tree), "reads": ["/sys/bus/pci/devices/*/vendor"]})
    proc = subprocess.run([sys.executable, agent.__file__], input=req.encode(), capture_output=True, check=True)
    out = json.loads(proc.stdout)
    assert sorted(out["entries"]) == ["/sys/bus/pci/devices/0000:3b:00.0/vendor",
                                      "/sys/bus/pci/devices/0000:3c:00.0/vendor"]


def test_main_takes_a_small_request_from_argv(tree: Path) -> None:
    # SSHHost sends small requests as argv[1] = base64(zlib(JSON)): no stdin, one round trip less
    req = json.dumps({"root": str(tree), "reads": ["/sys/bus/pci/devices/*/vendor"]}).encode()
    blob = base64.b64encode(zlib.compress(req)).decode()
    proc = subprocess.run([sys.executable, agent.__file__, blob], stdin=subprocess.DEVNULL, capture_output=True,
                          check=True)
    assert len(json.loads(proc.stdout)["entries"]) == 2


@pytest.mark.parametrize(("args", "stdin"), [([], b"{not json"), (["not base64!"], b""),
                                             ([base64.b64encode(b"not zlib").decode()], b"")])
def test_main_answers_a_bad_request_without_traceback(args: list[str], stdin: bytes) -> None:
    proc = subprocess.run([sys.executable, agent.__file__, *args], input=stdin, capture_output=True, check=True)
    assert json.loads(proc.stdout)["fatal"] == "request"
    assert proc.stderr == b""


def test_agent_source_stays_python36_compatible() -> None:
    # the remote python3 may be 3.6: its grammar, and no annotation that 3.6 cannot evaluate at run time
    # (``dict[str, Any]``, ``int | None``; the agent has no ``from __future__ import annotations``)
    tree = ast.parse(Path(agent.__file__).read_text(), feature_version=(3, 6))
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations += [a.annotation for a in node.args.args + node.args.kwonlyargs if a.annotation]
            annotations += [node.returns] if node.returns else []
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, ast.ImportFrom):
            assert node.module != "__future__", "the agent must not depend on __future__ imports"
    bad = [ast.unparse(a) for a in annotations for n in ast.walk(a)
           if isinstance(n, ast.BinOp) or (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                                           and n.value.id in ("dict", "list", "set", "tuple", "type"))]
    assert bad == []


@pytest.fixture
def sriov_tree(tmp_path: Path) -> Path:
    """A PF with 40 VFs (more than SPLIT_MIN), each VF an mdev parent with two types."""
    pci = tmp_path / "sys/bus/pci/devices"
    pf = pci / "0000:3b:00.0"
    pf.mkdir(parents=True)
    (pf / "vendor").write_text("0x10de\n")
    for n in range(40):
        vf = pci / f"0000:3b:{1 + n // 8:02x}.{n % 8}"
        for t in ("nvidia-1", "nvidia-2"):
            (vf / "mdev_supported_types" / t).mkdir(parents=True)
            (vf / "mdev_supported_types" / t / "name").write_text(f"{t} on VF {n}\n")
            (vf / "mdev_supported_types" / t / "available_instances").write_text("1\n")
        (vf / "vendor").write_text("0x10de\n")
        (vf / "physfn").symlink_to("../0000:3b:00.0")
        (pf / f"virtfn{n}").symlink_to(f"../{vf.name}")
    return tmp_path


def test_guard_skips_and_keeps_matches_by_what_exists_below_them(sriov_tree: Path) -> None:
    no_vfs = handle(sriov_tree, reads=["/sys/bus/pci/devices/*{!physfn}/vendor"])["entries"]
    assert list(no_vfs) == ["/sys/bus/pci/devices/0000:3b:00.0/vendor"]  # type: ignore[call-overload]
    only_vfs = handle(sriov_tree, reads=["/sys/bus/pci/devices/*{?physfn}/vendor"])["entries"]
    assert len(only_vfs) == 40  # type: ignore[arg-type]
    assert "/sys/bus/pci/devices/0000:3b:00.0/vendor" not in only_vfs  # type: ignore[operator]


SAMPLE = "/sys/bus/pci/devices/*/virtfn*{1?mdev_supported_types}/mdev_supported_types/*/name"


def test_first_match_guard_samples_one_vf_per_pf(sriov_tree: Path) -> None:
    out = handle(sriov_tree, reads=[SAMPLE])
    # name order: virtfn0 < virtfn1 < virtfn10 ...; only the first VF that has types is read
    assert sorted(out["entries"]) == [  # type: ignore[call-overload]
        "/sys/bus/pci/devices/0000:3b:00.0/virtfn0/mdev_supported_types/nvidia-1/name",
        "/sys/bus/pci/devices/0000:3b:00.0/virtfn0/mdev_supported_types/nvidia-2/name",
    ]
    # a VF without types is passed over for the next one that has them
    import shutil
    shutil.rmtree(sriov_tree / "sys/bus/pci/devices/0000:3b:01.0/mdev_supported_types")
    out = handle(sriov_tree, reads=[SAMPLE])
    assert {p.split("/")[6] for p in out["entries"]} == {"virtfn1"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["/sys/*{/x", "/sys/*{x}/y", "/sys/{!x}/y", "/sys/*{!../etc}/y", "/sys/*{!a/*}/y",
                                 "/sys/*{?}/y", "/sys/*{!x}y/z"])
def test_malformed_guards_are_refused_whole(tree: Path, bad: str) -> None:
    out = handle(tree, reads=["/sys/bus/pci/devices/*/vendor", bad])
    assert out["fatal"] == "refused"
    assert "entries" not in out


def test_plain_names_next_to_a_wildcard_are_opened_only_if_listed(tree: Path) -> None:
    # with a wildcard sibling the directory is listed anyway; absent plain names then cost no open
    out = handle(tree, reads=["/sys/bus/pci/devices/*/vendor", "/sys/bus/pci/devices/*/absent",
                              "/sys/bus/pci/devices/*/su*"])
    assert sorted(out["entries"]) == [  # type: ignore[call-overload]
        "/sys/bus/pci/devices/0000:3b:00.0/sub", "/sys/bus/pci/devices/0000:3b:00.0/vendor",
        "/sys/bus/pci/devices/0000:3c:00.0/vendor"]


READS = ["/sys/bus/pci/devices/*", "/sys/bus/pci/devices/*/vendor", "/sys/bus/pci/devices/*/physfn",
         "/sys/bus/pci/devices/*/mdev_supported_types/*/available_instances",
         SAMPLE]


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_a_parallel_read_gives_exactly_the_serial_snapshot(sriov_tree: Path, workers: int) -> None:
    fs = agent.OsFs(str(sriov_tree))
    serial = agent.read_entries(fs, READS, {})
    assert len(serial) > 40 * 3
    assert agent.read_entries(fs, READS, {}, workers) == serial


def test_a_parallel_read_survives_readers_that_cannot_start_or_answer(
        sriov_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = agent.OsFs(str(sriov_tree))
    serial = agent.read_entries(fs, READS, {})

    def no_fork() -> int:
        raise OSError(errno.EAGAIN, "fork refused")
    with monkeypatch.context() as m:
        m.setattr(agent.os, "fork", no_fork)
        assert agent.read_entries(fs, READS, {}, 3) == serial

    def broken_pipe(fd: int, data: object) -> int:   # only the forked readers write
        raise OSError(errno.EPIPE, "broken pipe")
    with monkeypatch.context() as m:
        m.setattr(agent.os, "write", broken_pipe)
        assert agent.read_entries(fs, READS, {}, 3) == serial


def test_the_standalone_agent_reads_in_parallel_and_reports_its_time(sriov_tree: Path) -> None:
    req = json.dumps({"root": str(sriov_tree), "reads": READS, "workers": 3}).encode()
    proc = subprocess.run([sys.executable, "-I", "-S", agent.__file__], input=req, capture_output=True, check=True)
    out = json.loads(proc.stdout)
    assert out["entries"] == agent.read_entries(agent.OsFs(str(sriov_tree)), READS, {})
    assert isinstance(out["agent_s"], float) and out["agent_s"] >= 0
    assert proc.stderr == b""


@pytest.mark.parametrize("bytecode", [False, True])
def test_an_inventory_sized_request_runs_without_importing_typing_subprocess_json_or_re(sriov_tree: Path,
                                                                                       bytecode: bool) -> None:
    # each remote exec pays the agent's imports: typing is the type checker's, subprocess the exec op's, and
    # json/re/base64 are replaced by the C codec and binascii (re alone was a third of the start)
    from vgpuvirt.host.ssh import agent_command
    req = json.dumps({"root": str(sriov_tree), "reads": READS, "compress": True}).encode()
    blob = base64.b64encode(zlib.compress(req)).decode()
    boot = agent_command(sys.executable, bytecode)[-1]
    probe = (f"import sys, atexit; atexit.register(lambda: sys.stderr.write(repr(sorted(m for m in "
             f"('typing', 'subprocess', 'json', 're', 'base64', 'fnmatch') if m in sys.modules)))); {boot}")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", probe, blob], capture_output=True, check=True)
    assert proc.stderr.decode() == "[]"
    out = json.loads(zlib.decompress(proc.stdout))
    assert out["entries"] == agent.read_entries(agent.OsFs(str(sriov_tree)), READS, {})


@settings(max_examples=300, deadline=None)
@given(glob=st.text(alphabet="ab.*", min_size=1, max_size=6), name=st.text(alphabet="ab.", max_size=7))
def test_the_star_matcher_agrees_with_fnmatch(glob: str, name: str) -> None:
    import fnmatch
    match = agent._matcher(glob)
    hidden = name.startswith(".") and not glob.startswith(".")
    expected = fnmatch.fnmatchcase(name, glob) and not hidden
    assert (match(name) if match is not None else not name.startswith(".")) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_the_agents_json_codec_is_the_json_modules(value: object) -> None:
    loads, dumps = agent._json_codec()
    text = json.dumps(value, separators=(",", ":"))
    assert dumps(value) == text
    assert loads(text) == value
    assert loads(" \n" + text + "\n") == value


@pytest.mark.parametrize("bad", ["{", '{"a":1} x', "[1,]", '"\x01"', ""])
def test_the_agents_json_codec_refuses_what_json_refuses(bad: str) -> None:
    loads, _ = agent._json_codec()
    with pytest.raises(ValueError):
        json.loads(bad)
    with pytest.raises(ValueError):
        loads(bad)
    with pytest.raises(ValueError):   # stricter than json: no NaN/Infinity in a request
        loads('{"a":NaN}')


def _frame(data: bytes) -> bytes:
    import struct
    return struct.pack(">I", len(data)) + data


def _frames(data: bytes) -> list[bytes]:
    import struct
    out = []
    while data:
        (n,) = struct.unpack(">I", data[:4])
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


def test_the_resident_agent_answers_an_argv_request_then_framed_requests_until_eof(tree: Path) -> None:
    def req(pattern: str, compress: bool) -> bytes:
        return json.dumps({"root": str(tree), "reads": [pattern], "compress": compress}).encode()
    first = base64.b64encode(zlib.compress(req("/sys/bus/pci/devices/0000:3b:00.0/vendor", True))).decode()
    stdin = (_frame(zlib.compress(req("/sys/bus/pci/devices/0000:3c:00.0/vendor", False)))
             + _frame(req("/sys/bus/pci/devices/*/numvfs", True)) + _frame(b"{not json"))
    proc = subprocess.run([sys.executable, "-I", "-S", agent.__file__, "--serve", first], input=stdin,
                          capture_output=True, check=True, timeout=60)
    answers = _frames(proc.stdout)
    assert len(answers) == 4                     # one per request, then it left on EOF
    a1, a2, a3, a4 = (json.loads(zlib.decompress(a) if a[:1] != b"{" else a) for a in answers)
    assert list(a1["entries"]) == ["/sys/bus/pci/devices/0000:3b:00.0/vendor"]
    assert a2["entries"] == {"/sys/bus/pci/devices/0000:3c:00.0/vendor": ["f", "0x10de\n", None]}
    assert answers[1][:1] == b"{"               # answered uncompressed, as asked
    assert len(a3["entries"]) == 2
    assert a4["fatal"] == "request"              # a bad request gets its answer; the agent goes on
    assert proc.stderr == b""


def test_the_resident_agent_ends_quietly_on_a_cut_frame(tree: Path) -> None:
    proc = subprocess.run([sys.executable, "-I", "-S", agent.__file__, "--serve"], input=b"\x00\x00\x01\x00{",
                          capture_output=True, check=True, timeout=60)
    assert proc.stdout == b"" and proc.stderr == b""
