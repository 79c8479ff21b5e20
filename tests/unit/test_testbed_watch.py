"""The suite's watch on the testbed's libvirtd (tests/conftest.py): a libvirtd that died between two tests is
written down once, started again through ``scripts/testbed.sh start``, and reported with the tests that failed
while it died and ran again; a live one is left alone. (The whole path, a libvirtd SIGKILLed under a running
test that then fails, runs again on the new daemon and passes, was run by hand with a throwaway test: killing
the shared libvirtd from the suite would fail the other workers' tests.)"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import conftest  # type: ignore[import-not-found]
import pytest


@pytest.fixture
def watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    started: list[tuple[str, ...]] = []
    pidfile = tmp_path / "libvirtd.pid"
    log = tmp_path / "libvirtd.log"
    log.write_text("line 1\nerror : virNetSocketReadWire:1793 : End of file while reading data\n")
    new_daemon = subprocess.Popen(["sleep", "30"])

    def fake_start(*args: str) -> None:
        started.append(args)
        pidfile.write_text(f"{new_daemon.pid}\n")          # what testbed.sh start leaves: the new pid file

    monkeypatch.setattr(conftest, "_testbed_sh", fake_start)
    monkeypatch.setattr(conftest, "_DEATHS", tmp_path / "deaths.jsonl")
    monkeypatch.setattr(conftest, "_LIBVIRTD", {"pidfile": str(pidfile), "log": str(log)})
    yield {"started": started, "pidfile": pidfile, "new": new_daemon, "deaths": tmp_path / "deaths.jsonl"}
    new_daemon.kill()
    new_daemon.wait()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_live_libvirtd_is_left_alone(watch: dict[str, Any]) -> None:
    conftest._LIBVIRTD["pid"] = watch["new"].pid
    assert conftest.revive_libvirtd("tests/x.py::t") is None
    assert watch["started"] == [] and not watch["deaths"].exists()


def test_a_dead_libvirtd_is_written_down_started_again_and_reported_once(watch: dict[str, Any]) -> None:
    t0 = time.time()
    dead = _dead_pid()
    conftest._LIBVIRTD["pid"] = dead
    rec = conftest.revive_libvirtd("tests/integration/test_x.py::test_y")
    assert rec is not None and rec["pid"] == dead and rec["noticed_before"] == "tests/integration/test_x.py::test_y"
    assert "End of file while reading data" in rec["log_tail"][-1]
    assert watch["started"] == [("start",)]
    assert conftest._LIBVIRTD["pid"] == watch["new"].pid            # the next test looks at the new one
    assert conftest.revive_libvirtd("tests/x.py::next") is None and len(watch["started"]) == 1
    # a second worker noticing the same death: one report per pid, only deaths of this run
    with watch["deaths"].open("a") as f:
        f.write(json.dumps({**rec, "worker": "gw2"}) + "\n")
        f.write(json.dumps({**rec, "pid": 1, "time": t0 - 3600}) + "\n")
        f.write("not json\n")
    conftest._note_rerun(dead, "tests/integration/test_x.py::test_in_flight")
    reported = conftest._libvirtd_deaths(t0)
    assert [(r["pid"], r["ran_again"]) for r in reported] == [(dead, ["tests/integration/test_x.py::test_in_flight"])]
