"""The agent ships in parts: a request carries the core and only the parts it runs (a read: the core alone).

The guarantees: the core calls into a part only from the places listed here (each behind the condition that
``parts_needed`` names), parts call into no other part but where listed, a request answered by the parts the
client picks equals the whole agent's answer, and a request whose part is missing is refused before anything
is done. The empty request, the agent's start, loads neither os.py nor half of the agent.
"""

from __future__ import annotations

import ast
import base64
import json
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.host import agent
from vgpuvirt.host.ssh_agent import agent_command, agent_parts, agent_source

#: where the core calls a part's code: (calling function, part's name) -> the condition that guards it there
CORE_CALLS_INTO_PARTS = {
    ("handle", "read_audit"): "audit_read in the request",
    ("handle", "OsFs"): "the writes: a request that parts_needed sends the ops part for",
    ("handle", "_batch"): "ops or reads_after",
    ("main", "serve"): "--serve: the resident agent, sent whole",
}
#: where a part calls another part's code
PART_CALLS_INTO_PARTS = {("ops", "_run_op", "nvml_call"): "an nvml op"}


def _top_level() -> tuple[dict[str, str | None], list[tuple[str | None, str, set[str]]]]:
    """(name -> the part defining it, None for the core), [(part, statement's name, names it loads)]."""
    src = agent_source()
    part_of_line: list[str | None] = [None]
    for name, lines in agent_parts(src):
        part_of_line += [name] * len(lines)
    defined: dict[str, str | None] = {}
    uses: list[tuple[str | None, str, set[str]]] = []
    for stmt in ast.parse(src).body:
        part = part_of_line[stmt.lineno]
        names: set[str] = set()
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        defined.update(dict.fromkeys(names, part))
        loaded = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        uses.append((part, getattr(stmt, "name", "<module level>"), loaded))
    return defined, uses


def test_the_core_and_the_parts_call_each_other_only_where_listed() -> None:
    defined, uses = _top_level()
    core_calls = set()
    part_calls = set()
    for part, where, loaded in uses:
        for name in loaded:
            home = defined.get(name, part)
            if home is None or home == part:
                continue
            if part is None:
                core_calls.add((where, name))
            else:
                part_calls.add((part, where, name))
    # a new call from the core into a part must come with parts_needed's condition for it, and a line here
    assert core_calls == set(CORE_CALLS_INTO_PARTS)
    assert part_calls == set(PART_CALLS_INTO_PARTS)
    for part, mark in agent.PART_MARKS.items():
        assert defined[mark] == part, f"{mark} must be defined in part {part!r}"
    assert {name for name, _ in agent_parts(agent_source())} - {None} == set(agent.PART_MARKS)


def test_a_part_left_open_or_closed_by_another_name_is_refused() -> None:
    with pytest.raises(ValueError, match="never closed"):
        agent_parts(b'x = 1\n# >>> agent part "ops"\ny = 2\n')
    with pytest.raises(ValueError, match="closes part 'nvml', open: 'ops'"):
        agent_parts(b'# >>> agent part "ops"\n# <<< agent part "nvml"\n')
    with pytest.raises(ValueError, match="opens inside part 'ops'"):
        agent_parts(b'# >>> agent part "ops"\n# >>> agent part "nvml"\n')
    with pytest.raises(ValueError, match="no part"):
        agent_source(["gpu"])


def test_a_part_left_out_keeps_every_other_line_where_it_was() -> None:
    whole = agent_source().splitlines()
    core = agent_source([]).splitlines()
    assert len(core) == len(whole)
    kept = [a == b for a, b in zip(whole, core, strict=True)]
    assert all(kept[n] or not core[n] for n in range(len(core)))   # a line is the file's, or blank
    assert sum(kept) < 0.6 * len(whole)


def _run(argv: list[str], request: dict[str, Any], prefix: str = "") -> subprocess.CompletedProcess[bytes]:
    blob = base64.b64encode(zlib.compress(json.dumps(request).encode())).decode()
    return subprocess.run([*argv[:-1], prefix + argv[-1], blob], capture_output=True, stdin=subprocess.DEVNULL,
                          check=False)


