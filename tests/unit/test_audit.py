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
    """An exec is read-only when the agent knows its program and arguments (dmesg), not because the request
    says so: ``true`` marked read_only is recorded like any exec."""
    host.apply([Op.write("/sys/class/x/gone", "1"), Op.exec(["true"]), Op.exec(["true"], read_only=True),
                Op.exec(["dmesg"], read_only=True)])
    ops = [r for r in records(log) if r["event"] == "op"]
    assert [(r["op"], r["outcome"]) for r in ops] == [("write", "failed"), ("exec", "skipped"), ("exec", "skipped")]
    assert ops[1]["argv"] == ["true"] == ops[2]["argv"]


def test_a_long_value_is_recorded_truncated(host: LocalHost, log: Path) -> None:
    host.apply([Op.write(ATTR, "v" * 5000)])
    value = str(records(log)[1]["value"])
    assert len(value) < 300 and value.endswith("(5000 chars)")


def test_reads_and_read_only_batches_write_nothing(host: LocalHost, log: Path) -> None:
    host.read(["/sys/class/x/*"])
    host.apply([Op.check_int("/sys/class/x/n", 1), Op.exec(["dmesg"], read_only=True)],
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
    begin = records(log)[0]
    assert rec["host_batch"] == begin["batch"] and rec["batch"] == begin["request"] and rec["outcome"] == "ok"
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


# ------------------------------------------------------------------------------------ the agent decides
# Issue 27: a crafted request mutated without a record by omitting the ``audit`` key, by marking an exec
# ``read_only`` or by naming another log path, and could hide a cut batch by reusing its id.

def _crafted(tree: Path, tmp_path: Path, shape: str) -> dict[str, object]:
    target = tree / "sys/class/x/a"
    ops: list[dict[str, object]] = [{"op": "write", "path": ATTR, "value": "crafted"}]
    if shape == "exec marked read_only":
        ops = [{"op": "exec", "argv": ["sh", "-c", f"echo crafted > {target}"], "read_only": True}]
    request: dict[str, object] = {"root": str(tree), "ops": ops,
                                  "lock": {"path": str(tmp_path / "state" / "lock"), "timeout": 30}}
    if shape == "another log path":
        request["audit"] = {"path": str(tmp_path / "mine" / "audit.jsonl"), "id": "0123456789abcdef"}
    return request


@pytest.mark.parametrize("shape", ["no audit key", "exec marked read_only", "another log path"])
def test_a_crafted_request_cannot_mutate_without_a_record(tree: Path, tmp_path: Path, log: Path,
                                                           shape: str) -> None:
    from vgpuvirt.host import agent
    out = agent.handle(_crafted(tree, tmp_path, shape), agent.OsFs(str(tree)), audit_path=str(log))
    assert out["ops"][0]["ok"], out
    assert (tree / "sys/class/x/a").read_text().strip() == "crafted"
    recs = records(log)
    assert [r["event"] for r in recs] == ["begin", "op", "end"] and recs[1]["outcome"] == "ok"
    assert recs[0]["batch"] == out["audit_batch"]
    assert not (tmp_path / "mine").exists()


def test_the_host_chooses_the_log_from_its_configuration(tree: Path, tmp_path: Path, monkeypatch) -> None:
    """Without a caller on the host naming it, the log is the one the host's configuration names."""
    from vgpuvirt.host import agent
    conf = tmp_path / "etc" / "agent.json"
    conf.parent.mkdir()
    conf.write_text(json.dumps({"audit_path": str(tmp_path / "configured" / "audit.jsonl")}))
    monkeypatch.setattr(agent, "HOST_CONFIG", str(conf))
    out = agent.handle(_crafted(tree, tmp_path, "another log path"), agent.OsFs(str(tree)))
    assert out["ops"][0]["ok"]
    assert [r["event"] for r in records(tmp_path / "configured" / "audit.jsonl")] == ["begin", "op", "end"]
    assert not (tmp_path / "mine").exists()
    LocalHost(str(tree), lock_path=str(tmp_path / "state" / "lock")).apply([Op.write(ATTR, "again")])
    assert len(records(tmp_path / "configured" / "audit.jsonl")) == 6      # LocalHost follows it too
    os.chmod(conf, 0o666)                       # a configuration others may change is not believed
    refused = agent.handle(_crafted(tree, tmp_path, "no audit key"), agent.OsFs(str(tree)))
    assert refused["fatal"] == "state" and "host configuration" in refused["error"]


def test_batch_ids_are_the_hosts_a_reused_id_cannot_close_a_cut_batch(tree: Path, tmp_path: Path,
                                                                       log: Path) -> None:
    from vgpuvirt.host import agent
    log.parent.mkdir(mode=0o700)
    cut = {"t": "2026-01-01T00:00:00.000Z", "batch": "0123456789abcdef", "event": "begin", "ops": 1}
    log.write_text(json.dumps(cut) + "\n")            # a batch cut mid-flight
    os.chmod(log, 0o600)
    req = _crafted(tree, tmp_path, "another log path")   # carries id 0123456789abcdef
    first = agent.handle(req, agent.OsFs(str(tree)), audit_path=str(log))
    second = agent.handle(req, agent.OsFs(str(tree)), audit_path=str(log))
    assert len({first["audit_batch"], second["audit_batch"], cut["batch"]}) == 3
    audit = LocalHost(str(tree), audit_path=str(log)).read_audit()
    assert audit.incomplete() == ["0123456789abcdef"]
    assert [r.get("request") for r in audit.records if r["event"] == "begin"][1:] == ["0123456789abcdef"] * 2


@pytest.mark.parametrize(("op", "mutating"), [
    ({"op": "exec", "argv": ["nvidia-smi", "-q", "-x"]}, False),
    ({"op": "exec", "argv": ["nvidia-smi", "mig", "-i", "0000:3b:00.0", "-lgi"]}, False),
    ({"op": "exec", "argv": ["dmesg"], "read_only": False}, False),
    ({"op": "exec", "argv": ["nvidia-smi", "--query-gpu=index,pci.bus_id,memory.used", "--format=csv"]}, False),
    ({"op": "exec", "argv": ["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"]}, False),
    ({"op": "exec", "argv": ["nvidia-smi", "--query-gpu=", "--format=csv"]}, True),
    ({"op": "exec", "argv": ["nvidia-smi", "--query-gpu=index;reboot", "--format=csv"]}, True),
    ({"op": "exec", "argv": ["nvidia-smi", "--query-gpu=index", "--format=csv", "-f", "/etc/passwd"]}, True),
    ({"op": "exec", "argv": ["nvidia-smi", "--query-gpu=index", "--format=csv,loop=1"]}, True),
    ({"op": "exec", "argv": ["nvidia-smi", "-q", "-x"], "stdin": "x"}, True),
    ({"op": "exec", "argv": ["nvidia-smi", "mig", "-i", "$(reboot)", "-lgi"]}, True),
    ({"op": "exec", "argv": ["nvidia-smi", "vgpu", "-i", "0", "-shm", "1"], "read_only": True}, True),
    ({"op": "exec", "argv": ["dmesg", "-C"], "read_only": True}, True),
    ({"op": "exec", "argv": ["/tmp/nvidia-smi", "-q", "-x"], "read_only": True}, True),
    ({"op": "exec", "argv": ["./dmesg"], "read_only": True}, True),
    ({"op": "exec", "argv": "dmesg", "read_only": True}, True),
    ({"op": "nvml", "value": "vgpu_scheduler_get", "argv": ["all"]}, False),
    ({"op": "nvml", "value": "vgpu_scheduler_set", "argv": ["all"], "read_only": True}, True),
    ({"op": "check_int", "path": ATTR, "min": 1}, False),
    ({"op": "wait", "path": ATTR}, False),
    ({"op": "write", "path": ATTR, "value": "1", "read_only": True}, True),
    ({"op": "frobnicate", "read_only": True}, True),
])
def test_the_agent_judges_an_op_by_what_it_does(op: dict[str, object], mutating: bool) -> None:
    from vgpuvirt.host import agent
    assert agent.mutates(op) is mutating


def test_a_program_path_others_can_change_is_not_read_only(tmp_path: Path) -> None:
    from vgpuvirt.host import agent
    d = tmp_path / "bin"
    d.mkdir()
    prog = d / "nvidia-smi"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    assert not agent.mutates({"op": "exec", "argv": [str(prog), "-q", "-x"]})
    d.chmod(0o777)
    assert agent.mutates({"op": "exec", "argv": [str(prog), "-q", "-x"]})


def test_a_torn_last_line_is_left_out_and_the_next_record_stands_alone(tree: Path, tmp_path: Path,
                                                                       log: Path) -> None:
    from vgpuvirt.host.audit_log import parse_audit
    done = ('{"batch":"a","event":"begin"}\n{"batch":"a","event":"op","outcome":"ok"}\n'
            '{"batch":"a","event":"end","ok":1}\n')
    torn = parse_audit(done + '{"t":"2026-01-01T00:00:00.000Z","batch":"b","ev', "h")
    assert [r["event"] for r in torn.records] == ["begin", "op", "end"] and torn.incomplete() == []
    log.parent.mkdir(mode=0o700)
    log.write_text(done + '{"batch":"b","event":"beg')    # a crash mid-write left half a record
    os.chmod(log, 0o600)
    h = LocalHost(str(tree), lock_path=str(tmp_path / "state" / "lock"), audit_path=str(log))
    h.apply([Op.write(ATTR, "new")])
    lines = log.read_text().splitlines()
    assert lines[3] == '{"batch":"b","event":"beg'                   # the fragment, on its own line
    assert [json.loads(x)["event"] for x in lines[4:]] == ["begin", "op", "end"]
    audit = h.read_audit()
    assert audit.incomplete() == [] and [r["event"] for r in audit.records].count("unreadable") == 1


def test_the_client_user_is_the_os_account_not_user(host: LocalHost, log: Path, monkeypatch) -> None:
    import pwd
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    host.apply([Op.write(ATTR, "new")])
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert records(log)[0]["client_user"] == me
    assert client_records()[-1]["user"] == me


def test_a_lost_answer_leaves_a_client_record(tmp_path: Path) -> None:
    from vgpuvirt.errors import TransportError

    class Cut(BaseHost):
        def _exchange(self, request, *, idempotent):
            raise TransportError(self.name, "connection reset mid-batch")
    with pytest.raises(TransportError):
        Cut("cut-host").apply([Op.write(ATTR, "new")])
    rec = client_records()[-1]
    assert (rec["action"], rec["target"], rec["outcome"]) == ("apply", "cut-host", "unknown: the answer was lost")
    assert rec["batch"] and "connection reset" in str(rec["error"]) and rec["ops"]


_FULL = r"""
import json, os, sys
from vgpuvirt.errors import HostError
from vgpuvirt.host import LocalHost, Op
mnt, tree, case = sys.argv[1:]
logdir = os.path.join(mnt, "log")
os.mkdir(logdir, 0o700)
log = os.path.join(logdir, "audit.jsonl")
line = json.dumps({"t": "2026-01-01T00:00:00.000Z", "batch": "x", "event": "end", "pad": ""})
fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
body = ""
while len(body) + len(line) + 1 < 4096 - 350:     # the log's page nearly full: a begin fits, no op record
    body += line + "\n"
os.write(fd, body.encode())
os.close(fd)
if case == "full":
    ffd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(ffd, b"\0" * 4096)
    except OSError:
        os.close(ffd)
else:
    import subprocess
    subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
before = open(log, "rb").read()
from vgpuvirt import audit
audit.record("warm", "t", "ok")   # the client's own log, kept open by design, is open before the count
fds = len(os.listdir("/proc/self/fd"))
h = LocalHost(tree, lock_path=os.path.join(tree, "..", "lock"), audit_path=log)
errors = set()
for _ in range(20):
    try:
        h.apply([Op.write("/sys/class/x/a", "v" * 200)])
        errors.add("ran")
    except HostError as exc:
        errors.add(str(exc))
print(json.dumps({"errors": sorted(errors), "log_unchanged": open(log, "rb").read() == before,
                  "fd_leak": len(os.listdir("/proc/self/fd")) - fds,
                  "attr": open(os.path.join(tree, "sys/class/x/a")).read()}))
"""


@pytest.mark.parametrize("case", ["full", "read-only"])
def test_a_log_that_cannot_take_the_batch_refuses_it_naming_the_cause(tree: Path, tmp_path: Path,
                                                                         case: str) -> None:
    """A tiny tmpfs in a private mount namespace (root, as the suite runs): full, or read-only."""
    import shutil
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = ('mount -t tmpfs -o size=64k tmpfs "$1" && shift && exec "$@"')
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(mnt),
                        sys.executable, "-c", _FULL, str(mnt), str(tree), case],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    cause = "No space left on device" if case == "full" else "Read-only file system"
    assert len(got["errors"]) == 1 and cause in got["errors"][0], got
    assert "unsafe" not in got["errors"][0] and "nothing of the batch ran" in got["errors"][0]
    assert got["log_unchanged"] and got["fd_leak"] == 0 and got["attr"] == "old\n"


