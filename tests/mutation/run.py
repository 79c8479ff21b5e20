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
    module_path: str
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()
    seconds: float = 0.0
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


def baseline(w: Worker, module_path: str, tests: tuple[str, ...], marker: str) -> Baseline:
    """Run the selection on the unmutated copy; tests failing there are left out of the mutants' runs."""
    b = Baseline(module_path, tests)
    if not tests:
        b.ok, b.detail = False, "no test file imports it"
        return b
    env = dict(w.env)
    rc, out, secs = _run(_pytest_argv(tests, (), marker, False), w.root, env, None)
    b.seconds = secs
    if rc == 5:
        b.ok, b.detail = False, "no test selected"
    elif rc == 1:
        b.deselect = tuple(_failures(out))
        rc, out, secs = _run(_pytest_argv(tests, b.deselect, marker, False), w.root, env, None)
        b.seconds = secs
        if rc != 0:
            b.ok, b.detail = False, f"baseline fails even without {len(b.deselect)} failing tests: {out[-300:]}"
    elif rc != 0:
        b.ok, b.detail = False, f"baseline exit {rc}: {out.strip()[-300:]}"
    return b


def run_mutant(w: Worker, m: Mutant, b: Baseline, marker: str, timeout: float) -> Outcome:
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
        rc, out, secs = _run(_pytest_argv(b.tests, b.deselect, marker, True), w.root, env, timeout)
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