def _answer(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    answer.pop("agent_s")
    answer.pop("lock_wait_s", None)
    return answer


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    d = tmp_path / "sys/class/x"
    d.mkdir(parents=True)
    (d / "a").write_text("7\n")
    (d / "b").write_text("old\n")
    (d / "link").symlink_to("a")
    return tmp_path


def _requests(root: Path) -> dict[str, dict[str, Any]]:
    lock = {"path": str(root / "state" / "lock"), "timeout": 5}
    return {
        "empty": {},
        "reads": {"root": str(root), "reads": ["/sys/class/x/*"]},
        "checks": {"root": str(root), "ops": [{"op": "check_int", "path": "/sys/class/x/a", "min": 5},
                                              {"op": "check_absent", "path": "/sys/class/x/c"},
                                              {"op": "wait", "path": "/sys/class/x/b", "state": "exists"}],
                   "on_error": "continue", "lock": lock, "reads_after": ["/sys/class/x/a"]},
        "reads after": {"root": str(root), "reads_after": ["/sys/class/x/b"]},
        "a read-only program": {"root": str(root), "ops": [{"op": "exec", "argv": ["nvidia-smi", "-q", "-x"]}],
                                "on_error": "continue"},
        "nvml": {"root": str(root), "ops": [{"op": "nvml", "value": "vgpu_scheduler_get",
                                             "argv": ["0000:00:00.0"]}], "on_error": "continue"},
    }


@pytest.mark.parametrize("bytecode", [True, False])
def test_the_parts_a_request_needs_answer_as_the_whole_agent(tree: Path, bytecode: bool) -> None:
    for what, request in _requests(tree).items():
        needed = agent.parts_needed(request)
        whole = _answer(_run(agent_command(sys.executable, bytecode), request))
        part = _answer(_run(agent_command(sys.executable, bytecode, needed), request))
        assert part == whole, what
        assert "fatal" not in whole, (what, whole)
    assert agent.parts_needed(_requests(tree)["reads"]) == []
    assert agent.parts_needed(_requests(tree)["nvml"]) == ["ops", "nvml"]


def test_a_request_sent_without_a_part_it_needs_is_refused_before_anything_is_done(tree: Path) -> None:
    write = {"root": str(tree), "ops": [{"op": "write", "path": "/sys/class/x/b", "value": "new"}]}
    answer = _answer(_run(agent_command(sys.executable, True, []), write))
    assert answer["fatal"] == "agent"
    assert answer["error"] == "this agent was sent without its part(s) ops, which the request needs: nothing was done"
    assert (tree / "sys/class/x/b").read_text() == "old\n"
    nvml = _requests(tree)["nvml"]
    answer = _answer(_run(agent_command(sys.executable, True, ["ops"]), nvml))
    assert answer["error"].startswith("this agent was sent without its part(s) nvml,")
    serve = agent_command(sys.executable, True, ["ops", "nvml"])
    proc = subprocess.run([*serve, "--serve"], capture_output=True, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == "vgpuvirt-agent: sent without its resident part (--serve)"


# prints, at exit, whether os.py was imported and how many of the agent's functions were defined
_WHAT_RAN = ("import sys, atexit\n"
             "atexit.register(lambda: sys.stderr.write('os=%s functions=%d' % ('os' in sys.modules, "
             "sum(type(v).__name__ == 'function' for v in vars(sys.modules['__main__']).values()))))\n")


def test_a_read_loads_neither_os_nor_the_parts_it_does_not_run() -> None:
    seen = {}
    options: tuple[list[str] | None, ...] = ([], None)
    for parts in options:
        # (on a host, root is /: a confined root, as the tests' trees, needs os.path to resolve it)
        proc = _run(agent_command(sys.executable, True, parts), {"reads": ["/proc/sys/kernel/*"]}, _WHAT_RAN)
        assert proc.returncode == 0, proc.stderr
        seen[parts is None] = proc.stderr.decode()
    core_os, core_functions = (w.split("=")[1] for w in seen[False].split())
    all_os, all_functions = (w.split("=")[1] for w in seen[True].split())
    assert core_os == all_os == "False"
    assert int(core_functions) < 0.6 * int(all_functions)
