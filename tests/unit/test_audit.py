"""The audit trail: the host's log written by the agent inside each mutating batch, the client's own log,
and ``vgpuvirt audit show``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.errors import HostError, LibvirtError
from vgpuvirt.host import LocalHost, Op
from vgpuvirt.host.base import DEFAULT_AUDIT_PATH, BaseHost
from vgpuvirt.sim import SimHost

ATTR = "/sys/class/x/a"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sys/class/x").mkdir(parents=True)
    (root / "sys/class/x/a").write_text("old\n")
    (root / "sys/class/x/n").write_text("3\n")
    return root


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "log" / "audit.jsonl"


@pytest.fixture
def host(tree: Path, tmp_path: Path, log: Path) -> LocalHost:
    return LocalHost(str(tree), lock_path=str(tmp_path / "state" / "lock"), audit_path=str(log))


def records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def client_records() -> list[dict[str, object]]:
    path = Path(os.environ["VGPUVIRT_AUDIT_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_default_host_log_is_root_only_under_var_log() -> None:
    assert DEFAULT_AUDIT_PATH == "/var/log/vgpuvirt/audit.jsonl"
    assert BaseHost.__dict__["audit_path"] != ""


def test_a_mutating_batch_is_recorded_begin_ops_end_with_who_and_outcome(host: LocalHost, log: Path) -> None:
    res = host.apply([Op.check_int("/sys/class/x/n", 1), Op.write(ATTR, "new"), Op.write("/sys/class/x/gone", "1")],
                     on_error="continue")
    assert [r.ok for r in res] == [True, True, False]
    recs = records(log)
    assert [r["event"] for r in recs] == ["begin", "op", "op", "end"]       # the check is not recorded
    begin, ok, failed, end = recs
    assert {r["batch"] for r in recs} == {begin["batch"]} and len(str(begin["batch"])) == 16
    assert begin["pid"] == os.getpid() and begin["uid"] == os.geteuid() and begin["ops"] == 2
    assert begin["client_user"] and begin["client_host"] and begin["root"] == host.sysfs_root
    assert str(begin["t"]).endswith("Z")
    assert (ok["op"], ok["path"], ok["value"], ok["outcome"]) == ("write", ATTR, "new", "ok")
    assert (failed["outcome"], failed["errno"], failed["path"]) == ("failed", 2, "/sys/class/x/gone")
    assert (end["ok"], end["failed"], end["skipped"]) == (2, 1, 0)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700


def test_skipped_ops_and_mutating_execs_are_recorded(host: LocalHost, log: Path) -> None:
    host.apply([Op.write("/sys/class/x/gone", "1"), Op.exec(["true"]), Op.exec(["true"], read_only=True)])
    ops = [r for r in records(log) if r["event"] == "op"]
    assert [(r["op"], r["outcome"]) for r in ops] == [("write", "failed"), ("exec", "skipped")]
    assert ops[1]["argv"] == ["true"]


def test_a_long_value_is_recorded_truncated(host: LocalHost, log: Path) -> None:
    host.apply([Op.write(ATTR, "v" * 5000)])
    value = str(records(log)[1]["value"])
    assert len(value) < 300 and value.endswith("(5000 chars)")


def test_reads_and_read_only_batches_write_nothing(host: LocalHost, log: Path) -> None:
    host.read(["/sys/class/x/*"])
    host.apply([Op.check_int("/sys/class/x/n", 1), Op.exec(["true"], read_only=True)],
               reads_after=["/sys/class/x/a"])
    assert not log.parent.exists()
    assert host.read_audit().records == ()          # reading a missing log creates nothing either
    assert not log.parent.exists()


@pytest.mark.parametrize("plant", ["world-writable", "link-dir", "link-file"])
def test_an_unsafe_audit_location_refuses_the_batch(tree: Path, tmp_path: Path, log: Path, plant: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "audit.jsonl").write_text("keep\n")
    if plant == "world-writable":
        log.parent.mkdir()
        os.chmod(log.parent, 0o777)
    elif plant == "link-dir":
        log.parent.symlink_to(victim)
    else:
        log.parent.mkdir(mode=0o700)
        log.symlink_to(victim / "audit.jsonl")
    h = LocalHost(str(tree), lock_path=str(tmp_path / "state" / "lock"), audit_path=str(log))
    with pytest.raises(HostError, match="unsafe lock or audit location") as info:
        h.apply([Op.write(ATTR, "new")])
    assert "\n" not in str(info.value)
    assert (tree / ATTR.lstrip("/")).read_text() == "old\n"         # nothing of the batch ran
    assert (victim / "audit.jsonl").read_text() == "keep\n"


_CUT = """
import sys
from vgpuvirt.host import LocalHost, Op
root, lock, log = sys.argv[1:]
LocalHost(root, lock_path=lock, audit_path=log).apply([Op.write("/sys/class/x/a", "new"), Op.exec(["sleep", "60"])])
"""


def test_a_batch_cut_mid_flight_is_recognisable(host: LocalHost, tree: Path, tmp_path: Path, log: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CUT, str(tree), str(tmp_path / "state" / "lock"), str(log)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (log.exists() and '"op":"write"' in log.read_text()):
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    audit = host.read_audit()
    assert [r["event"] for r in audit.records] == ["begin", "op"]
    assert audit.incomplete() == [audit.records[0]["batch"]]


def test_audit_show_prints_the_host_log_as_plain_text(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    LocalHost(str(tree)).apply([Op.write(ATTR, "\x1b]8;;http://x\x07red\x1b[31m[/x]")])   # the CLI's default log
    assert main(["--sysfs-root", str(tree), "audit", "show"]) == 0
    out = capsys.readouterr().out
    assert "write /sys/class/x/a" in out and " begin " in out and " end " in out
    assert "\x1b" not in out and "\x07" not in out and "\\u001b[31m[/x]" in out
    assert "INCOMPLETE" not in out


def test_audit_show_json_and_since(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    LocalHost(str(tree)).apply([Op.write(ATTR, "new")])
    assert main(["--sysfs-root", str(tree), "audit", "show", "--json", "--since", "10m"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["event"] for r in shown["records"]][-3:] == ["begin", "op", "end"]
    assert shown["incomplete"] == []
    assert main(["--sysfs-root", str(tree), "audit", "show", "--json", "--since", "2999-01-01"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == []


@pytest.mark.parametrize("since", ["yesterday", "10x", "2026-13-45", "1h; rm -rf /"])
def test_audit_show_refuses_a_bad_since_in_one_line(since: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "show", "--since", since]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--since" in err


def test_a_simulated_host_keeps_its_audit_log_in_memory() -> None:
    sim = SimHost.from_profile("t4x2")
    sim.apply([Op.write("/sys/nonexistent", "1")])
    recs = sim.read_audit().records
    assert [(r["event"], r.get("outcome")) for r in recs] == [("begin", None), ("op", "failed"), ("end", None)]


# ---------------------------------------------------------------- the client's log
def test_run_is_recorded_with_its_exit_status_in_the_client_log(host: LocalHost) -> None:
    host.run(["true"])
    host.run(["vgpuvirt-no-such-program"])
    runs = [r for r in client_records() if r["action"] == "run"][-2:]
    assert [(r["argv"], r["outcome"], r["target"]) for r in runs] == [
        (["true"], "exit 0", "local"), (["vgpuvirt-no-such-program"], "exit 127", "local")]
    assert all(r["user"] and r["pid"] == os.getpid() for r in runs)


def test_a_batch_is_recorded_in_the_client_log_with_the_hosts_batch_id(host: LocalHost, log: Path) -> None:
    host.apply([Op.write(ATTR, "new")])
    rec = [r for r in client_records() if r["action"] == "apply"][-1]
    assert rec["batch"] == records(log)[0]["batch"] and rec["outcome"] == "ok"
    assert Path(os.environ["VGPUVIRT_AUDIT_LOG"]).stat().st_mode & 0o077 == 0


def test_libvirt_calls_are_recorded_with_their_outcome() -> None:
    pytest.importorskip("libvirt")
    from vgpuvirt.libvirt_conn import LibvirtConnection, no_retry
    conn = LibvirtConnection("test:///default", retry=no_retry)
    name = "audit-" + os.urandom(4).hex()
    xml = (f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
           "<os><type>hvm</type></os><devices/></domain>")
    conn.define(xml)
    conn.start(name)
    conn.destroy(name)
    conn.undefine(name)
    with pytest.raises(LibvirtError):
        conn.define(xml.replace("<memory unit='MiB'>64</memory>", "<memory unit='MiB'>64</memory><uuid>bad</uuid>"))
    recs = [r for r in client_records() if r.get("domain") == name]
    assert [(r["action"], r["outcome"]) for r in recs] == [
        ("define domain", "ok"), ("start domain", "ok"), ("destroy domain", "ok"), ("undefine domain", "ok"),
        ("define domain", "failed")]
    assert recs[-1]["code"] and "uuid" in str(recs[-1]["error"]).lower()
