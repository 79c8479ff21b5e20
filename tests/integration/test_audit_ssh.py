"""The host's audit log over real sshd: written by the remote agent inside the batch, in the log the host's
configuration names (the real default here: a request cannot choose it), read back in one round trip, a batch
cut mid-flight recognisable, ``vgpuvirt audit show`` on the real default log, and the three crafted request
shapes (no ``audit`` key, an exec marked ``read_only``, another log path) recorded all the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, Testbed  # type: ignore[import-not-found]

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.host import Op
from vgpuvirt.host.ssh import SSHHost

pytestmark = pytest.mark.integration


@pytest.fixture
def wtree(tmp_path: Path) -> Path:
    (tmp_path / "root/sys/class/x").mkdir(parents=True)
    (tmp_path / "root/sys/class/x/a").write_text("old\n")
    return tmp_path / "root"


DEFAULT_LOG = Path("/var/log/vgpuvirt/audit.jsonl")


def mine(records: Iterable[dict[str, Any]], wtree: Path) -> list[dict[str, Any]]:
    """The records of the batches run on this test's tree (the default log is shared by every test)."""
    recs = list(records)
    batches = {r["batch"] for r in recs if r.get("event") == "begin" and r.get("root") == str(wtree)}
    return [r for r in recs if r.get("batch") in batches]


def test_the_remote_agent_records_a_batch_with_the_ssh_client(testbed: Testbed, wtree: Path, tmp_path: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(tmp_path / "state/lock"))
    h.read(["/sys/class/x/*"])
    assert h.apply([Op.write("/sys/class/x/a", "new")]).ok
    rt = h.round_trips
    audit = h.read_audit()
    assert h.round_trips == rt + 1
    begin, op, end = mine(audit.records, wtree)
    assert begin["event"] == "begin" and begin["ssh_client"] == testbed.ssh_host and begin["uid"] == 0
    assert begin["client_user"] and begin["client_host"] and begin["pid"] != os.getpid()
    assert (op["path"], op["value"], op["outcome"]) == ("/sys/class/x/a", "new", "ok")
    assert end["event"] == "end" and begin["batch"] not in audit.incomplete()


@pytest.mark.parametrize("shape", ["no audit key", "exec marked read_only", "another log path"])
def test_a_crafted_request_over_ssh_is_recorded_all_the_same(testbed: Testbed, wtree: Path, tmp_path: Path,
                                                               shape: str) -> None:
    """The agent, not the request, decides: each shape mutates the tree and lands in the host's own log."""
    elsewhere = tmp_path / "mine" / "audit.jsonl"
    target = wtree / "sys/class/x/a"
    ops: list[dict[str, Any]] = [{"op": "write", "path": "/sys/class/x/a", "value": "crafted"}]
    if shape == "exec marked read_only":
        ops = [{"op": "exec", "argv": ["sh", "-c", f"echo crafted > {target}"], "read_only": True}]
    request: dict[str, Any] = {"root": str(wtree), "ops": ops, "on_error": "stop",
                               "lock": {"path": str(tmp_path / "state/lock"), "timeout": 30}}
    if shape == "another log path":
        request["audit"] = {"path": str(elsewhere), "id": "0123456789abcdef", "client_user": "nobody"}
    h = testbed.ssh(sysfs_root=str(wtree))
    try:
        answer = h._exchange(request, idempotent=False)
    finally:
        h.close()
    assert answer["ops"][0]["ok"], answer
    assert target.read_text().strip() == "crafted"
    assert not elsewhere.exists()
    recs = mine((json.loads(line) for line in DEFAULT_LOG.read_text().splitlines() if line.strip()), wtree)
    assert [r["event"] for r in recs] == ["begin", "op", "end"] and recs[0]["batch"] == answer["audit_batch"]
    assert recs[1]["outcome"] == "ok"


def test_a_batch_cut_mid_flight_over_ssh_leaves_begin_without_end(testbed: Testbed, wtree: Path,
                                                                   tmp_path: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(tmp_path / "state/lock"), command_timeout=60)
    h.read(["/sys/class/x/a"])                                       # the resident agent is up
    nap = f"47.{os.getpid()}{time.monotonic_ns() % 100000}"     # names this test's sleep among any others
    t = threading.Thread(target=lambda: _apply_quietly(h, nap), daemon=True)
    t.start()
    deadline = time.monotonic() + 30

    def written() -> bool:
        recs = mine((json.loads(x) for x in DEFAULT_LOG.read_text().splitlines() if x.strip()), wtree) \
            if DEFAULT_LOG.exists() else []
        return any(r.get("op") == "write" for r in recs)
    while time.monotonic() < deadline and not written():
        time.sleep(0.02)
    # the agent dies mid-batch (as with an OOM kill or a reboot): its sleep's parent is the agent
    sleeper: list[str] = []
    while time.monotonic() < deadline and not sleeper:
        sleeper = subprocess.run(["pgrep", "-f", "-x", f"sleep {nap}"], capture_output=True, text=True,
                                 check=False).stdout.split()
    assert sleeper, "the batch's exec did not start"
    agent_pid = int(Path(f"/proc/{sleeper[0]}/stat").read_text().split(")")[1].split()[1])
    os.kill(agent_pid, signal.SIGKILL)
    os.kill(int(sleeper[0]), signal.SIGKILL)
    t.join(60)
    audit = testbed.ssh(sysfs_root=str(wtree)).read_audit()
    recs = mine(audit.records, wtree)
    assert [r["event"] for r in recs] == ["begin", "op"]
    assert recs[0]["batch"] in audit.incomplete()


def _apply_quietly(h: SSHHost, nap: str) -> None:
    try:
        h.apply([Op.write("/sys/class/x/a", "new"), Op.exec(["sleep", nap])])
    except VgpuvirtError:   # the link to the killed agent (TransportError, HostError): expected here
        pass


def test_audit_show_reads_the_real_default_log_over_ssh(testbed: Testbed, wtree: Path, tmp_path: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(tmp_path / "state/lock"))
    assert h.apply([Op.write("/sys/class/x/a", "new")]).ok
    proc = subprocess.run(
        [sys.executable, "-m", "vgpuvirt", "--host", f"ssh://{testbed.ssh_user}@{testbed.ssh_host}:{testbed.ssh_port}",
         "--identity", testbed.identity, "--known-hosts", testbed.known_hosts, "audit", "show", "--since", "1h",
         "--json"], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    mine = [r for r in shown["records"] if r.get("root") == str(wtree)]
    assert len(mine) == 1 and mine[0]["event"] == "begin"
    assert stat_mode("/var/log/vgpuvirt") == 0o700 and stat_mode("/var/log/vgpuvirt/audit.jsonl") == 0o600


def stat_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777
