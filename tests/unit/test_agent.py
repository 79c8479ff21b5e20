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