def test_a_client_record_looks_up_who_and_where_once_and_makes_its_directory_when_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lookup is a system call that lets another thread take the interpreter (provisioning hosts in threads:
    benchmarks/bench_fleet.py prints the switches per host)."""
    import pwd
    import socket

    from vgpuvirt import audit as client_audit
    path = tmp_path / "state" / "audit.jsonl"
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(path))
    client_audit._user_name.cache_clear()
    client_audit.client_host.cache_clear()
    lookups: list[str] = []
    real_pw, real_host = pwd.getpwuid, socket.gethostname
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: lookups.append("user") or real_pw(uid))
    monkeypatch.setattr(socket, "gethostname", lambda: lookups.append("host") or real_host())
    monkeypatch.setattr(client_audit._Sink, "RECHECK_S", 0.0)   # the file checked at every record
    client_audit.record("define domain", "test:///default", "ok", domain="a")
    path.unlink()
    path.parent.rmdir()           # gone between two records: made again, 0700
    client_audit.record("start domain", "test:///default", "ok", domain="a")
    assert sorted(lookups) == ["host", "user"]
    assert [json.loads(line)["action"] for line in path.read_text().splitlines()] == ["start domain"]
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    rec = json.loads(path.read_text())
    assert rec["user"] == real_pw(os.geteuid()).pw_name and rec["client_host"] == real_host()


def test_client_records_share_one_open_file_until_it_is_rotated_or_the_path_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening and closing the log per record let another thread take the interpreter twice per record; the file
    stays open, and a rotation (rename) is noticed at the first record after RECHECK_S."""
    from vgpuvirt import audit as client_audit
    path = tmp_path / "audit.jsonl"
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(path))
    opened: list[str] = []
    real_open = client_audit._open_log
    monkeypatch.setattr(client_audit, "_open_log", lambda p: opened.append(str(p)) or real_open(p))
    clock = [1000.0]
    monkeypatch.setattr(client_audit.time, "monotonic", lambda: clock[0])

    def actions(p: Path) -> list[str]:
        return [json.loads(line)["action"] for line in p.read_text().splitlines()]

    for i in range(5):
        client_audit.record(f"a{i}", "t", "ok")
    assert opened == [str(path)] and actions(path) == [f"a{i}" for i in range(5)]
    path.rename(tmp_path / "audit.jsonl.1")                    # logrotate's default: rename, then a new file
    client_audit.record("in the window", "t", "ok")
    assert not path.exists() and actions(tmp_path / "audit.jsonl.1")[-1] == "in the window"
    clock[0] += client_audit._Sink.RECHECK_S
    client_audit.record("after", "t", "ok")
    assert actions(path) == ["after"] and len(opened) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    other = tmp_path / "other.jsonl"
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(other))       # a new path: opened at once, not after the window
    client_audit.record("elsewhere", "t", "ok")
    assert actions(other) == ["elsewhere"] and actions(path) == ["after"]
    path.unlink()
    path.symlink_to(tmp_path / "victim")                        # planted in place of the log: never followed
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(path))
    client_audit.record("refused", "t", "ok")
    assert not (tmp_path / "victim").exists()


