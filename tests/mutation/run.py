"""Running mutants: one copy of the repository per worker, each mutant written into a copy, its tests run.

The working tree is never written: each worker copies the repository once into a temporary folder
(without .git and caches; ``.venv`` stays a link) and writes a mutant's module there, runs the selected
tests with the copy first on ``PYTHONPATH``, and puts the original text back. Copies are per worker, so
``--jobs`` workers never share a file. ``../shared`` (tests read the peers' data from there) is linked
next to each copy.

A mutant is *killed* only when a selected test fails (pytest exit 1, or 2 when collection fails because
the mutant broke an import): the tests ran first on the unmutated copy (the baseline), and tests failing
there are deselected, so an unrelated failure never counts as a kill. A run longer than the timeout
(derived from the baseline) is *timed out*, reported apart.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from .mutants import Mutant

_IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                                 ".hypothesis", "*.egg-info", "build", "dist", "node_modules")


@dataclass
class Outcome:
    mutant: Mutant
    status: str               # killed, survived, timeout, error
    seconds: float
    detail: str = ""          # the first failing test (killed) or what went wrong (error)


@dataclass
class Baseline:
    """The selected tests run once, unmutated: what fails already, and how long each file takes."""

    deselect: tuple[str, ...] = ()
    file_seconds: dict[str, float] = field(default_factory=dict)
    ok: bool = True
    detail: str = ""


@dataclass
class Worker:
    root: Path                # the copy's repository root
    env: dict[str, str] = field(default_factory=dict)


def _pytest_argv(tests: tuple[str, ...], deselect: tuple[str, ...], marker: str, first_failure: bool) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header",
            "-rfE", "-W", "ignore::pytest.PytestUnknownMarkWarning"]
    if marker:
        argv += ["-m", marker]
    if first_failure:
        argv.append("-x")
    for d in deselect:
        argv += ["--deselect", d]
    return argv + list(tests)


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float | None) -> tuple[int | None, str, float]:
    """(exit status or None on timeout, output, seconds). A timed-out run's process group is killed."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out, time.monotonic() - t0


def _failures(output: str) -> list[str]:
    found = []
    for line in output.splitlines():
        for word in ("FAILED ", "ERROR "):
            if line.startswith(word):
                found.append(line[len(word):].split(" - ")[0].strip())
    return found


@contextmanager
def workers(root: Path, jobs: int) -> Iterator[list[Worker]]:
    tmp = Path(tempfile.mkdtemp(prefix="vgpuvirt-mutation-"))
    try:
        made = []
        for j in range(jobs):
            base = tmp / f"w{j}"
            copy_root = base / root.name
            shutil.copytree(root, copy_root, symlinks=True, ignore=_IGNORE)
            shared = root.parent / "shared"
            if shared.is_dir():
                (base / "shared").symlink_to(shared)
            env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTHONPATH")}
            env.update(PYTHONPATH=str(copy_root), PYTHONHASHSEED="0")
            made.append(Worker(copy_root, env))
        yield made
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_copy(w: Worker, package: str) -> None:
    """The copy's modules are the ones imported (not an installed or editable one elsewhere)."""
    if not package:
        return
    rc, out, _ = _run([sys.executable, "-c", f"import {package}; print({package}.__file__)"], w.root, w.env, 120)
    if rc != 0 or not Path(out.strip().splitlines()[-1]).resolve().is_relative_to(w.root.resolve()):
        raise RuntimeError(f"the copy's {package} is not the one imported: {out.strip()[-300:]}")


def _file_seconds(junit: Path, files: tuple[str, ...]) -> dict[str, float]:
    """Seconds per test file from pytest's JUnit XML (a test's classname is its file's dotted path)."""
    by_dotted = {f.removesuffix(".py").replace("/", "."): f for f in files}
    out = dict.fromkeys(files, 0.0)
    if not junit.is_file():
        return out
    for case in ElementTree.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        for i in range(len(parts), 0, -1):
            f = by_dotted.get(".".join(parts[:i]))
            if f is not None:
                out[f] += float(case.get("time", "0") or 0)
                break
    return out


def baseline(w: Worker, tests: tuple[str, ...], marker: str) -> Baseline:
    """Run ``tests`` on the unmutated copy; tests failing there are left out of the mutants' runs."""
    b = Baseline()
    if not tests:
        return b
    junit = w.root.parent / f"baseline-{os.getpid()}-{id(tests)}.xml"
    argv = [*_pytest_argv(tests, (), marker, False), f"--junitxml={junit}"]
    rc, out, _ = _run(argv, w.root, w.env, None)
    if rc == 1:
        b.deselect = tuple(_failures(out))
        rc, out, _ = _run([*_pytest_argv(tests, b.deselect, marker, False), f"--junitxml={junit}"], w.root, w.env,
                          None)
    if rc not in (0, 5):
        b.ok, b.detail = False, f"baseline exit {rc} (after deselecting {len(b.deselect)}): {out.strip()[-300:]}"
    b.file_seconds = _file_seconds(junit, tests)
    return b


def merge(parts: list[Baseline]) -> Baseline:
    b = Baseline()
    for p in parts:
        b.deselect += p.deselect
        b.file_seconds.update(p.file_seconds)
        if not p.ok:
            b.ok, b.detail = False, p.detail
    return b


def run_mutant(w: Worker, m: Mutant, tests: tuple[str, ...], b: Baseline, marker: str, timeout: float) -> Outcome:
    target = w.root / m.path
    original = target.read_text(encoding="utf-8")
    cached = target.parent / "__pycache__"
    env = dict(w.env, PYTHONDONTWRITEBYTECODE="1")

    def drop_pyc() -> None:
        # the baseline cached the original's bytecode; a same-size edit in the same second would reuse it
        for pyc in cached.glob(f"{target.stem}.*.pyc"):
            pyc.unlink()

    try:
        drop_pyc()
        target.write_text(m.apply(original), encoding="utf-8")
        rc, out, secs = _run(_pytest_argv(tests, b.deselect, marker, True), w.root, env, timeout)
    finally:
        target.write_text(original, encoding="utf-8")
        drop_pyc()
    if rc is None:
        return Outcome(m, "timeout", secs)
    if rc == 0:
        return Outcome(m, "survived", secs)
    if rc in (1, 2):
        fails = _failures(out)
        return Outcome(m, "killed", secs, fails[0] if fails else f"exit {rc}")
    return Outcome(m, "error", secs, f"pytest exit {rc}: {out.strip()[-300:]}")


def run_all(pool: list[Worker], tasks: list[Callable[[Worker], object]]) -> list[object]:
    """Run each task on a free worker copy, ``len(pool)`` at a time, results in task order."""
    free: queue.Queue[Worker] = queue.Queue()
    for w in pool:
        free.put(w)

    def one(task: Callable[[Worker], object]) -> object:
        w = free.get()
        try:
            return task(w)
        finally:
            free.put(w)

    with ThreadPoolExecutor(max_workers=len(pool)) as ex:
        return list(ex.map(one, tasks))
