"""The agent shipped as this client's bytecode: the host runs it without compiling, a foreign Python runs none
of it, and tracebacks keep their line numbers."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest

from vgpuvirt.host import agent, ssh_agent
from vgpuvirt.host.ssh_agent import FOREIGN_BYTECODE, agent_command

# Counts the compile() calls the bootstrap makes (builtins.compile is what the source bootstrap calls).
_COUNT_COMPILES = ("import builtins, sys, atexit; _c = builtins.compile; _n = []\n"
                   "def _counting(*a, **k):\n    _n.append(1)\n    return _c(*a, **k)\n"
                   "builtins.compile = _counting\n"
                   "atexit.register(lambda: sys.stderr.write('compiles=%d' % len(_n)))\n")


def _request(**req: object) -> str:
    return base64.b64encode(zlib.compress(json.dumps(req).encode())).decode()


def _run(boot: str, blob: str, prefix: str = "") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-I", "-S", "-c", prefix + boot, blob], capture_output=True,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    d = tmp_path / "sys/class/x"
    d.mkdir(parents=True)
    (d / "a").write_text("old\n")
    (d / "link").symlink_to("a")
    return tmp_path


def test_bytecode_answers_as_the_source_does_and_the_host_compiles_nothing(tree: Path) -> None:
    blob = _request(root=str(tree), reads=["/sys/class/x/*"])
    answers = {}
    for bytecode in (False, True):
        proc = _run(agent_command(sys.executable, bytecode)[-1], blob, _COUNT_COMPILES)
        assert proc.returncode == 0, proc.stderr
        compiles = proc.stderr.decode()
        assert compiles == ("compiles=0" if bytecode else "compiles=1")
        answers[bytecode] = json.loads(proc.stdout)
        answers[bytecode].pop("agent_s")
    assert answers[True] == answers[False]
    assert answers[True]["entries"] == agent.read_entries(agent.OsFs(str(tree)), ["/sys/class/x/*"], {})


def test_a_foreign_python_runs_none_of_the_bytecode(tree: Path) -> None:
    boot = agent_command(sys.executable, True)[-1]
    ours = repr((ssh_agent.importlib.util.MAGIC_NUMBER, sys.implementation.cache_tag))
    assert ours in boot
    foreign = boot.replace(ours, repr((b"\x00\x00\r\n", "cpython-0")))
    blob = _request(root=str(tree), ops=[{"op": "write", "path": "/sys/class/x/a", "value": "new"}])
    proc = _run(foreign, blob)
    assert proc.returncode == 1
    assert proc.stdout == b""
    assert proc.stderr.strip() == FOREIGN_BYTECODE
    assert (tree / "sys/class/x/a").read_text() == "old\n"   # the write was never made


@pytest.mark.skipif(sys.version_info[:2] not in ssh_agent._LOCATION_TABLE_VERSIONS,
                    reason="location tables with columns exist on Python 3.11-3.13 only")
def test_the_shipped_code_keeps_every_line_number_and_drops_the_columns() -> None:
    src = Path(agent.__file__).read_bytes()
    full = compile(src, "vgpuvirt-agent", "exec", dont_inherit=True, optimize=2)
    lean = ssh_agent._without_columns(full)

    def walk(code: types.CodeType) -> list[types.CodeType]:
        return [code] + [c for k in code.co_consts if isinstance(k, types.CodeType) for c in walk(k)]

    pairs = list(zip(walk(full), walk(lean), strict=True))
    assert len(pairs) > 100
    for a, b in pairs:
        assert list(a.co_lines()) == list(b.co_lines()), a.co_qualname
        assert [p[0] for p in a.co_positions()] == [p[0] for p in b.co_positions()], a.co_qualname
        assert all(p[2] is None and p[3] is None for p in b.co_positions())
    assert len(lean.co_linetable) < len(full.co_linetable) / 1.5


def test_an_agent_failure_reports_its_line(tmp_path: Path) -> None:
    # an unexpected error in the shipped agent still points at the line that raised it
    boot = agent_command(sys.executable, True)[-1]
    # _answer calls it for every request (the agent's system calls are posix's: os.py is not imported)
    breaker = "import posix; posix.sched_getaffinity = None\n"
    proc = _run(boot, _request(reads=[]), breaker)
    assert proc.returncode == 1
    line = next(n for n, text in enumerate(Path(agent.__file__).read_text().splitlines(), 1)
                if "os.sched_getaffinity(0)" in text)
    assert f'File "vgpuvirt-agent", line {line}, in _answer' in proc.stderr.decode()


def test_bytecode_too_big_to_share_argv_with_a_request_goes_as_source(monkeypatch: pytest.MonkeyPatch) -> None:
    # on a Python whose location tables are not thinned the bytecode would not leave room for a 64 KiB request
    boot = agent_command(sys.executable, True)[-1]
    assert "marshal.loads" in boot and len(boot) < ssh_agent.BYTECODE_BOOTSTRAP_MAX + 1024
    monkeypatch.setattr(ssh_agent, "BYTECODE_BOOTSTRAP_MAX", 1024)
    monkeypatch.setattr(ssh_agent, "_BOOTSTRAP", {})
    assert agent_command(sys.executable, True)[-1] == agent_command(sys.executable, False)[-1]
    assert "compile(" in agent_command(sys.executable, True)[-1]