def test_a_forked_child_opens_its_own_client_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vgpuvirt import audit as client_audit
    path = tmp_path / "audit.jsonl"
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(path))
    client_audit.record("parent", "t", "ok")
    parent_fd = client_audit._sink.fd
    pid = os.fork()
    if pid == 0:   # the child: the parent's descriptor is closed, its first record opens its own
        code = 1
        try:
            if client_audit._sink.fd == -1:
                client_audit.record("child", "t", "ok")
                code = 0 if client_audit._sink.fd >= 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client_audit.record("parent again", "t", "ok")
    assert client_audit._sink.fd == parent_fd
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["action"] for r in recs] == ["parent", "child", "parent again"]
    assert recs[1]["pid"] == pid and recs[0]["pid"] == recs[2]["pid"] == os.getpid()


def test_records_from_many_threads_survive_rotations_whole_and_leak_no_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads write while the log is renamed away again and again: every record is in one of the files, whole,
    and a descriptor replaced while others still wrote to it was closed by the last of them."""
    import threading

    from vgpuvirt import audit as client_audit
    path = tmp_path / "audit.jsonl"
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(path))
    monkeypatch.setattr(client_audit._Sink, "RECHECK_S", 0.0)

    class SlowWrites:   # a write that takes a while, as on a busy disk: others retire its descriptor meanwhile
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: bytes) -> int:
            time.sleep(0.0005)
            return os.write(fd, data)
    monkeypatch.setattr(client_audit, "os", SlowWrites())
    client_audit.record("first", "t", "ok")
    fds_before = len(os.listdir("/proc/self/fd"))
    stop = threading.Event()
    rotated: list[Path] = []

    def rotate() -> None:
        while not stop.is_set():
            if path.exists():
                dest = tmp_path / f"audit.jsonl.{len(rotated)}"
                path.rename(dest)
                rotated.append(dest)
            stop.wait(0.001)

    def write(k: int) -> None:
        for i in range(150):
            client_audit.record(f"w{k}-{i}", "t", "ok", pad="x" * (k * 40))
    rot = threading.Thread(target=rotate)
    rot.start()
    writers = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    rot.join()
    client_audit.record("last", "t", "ok")
    files = [*rotated, path]
    actions = [json.loads(line)["action"] for f in files if f.exists() for line in f.read_text().splitlines()]
    assert sorted(actions) == sorted(["first", "last", *(f"w{k}-{i}" for k in range(8) for i in range(150))])
    assert len(rotated) > 5                         # the rotations did happen while the threads wrote
    assert len(os.listdir("/proc/self/fd")) == fds_before and client_audit._sink.writers == {}
