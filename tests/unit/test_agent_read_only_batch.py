"""A read-only batch in the agent (a metrics collection): its programs run at once, next to its reads, and its
``reads_after`` use the forked readers; any other batch keeps the one-op-after-another order.

Which programs are read-only the agent decides (its table, not the request's ``read_only``); the mechanism is
tested here with ordinary programs, which the ``known`` fixture adds to that table's judgement."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.host import agent

READS = ["/sys/bus/pci/devices/*", "/sys/bus/pci/devices/*/vendor", "/sys/bus/pci/devices/*/physfn",
         "/sys/bus/pci/devices/*/mdev_supported_types/*/available_instances"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A PF with 40 VFs (more than the agent's SPLIT_MIN), each an mdev parent with two types."""
    pci = tmp_path / "sys/bus/pci/devices"
    pf = pci / "0000:3b:00.0"
    pf.mkdir(parents=True)
    (pf / "vendor").write_text("0x10de\n")
    for n in range(40):
        vf = pci / f"0000:3b:{1 + n // 8:02x}.{n % 8}"
        for t in ("nvidia-1", "nvidia-2"):
            (vf / "mdev_supported_types" / t).mkdir(parents=True)
            (vf / "mdev_supported_types" / t / "available_instances").write_text(f"{n % 2}\n")
        (vf / "vendor").write_text("0x10de\n")
        (vf / "physfn").symlink_to("../0000:3b:00.0")
    return tmp_path


#: the programs these tests let the agent take as read-only (``env`` stays unknown: a mutating exec)
TEST_READERS = {"sh", "touch", "sleep", "true", "python3", "no-such-tool"}


@pytest.fixture(autouse=True)
def known(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = agent.mutates

    def mutates(op: dict[str, Any]) -> bool:
        argv = op.get("argv")
        if op.get("op") == "exec" and isinstance(argv, list) and argv and isinstance(argv[0], str) \
                and argv[0].rsplit("/", 1)[-1] in TEST_READERS:
            return False
        return judge(op)
    monkeypatch.setattr(agent, "mutates", mutates)


def _exec(argv: list[str], *, timeout: float = 30.0, **extra: Any) -> dict[str, Any]:
    return {"op": "exec", "argv": argv, "timeout": timeout, "read_only": True, **extra}


def _waits_for(flag: Path) -> list[str]:
    # ends when ``flag`` exists: it only finishes if another op of the batch, later in order, runs meanwhile
    return ["sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.01; done; echo seen', "sh", str(flag)]


def test_the_programs_of_a_read_only_batch_run_at_the_same_time(tree: Path) -> None:
    flag = tree / "flag"
    out = agent.handle({"root": str(tree), "on_error": "continue", "reads_after": READS,
                        "ops": [_exec(_waits_for(flag)), _exec(["touch", str(flag)])]})
    assert [(r["ok"], r["rc"]) for r in out["ops"]] == [(True, 0), (True, 0)]
    assert out["ops"][0]["stdout"] == "seen\n"
    assert out["after"] == agent.read_entries(agent.OsFs(str(tree)), READS, {})


@pytest.mark.parametrize("why", ["on_error=stop", "group", "a mutating exec", "a write"])
def test_any_other_batch_runs_its_ops_one_after_another(tree: Path, why: str) -> None:
    flag = tree / "flag"
    first, second = _exec(_waits_for(flag), timeout=0.5), _exec(["touch", str(flag)])
    on_error = "stop" if why == "on_error=stop" else "continue"
    if why == "group":
        first["group"] = "g"
    if why == "a mutating exec":
        second["argv"] = ["env", *second["argv"]]      # a program the agent does not know as read-only
    ops = [first, second]
    if why == "a write":
        (tree / "attr").write_text("0\n")
        ops.append({"op": "write", "path": "/attr", "value": "1"})
    out = agent.handle({"root": str(tree), "on_error": on_error, "ops": ops})
    # in order, the first waits for a flag that only the second makes: it times out
    assert out["ops"][0]["errno"] == errno.ETIMEDOUT and out["ops"][0]["rc"] == -9
    assert out["ops"][1]["ok"] is (on_error == "continue")


def test_a_read_only_batch_keeps_each_programs_timeout_and_missing_programs(tree: Path) -> None:
    out = agent.handle({"root": str(tree), "on_error": "continue",
                        "ops": [_exec(["sleep", "30"], timeout=0.3), _exec([str(tree / "no-such-tool")]),
                                _exec(["sh", "-c", "cat; exit 6"], stdin="in", ok_codes=[0, 6]),
                                _exec(["sh", "-c", "echo err >&2; exit 3"]), _exec([])]})
    slept, missing, fed, failed, bad = out["ops"]
    assert (slept["ok"], slept["rc"], slept["errno"]) == (False, -9, errno.ETIMEDOUT)
    assert (missing["ok"], missing["rc"], missing["errno"]) == (False, 127, errno.ENOENT)
    assert (fed["ok"], fed["rc"], fed["stdout"]) == (True, 6, "in")
    assert (failed["ok"], failed["rc"], failed["stderr"], failed["error"]) == (False, 3, "err\n", "sh exited 3")
    assert (bad["ok"], bad["errno"]) == (False, errno.EINVAL)


def test_a_large_output_does_not_stall_the_batch(tree: Path) -> None:
    # more than a pipe's default 64 KiB, from several programs read one after another
    big = ["python3", "-c", "import sys; sys.stdout.write('x' * 300000)"]
    out = agent.handle({"root": str(tree), "on_error": "continue", "ops": [_exec(big), _exec(big), _exec(big)]})
    assert [len(r["stdout"]) for r in out["ops"]] == [300000] * 3


@pytest.mark.parametrize("mutating", [False, True])
def test_the_standalone_agent_reads_after_a_read_only_batch_in_parallel(
        tree: Path, mutating: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = agent.read_entries(agent.OsFs(str(tree)), READS, {})
    # dmesg is in the agent's own table (the standalone agent has no test fixture); env is not
    req = {"root": str(tree), "on_error": "continue", "workers": 3, "reads": READS[:2], "reads_after": READS,
           "ops": [_exec(["env", "true"] if mutating else ["dmesg"])]}
    if not mutating:       # (a mutating batch there would write the machine's own audit log)
        proc = subprocess.run([sys.executable, "-I", "-S", agent.__file__], input=json.dumps(req).encode(),
                              capture_output=True, check=True, timeout=60)
        out = json.loads(proc.stdout)
        assert out["after"] == serial and out["ops"][0]["ok"]
        assert out["entries"] == agent.read_entries(agent.OsFs(str(tree)), READS[:2], {})
    # which batches fork readers for reads_after: read-only ones only
    forks: list[int] = []
    real_fork = agent.os.fork
    monkeypatch.setattr(agent.os, "fork", lambda: forks.append(1) or real_fork())
    fragments: dict[str, list[str]] = {}
    agent.handle({**req, "reads": []}, workers=3, encoded=(fragments, json.dumps))
    assert (len(forks) > 0) is (not mutating)
    assert bool(fragments.get("after")) is (not mutating)
