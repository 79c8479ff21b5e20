"""The host's audit log over real sshd: written by the remote agent inside the batch, read back in one round
trip, a batch cut mid-flight recognisable, and ``vgpuvirt audit show`` on the real default log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def test_the_remote_agent_records_a_batch_with_the_ssh_client(testbed: Testbed, wtree: Path, tmp_path: Path) -> None:
    log = tmp_path / "log" / "audit.jsonl"
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(tmp_path / "state/lock"), audit_path=str(log))
    h.read(["/sys/class/x/*"])
    assert not log.parent.exists()                       # a read writes nothing
    assert h.apply([Op.write("/sys/class/x/a", "new")]).ok
    rt = h.round_trips
    audit = h.read_audit()
    assert h.round_trips == rt + 1
    begin, op, end = audit.records
    assert begin["event"] == "begin" and begin["ssh_client"] == testbed.ssh_host and begin["uid"] == 0
    assert begin["client_user"] and begin["client_host"] and begin["pid"] != os.getpid()
    assert (op["path"], op["value"], op["outcome"]) == ("/sys/class/x/a", "new", "ok")
    assert end["event"] == "end" and audit.incomplete() == []


def test_a_batch_cut_mid_flight_over_ssh_leaves_begin_without_end(testbed: Testbed, wtree: Path,
                                                                   tmp_path: Path) -> None:
    log = tmp_path / "log" / "audit.jsonl"
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(tmp_path / "state/lock"), audit_path=str(log),
                    command_timeout=60)
    h.read(["/sys/class/x/a"])                                       # the resident agent is up
    nap = f"47.{os.getpid()}{time.monotonic_ns() % 100000}"     # names this test's sleep among any others
    t = threading.Thread(target=lambda: _apply_quietly(h, nap), daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (log.exists() and '"op":"write"' in log.read_text()):
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
    audit = testbed.ssh(sysfs_root=str(wtree), audit_path=str(log)).read_audit()
    assert [r["event"] for r in audit.records] == ["begin", "op"]
    assert audit.incomplete() == [audit.records[0]["batch"]]


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
