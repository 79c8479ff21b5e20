"""The mutation tool of tests/mutation (docs/mutation.md) on a tiny repository made in tmp_path.

What it must get right to be worth its report: a mutant the tests can see is killed, an equivalent one
survives (so "killed" is not just "pytest was run"), every mutant it writes is valid Python and the tree
it claims, the test selection follows imports, and the repository it mutates is never written.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mutation.mutants import Mutant, mutants_of
from mutation.run import baseline, run_mutant, workers
from mutation.select import ImportGraph

REPO = Path(__file__).resolve().parents[2]

TINY = '''"""A clamp and a flag."""


def clamp(x: int) -> int:
    if x < 0:
        return 0
    return x


def bad(x: int) -> bool:
    """Docstring: never mutated."""
    return x < 0
'''
TINY_TEST = '''from pkg.tiny import bad, clamp


def test_clamp() -> None:
    assert clamp(-3) == 0
    assert clamp(4) == 4


def test_bad() -> None:
    assert bad(-1) and not bad(1)
'''


def _tiny_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "tiny.py").write_text(TINY)
    (root / "pkg" / "other.py").write_text("VALUE = 1\n")
    (root / "tests" / "test_tiny.py").write_text(TINY_TEST)
    (root / "tests" / "test_other.py").write_text("from pkg.other import VALUE\n\n\ndef test_v() -> None:\n"
                                                  "    assert VALUE == 1\n")
    return root


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _one(mutants: list[Mutant], describe: str) -> Mutant:
    found = [m for m in mutants if m.describe() == describe]
    assert len(found) == 1, [m.describe() for m in mutants]
    return found[0]


def test_mutants_of_a_small_module_are_the_listed_kinds() -> None:
    got = {m.describe() for m in mutants_of(TINY, "pkg/tiny.py")}
    assert got == {
        "pkg/tiny.py:5: x < 0 -> (x <= 0)", "pkg/tiny.py:5: 0 -> (1)", "pkg/tiny.py:5: 0 -> (-1)",
        "pkg/tiny.py:6: 0 -> (1)", "pkg/tiny.py:6: 0 -> (-1)",
        "pkg/tiny.py:12: x < 0 -> (x <= 0)", "pkg/tiny.py:12: x < 0 -> (not x < 0)",
        "pkg/tiny.py:12: 0 -> (1)", "pkg/tiny.py:12: 0 -> (-1)",
    }


SAMPLE = '''from typing import Optional


def f(items: list[int], flag: bool = True) -> Optional[int]:
    out = []
    for i in items:
        if i in (1, 2) and not flag or i is None:
            continue
        if i >= 10:
            break
        out.append(i)
    if not out:
        raise ValueError(f"nothing in {items!r}")
    table = {"a": 1, "b": 2, **{"c": 3}}
    return table.get("a")
'''


def test_every_kind_is_generated_and_each_mutant_is_the_tree_it_claims() -> None:
    mutants = mutants_of(SAMPLE, "s.py")
    assert {m.kind for m in mutants} == {"cmp", "boolop", "not", "bool", "int", "return", "delete", "dict"}
    for m in mutants:
        text = m.apply(SAMPLE)
        compile(text, "s.py", "exec")
        assert m.check(SAMPLE), m.describe()
    deletes = {m.describe() for m in mutants if m.kind == "delete"}
    assert deletes == {"s.py:8: continue -> (statement removed)", "s.py:10: break -> (statement removed)",
                       "s.py:11: out.append(i) -> (statement removed)",
                       "s.py:13: raise ValueError(f\"nothing in {items!r}\") -> (statement removed)"}
    # a ** merge is not an entry; the f-string's inside is left alone
    assert {m.original for m in mutants if m.kind == "dict"} == {'"a": 1', '"b": 2', '"c": 3'}


def test_a_wrong_splice_is_caught_by_check() -> None:
    mutants = mutants_of(TINY, "pkg/tiny.py")
    m = _one(mutants, "pkg/tiny.py:6: 0 -> (1)")
    other = _one(mutants, "pkg/tiny.py:5: 0 -> (1)")
    assert m.check(TINY)
    # the text of one 0 changed while the tree path names another: same kind, same text, wrong place
    misplaced = Mutant(m.path, m.line, m.kind, m.tree_path, m.variant, other.start, other.end, m.replacement,
                       m.original)
    assert not misplaced.check(TINY)


@pytest.mark.parametrize("rel", ["vgpuvirt/provision/search.py", "vgpuvirt/provision/bound.py"])
def test_mutants_of_real_modules_are_valid(rel: str) -> None:
    source = (REPO / rel).read_text()
    mutants = mutants_of(source, rel)
    assert len(mutants) > 20
    bad = [m.describe() for m in mutants if not m.check(source)]
    assert bad == []


def test_selection_follows_imports(tmp_path: Path) -> None:
    root = _tiny_repo(tmp_path)
    (root / "pkg" / "user.py").write_text("from pkg import tiny\n")
    (root / "tests" / "test_user.py").write_text("import pkg.user\n")
    graph = ImportGraph(root, [root / "tests"])
    assert graph.select("pkg.tiny", 0).tests == ("tests/test_tiny.py",)
    assert graph.select("pkg.tiny", 1).tests == ("tests/test_tiny.py", "tests/test_user.py")


def test_killable_mutant_is_killed_equivalent_survives_tree_untouched(tmp_path: Path) -> None:
    root = _tiny_repo(tmp_path)
    before = _digest(root)
    mutants = mutants_of(TINY, "pkg/tiny.py")
    killable = _one(mutants, "pkg/tiny.py:6: 0 -> (1)")          # clamp(-3) == 1 then
    equivalent = _one(mutants, "pkg/tiny.py:5: x < 0 -> (x <= 0)")  # clamp(0) is 0 either way
    tests = ImportGraph(root, [root / "tests"]).select("pkg.tiny", 1).tests
    assert tests == ("tests/test_tiny.py",)
    with workers(root, 1) as (w,):
        assert w.root != root
        b = baseline(w, tests, "")
        assert b.ok and b.deselect == ()
        assert set(b.file_seconds) == {"tests/test_tiny.py"}
        killed = run_mutant(w, killable, tests, b, "", 60)
        survived = run_mutant(w, equivalent, tests, b, "", 60)
        # the copy is put back after each mutant
        assert (w.root / "pkg" / "tiny.py").read_text() == TINY
    assert (killed.status, survived.status) == ("killed", "survived")
    assert killed.detail == "tests/test_tiny.py::test_clamp"
    assert _digest(root) == before


def test_a_test_failing_before_any_mutation_is_deselected_not_a_kill(tmp_path: Path) -> None:
    root = _tiny_repo(tmp_path)
    broken = "\n\ndef test_broken() -> None:\n    assert clamp(1) == 2\n"
    (root / "tests" / "test_tiny.py").write_text(TINY_TEST + broken)
    m = _one(mutants_of(TINY, "pkg/tiny.py"), "pkg/tiny.py:5: x < 0 -> (x <= 0)")
    with workers(root, 1) as (w,):
        b = baseline(w, ("tests/test_tiny.py",), "")
        assert b.ok and b.deselect == ("tests/test_tiny.py::test_broken",)
        assert run_mutant(w, m, ("tests/test_tiny.py",), b, "", 60).status == "survived"


@pytest.mark.slow
def test_the_command_reports_and_exits_zero_unless_fail_under(tmp_path: Path) -> None:
    root = _tiny_repo(tmp_path)
    before = _digest(root)
    out = tmp_path / "out.json"
    argv = [sys.executable, "-m", "tests.mutation", "--root", str(root), "--paths", "pkg/tiny.py", "--tests",
            "tests", "--jobs", "2", "--json", str(out), "--marker", ""]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "pkg/tiny.py:5: x < 0 -> (x <= 0)" in run.stdout          # listed as a survivor
    data = json.loads(out.read_text())
    status = {o["describe"]: o["status"] for o in data["outcomes"]}
    assert status["pkg/tiny.py:6: 0 -> (1)"] == "killed"
    assert status["pkg/tiny.py:12: x < 0 -> (not x < 0)"] == "killed"
    assert data["tests"]["pkg/tiny.py"] == ["tests/test_tiny.py"]
    assert _digest(root) == before
    failing = subprocess.run([*argv, "--fail-under", "100"], cwd=REPO, capture_output=True, text=True,
                             env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert failing.returncode == 1
    # a rerun of the survivors alone runs exactly those
    again = tmp_path / "again.json"
    rerun = subprocess.run([*argv[:-4], "--survivors-of", str(out), "--json", str(again), "--marker", ""],
                           cwd=REPO, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    survivors = {o["id"] for o in data["outcomes"] if o["status"] == "survived"}
    assert survivors and {o["id"] for o in json.loads(again.read_text())["outcomes"]} == survivors
