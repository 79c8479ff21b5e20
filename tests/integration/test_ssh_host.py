"""SSHHost against the testbed's real OpenSSH server (scripts/testbed.sh).

Remote execs are counted twice: by the client (``host.round_trips``) and, independently, by sshd
itself: at LogLevel VERBOSE it logs ``Starting session: command for root from 127.0.0.1 port N``
for every exec, and N (our client's TCP port) tells our sessions from anyone else's.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity
from conftest import Testbed, require_part  # type: ignore[import-not-found]
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpuvirt.errors import HostKeyError, RemoteRequirementMissing, TransportError
from vgpuvirt.host import LocalHost, Op
from vgpuvirt.host.ssh import ARGV_REQUEST_MAX, SSHHost, default_retry
from vgpuvirt.testing.delayproxy import DelayProxy

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------- server-side evidence
def client_port(host: SSHHost) -> int:
    assert host._client is not None
    transport = host._client.get_transport()
    assert transport is not None
    return int(transport.sock.getsockname()[1])  # type: ignore[union-attr]


def server_execs(tb: Testbed, port: int) -> int:
    """Execs sshd started for the LATEST connection from client ``port`` (from sshd's own log).

    Ephemeral ports are reused over a long test run, so counting restarts at that port's last
    "Accepted publickey" line: earlier connections that happened to use the same port do not count."""
    session = re.compile(rf"Starting session: command for \S+ from 127\.0\.0\.1 port {port} ")
    accepted = re.compile(rf"Accepted \S+ for \S+ from 127\.0\.0\.1 port {port} ")
    count = 0
    for line in Path(tb.sshd_log).read_text(errors="replace").splitlines():
        if accepted.search(line):
            count = 0
        elif session.search(line):
            count += 1
    return count


def server_pids(port: int) -> list[int]:
    """The sshd processes serving the connection whose client port is ``port``."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "(", "dport", "=", f":{port}", ")"],
                         capture_output=True, text=True, check=True).stdout
    return sorted({int(p) for p in re.findall(r"pid=(\d+)", out)} - {os.getpid()})


def descendants(pids: list[int]) -> list[int]:
    """Every process below ``pids`` (from /proc's parent links)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], list(pids)
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    """2,000 files across a sysfs-like tree, plus links and dirs. Module-scoped: built once."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ssh-tree-") as tmp:
        root = Path(tmp)
        for i in range(2000):
            d = root / "sys/devices" / f"dev{i // 50:03d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"attr{i % 50:02d}").write_text(f"value {i}\n")
        for j in range(40):
            os.symlink(f"../../drivers/drv{j % 3}", root / "sys/devices" / f"dev{j:03d}" / "driver")
        yield root


@pytest.fixture
def host(testbed: Testbed, tree: Path) -> SSHHost:
    return testbed.ssh(sysfs_root=str(tree))


@pytest.fixture
def wtree(tmp_path: Path) -> Path:
    d = tmp_path / "sys/class/x"
    d.mkdir(parents=True)
    (d / "a").write_text("old\n")
    (d / "b").write_text("old\n")
    (d / "sub").mkdir()
    return tmp_path


# ---------------------------------------------------------------- connection properties
def test_socket_has_tcp_nodelay(testbed: Testbed) -> None:
    h = testbed.ssh()
    assert h.run(["true"]).ok
    assert h._client is not None
    sock = h._client.get_transport().sock  # type: ignore[union-attr]
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0  # type: ignore[union-attr]


def test_one_connection_reused_across_calls_and_threads(testbed: Testbed, host: SSHHost) -> None:
    host.run(["true"])
    port = client_port(host)
    before = server_execs(testbed, port)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                assert host.read(["/sys/devices/dev000/attr07"]).text("/sys/devices/dev000/attr07") == "value 7"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert client_port(host) == port                  # all 18 reads rode the one connection
    # one thread at a time talks to the resident agent; the others ran execs of their own
    assert 1 <= server_execs(testbed, port) - before < 18
    assert host.round_trips == 19


def test_reads_after_the_first_go_to_the_resident_agent_without_an_exec(testbed: Testbed, host: SSHHost) -> None:
    assert host.read(["/sys/devices/dev000/attr01"]).text("/sys/devices/dev000/attr01") == "value 1"
    port = client_port(host)
    execs = server_execs(testbed, port)
    assert execs == 1
    for i in range(2, 12):
        assert host.read([f"/sys/devices/dev000/attr{i:02d}"]).text(f"/sys/devices/dev000/attr{i:02d}") == \
            f"value {i}"
    assert server_execs(testbed, port) == execs       # ten more requests, no new process on the host
    assert host.round_trips == 11


def test_a_dead_resident_agent_is_restarted_before_a_write_is_sent(testbed: Testbed, wtree: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"))
    assert h.read(["/sys/class/x/a"]).text("/sys/class/x/a") == "old"
    port = client_port(h)
    # kill the host's resident agent (the python3 serving this connection), as an OOM killer would
    agents = [p for p in descendants(server_pids(port)) if b"--serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(agents) == 1
    os.kill(agents[0], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while h._resident is not None and not h._resident.exit_status_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    res = h.apply([Op.write("/sys/class/x/a", "new")])   # not idempotent: must run exactly once
    assert res.ok
    assert (wtree / "sys/class/x/a").read_text() == "new"
    assert server_execs(testbed, port) == 2               # the first agent, and its replacement


def test_resident_false_runs_one_exec_per_request(testbed: Testbed, tree: Path) -> None:
    h = testbed.ssh(sysfs_root=str(tree), resident=False)
    for i in range(3):
        h.read([f"/sys/devices/dev001/attr{i:02d}"])
    assert server_execs(testbed, client_port(h)) == 3


# ---------------------------------------------------------------- batching
def test_reading_2000_files_is_one_remote_exec(testbed: Testbed, host: SSHHost, tree: Path) -> None:
    host.run(["true"])  # connect first: what is counted is the read
    port = client_port(host)
    execs0, rt0 = server_execs(testbed, port), host.round_trips
    snap = host.read(["/sys/devices/*/attr*", "/sys/devices/*/driver"])
    assert host.round_trips - rt0 == 1
    assert server_execs(testbed, port) - execs0 == 1
    files = [p for p in snap if snap[p].kind == "file"]
    assert len(files) == 2000
    assert snap.text("/sys/devices/dev039/attr49") == "value 1999"
    assert snap.link("/sys/devices/dev004/driver") == "../../drivers/drv1"
    # the same semantics as the in-process agent
    assert snap.to_wire() == LocalHost(str(tree)).read(["/sys/devices/*/attr*", "/sys/devices/*/driver"]).to_wire()


def test_batch_of_writes_is_one_exec_with_per_item_errno(testbed: Testbed, wtree: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"))
    h.run(["true"])
    port = client_port(h)
    execs0 = server_execs(testbed, port)
    res = h.apply([Op.write("/sys/class/x/a", "new"), Op.write("/sys/class/x/missing", "1"),
                   Op.write("/sys/class/x/sub", "1"), Op.write("/sys/class/x/a/deeper", "1"),
                   Op.check_int("/sys/class/x/b", 0), Op.write("/sys/class/x/b", "also new")],
                  on_error="continue", reads_after=["/sys/class/x/*"])
    assert server_execs(testbed, port) - execs0 == 1
    assert [r.ok for r in res] == [True, False, False, False, False, True]
    assert [r.errno for r in res] == [None, errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EINVAL, None]
    assert (wtree / "sys/class/x/a").read_text() == "new"
    assert (wtree / "sys/class/x/b").read_text() == "also new"
    assert res.after.raw("/sys/class/x/a") == "new"
    assert not (wtree / "sys/class/x/missing").exists()


def test_a_request_too_big_for_argv_goes_on_stdin(testbed: Testbed, wtree: Path) -> None:
    big = os.urandom(60 * 1024).hex()  # incompressible: its base64 exceeds ARGV_REQUEST_MAX
    assert len(big) > ARGV_REQUEST_MAX
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"))
    assert h.apply([Op.write("/sys/class/x/a", big)]).ok
    assert (wtree / "sys/class/x/a").read_text() == big


def test_a_request_at_the_argv_limit_fits_beside_the_bytecode_bootstrap(testbed: Testbed, wtree: Path) -> None:
    # the bootstrap (the agent's bytecode) and the largest argv request share one 128 KiB argument
    import random
    rng = random.Random(25)
    value = "".join(rng.choice(string.ascii_letters) for _ in range(63 * 1024))
    # the request as SSHHost packs it comes within 2% of the limit (the rest of the request is a few dozen bytes)
    packed = len(base64.b64encode(zlib.compress(json.dumps({"ops": [{"value": value}]}).encode(), 6)))
    assert 0.95 * ARGV_REQUEST_MAX < packed < ARGV_REQUEST_MAX - 200
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"), resident=False)
    assert h.apply([Op.write("/sys/class/x/a", value)]).ok
    assert (wtree / "sys/class/x/a").read_text() == value
    assert h.bytecode


@pytest.mark.parametrize("resident", [False, True])
def test_a_host_python_that_refuses_the_bytecode_gets_the_source_once(
        testbed: Testbed, wtree: Path, monkeypatch: pytest.MonkeyPatch, resident: bool) -> None:
    from vgpuvirt.host import ssh_agent
    ours = repr((ssh_agent.importlib.util.MAGIC_NUMBER, sys.implementation.cache_tag))
    real = ssh_agent._agent_bootstrap

    def foreign(bytecode: bool, parts: frozenset[str] | None) -> str:
        # every bytecode bootstrap (whatever parts of the agent it carries) guards for another Python
        return real(bytecode, parts).replace(ours, repr((b"\x00\x00\r\n", "cpython-0")))
    monkeypatch.setattr(ssh_agent, "_agent_bootstrap", foreign)
    monkeypatch.setattr(ssh_agent, "_BOOTSTRAP", {})
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"), resident=resident)
    h.run(["true"])
    port = client_port(h)
    execs0 = server_execs(testbed, port)
    res = h.apply([Op.write("/sys/class/x/a", "new")])   # not idempotent: the refused exec ran nothing
    assert res.ok
    assert (wtree / "sys/class/x/a").read_text() == "new"
    assert not h.bytecode
    assert server_execs(testbed, port) - execs0 == 2      # the refused bootstrap, then the source
    (wtree / "sys/class/x/a").write_text("again")
    assert h.read(["/sys/class/x/a"]).text("/sys/class/x/a") == "again"
    assert server_execs(testbed, port) - execs0 == (3 if not resident else 2)   # no second refusal


def test_on_error_stop_over_ssh(testbed: Testbed, wtree: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"))
    res = h.apply([Op.write("/sys/class/x/missing", "1"), Op.write("/sys/class/x/a", "new")])
    assert [(r.ok, r.skipped, r.errno) for r in res] == [(False, False, errno.ENOENT), (False, True, None)]
    assert (wtree / "sys/class/x/a").read_text() == "old\n"


# ---------------------------------------------------------------- host keys
def test_unknown_host_key_is_refused(testbed: Testbed, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    h = testbed.ssh(known_hosts=str(empty))
    with pytest.raises(HostKeyError, match="unknown") as ei:
        h.run(["true"], idempotent=True)
    assert h._client is None
    assert "Socket exception" not in capfd.readouterr().err
    # the message shows the key's fingerprint, to check against the host's own (issue 28 item 11)
    import base64
    import hashlib
    kind, blob = Path(testbed.known_hosts).read_text().split()[1:3]
    fp = "SHA256:" + base64.b64encode(hashlib.sha256(base64.b64decode(blob)).digest()).decode().rstrip("=")
    assert f"host key unknown (not in known_hosts): {kind} {fp}; refusing to connect" in str(ei.value)


def test_the_unknown_host_opt_in_accepts_for_one_connection_warns_and_writes_nothing(
        testbed: Testbed, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    h = testbed.ssh(known_hosts=str(empty), allow_unknown_hosts=True)
    with caplog.at_level("WARNING", logger="vgpuvirt.host.ssh"):
        assert h.run(["true"]).ok
    assert any("UNKNOWN" in r.getMessage() and "SHA256:" in r.getMessage() for r in caplog.records)
    assert empty.read_text() == ""          # no lasting trust from a one-off opt-in
    h.close()
    with pytest.raises(HostKeyError, match="unknown"):   # and without the opt-in it is still unknown
        testbed.ssh(known_hosts=str(empty)).run(["true"])


def test_changed_host_key_is_refused_and_not_retried(testbed: Testbed, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{testbed.ssh_host}]:{testbed.ssh_port} {' '.join(other)}\n")
    attempts: list[int] = []
    h = testbed.ssh(known_hosts=str(kh),
                    retry=lambda: default_retry().copy(before=lambda rs: attempts.append(rs.attempt_number)))
    with pytest.raises(HostKeyError, match="CHANGED"):
        h.read(["/sys"])  # idempotent, so retried on transport errors, but never on a host-key error
    assert attempts == [1]
    assert h.round_trips == 0


def test_transport_errors_are_retried_by_the_same_policy(testbed: Testbed) -> None:
    # control for the test above: the counting policy does see retries when the error is retryable
    attempts: list[int] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]  # nothing listens there once closed
    h = testbed.ssh(port=free_port, retry=lambda: default_retry().copy(
        before=lambda rs: attempts.append(rs.attempt_number), wait=tenacity.wait_none()))
    with pytest.raises(TransportError, match="cannot connect"):
        h.read(["/sys"])
    assert attempts == [1, 2, 3]


# ---------------------------------------------------------------- injection safety
NASTY = ["$(touch {c})", "`touch {c}`", "; touch {c}", "| touch {c}", "&& touch {c}", "\ntouch {c}\n",
         "' ; touch {c} ; '", '" ; touch {c} ; "', "$HOME", "*", "~", "a\\b", "-n", "--", "{{a,b}}", "> {c}"]


@pytest.mark.parametrize("template", NASTY)
def test_shell_metacharacters_reach_no_shell(testbed: Testbed, tmp_path: Path, template: str) -> None:
    canary = tmp_path / "canary"
    value = template.format(c=canary)
    h = testbed.ssh(sysfs_root=str(tmp_path))
    r = h.run(["printf", "%s", value])
    assert (r.exit_code, r.stdout) == (0, value)
    (tmp_path / "attr").write_text("")
    assert h.apply([Op.write("/attr", value)], lock=False).ok
    assert (tmp_path / "attr").read_text() == value
    assert not canary.exists()


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
_shellish = st.lists(st.sampled_from([*"$`'\";|&<>(){}[]*?~!#\\\n\t -", "$(id)", "${IFS}"]) | _text,
                     max_size=8).map("".join)


@pytest.fixture(scope="module")
def shared_host(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> tuple[SSHHost, Path]:
    root = tmp_path_factory.mktemp("inject")
    return testbed.ssh(sysfs_root=str(root)), root


@settings(max_examples=60, deadline=None)
@given(value=_shellish)
def test_any_value_travels_verbatim(shared_host: tuple[SSHHost, Path], value: str) -> None:
    h, root = shared_host
    r = h.run(["printf", "%s", value])
    assert r.stdout == value
    (root / "attr").write_text("")
    assert h.apply([Op.write("/attr", value)], lock=False).ok
    assert (root / "attr").read_bytes() == value.encode()


# ---------------------------------------------------------------- dropped connections
class Frozen:
    """SIGSTOP the sshd processes of one connection: the link is up but nothing answers (a dead peer)."""

    def __init__(self, port: int) -> None:
        self.pids = server_pids(port)
        require_part("sshd session pids", bool(self.pids), f"ss found no sshd for client port {port}")

    def __enter__(self) -> Frozen:
        for p in self.pids:
            os.kill(p, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.pids:  # these sessions are ours: end them
            end_process(p)


def end_process(pid: int) -> None:
    for sig in (signal.SIGKILL, signal.SIGCONT):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return


def test_killed_session_is_reestablished_and_read_succeeds(testbed: Testbed, host: SSHHost) -> None:
    host.run(["true"])
    port = client_port(host)
    for p in server_pids(port):
        end_process(p)
    snap = host.read(["/sys/devices/dev001/attr01"])
    assert snap.text("/sys/devices/dev001/attr01") == "value 51"
    new_port = client_port(host)
    assert new_port != port
    assert server_execs(testbed, new_port) == 1


# the exec watchdog closes the channel on the frozen link from its timer thread: that must not die with a traceback
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_hung_connection_idempotent_read_is_retried(testbed: Testbed, tree: Path) -> None:
    h = testbed.ssh(sysfs_root=str(tree), connect_timeout=1.0)  # the default retry policy
    h.run(["true"])
    port = client_port(h)
    execs0, rt0 = server_execs(testbed, port), h.round_trips
    with Frozen(port):
        snap = h.read(["/sys/devices/dev002/attr03"])
    assert snap.text("/sys/devices/dev002/attr03") == "value 103"
    assert h.round_trips - rt0 == 2                        # the failed attempt and the retry
    assert server_execs(testbed, port) == execs0           # the frozen session ran nothing
    new_port = client_port(h)
    assert new_port != port and server_execs(testbed, new_port) == 1


# the exec watchdog closes the channel on the frozen link from its timer thread: that must not die with a traceback
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_hung_connection_apply_is_not_retried(testbed: Testbed, wtree: Path) -> None:
    h = testbed.ssh(sysfs_root=str(wtree), connect_timeout=1.0, lock_path=str(wtree / "lock"))
    h.run(["true"])
    port = client_port(h)
    rt0 = h.round_trips
    with Frozen(port), pytest.raises(TransportError):
        h.apply([Op.write("/sys/class/x/a", "new")])
    assert h.round_trips - rt0 == 1
    # a retry on a fresh connection would have written it; the caller must re-read and reconcile
    assert (wtree / "sys/class/x/a").read_text() == "old\n"
    assert h.apply([Op.write("/sys/class/x/a", "new")]).ok  # the next call reconnects
    assert (wtree / "sys/class/x/a").read_text() == "new"


def test_proxy_drop_reconnects(testbed: Testbed, tree: Path, tmp_path: Path) -> None:
    key = Path(testbed.known_hosts).read_text().splitlines()[0].split(None, 1)[1]
    with DelayProxy((testbed.ssh_host, testbed.ssh_port), rtt_ms=2) as proxy:
        kh = tmp_path / "known_hosts"
        kh.write_text(f"[127.0.0.1]:{proxy.address[1]} {key}\n")
        h = testbed.ssh(sysfs_root=str(tree), known_hosts=str(kh), port=proxy.address[1])
        direct = testbed.ssh(sysfs_root=str(tree)).read(["/sys/devices/dev010/*"])
        assert h.read(["/sys/devices/dev010/*"]).to_wire() == direct.to_wire()
        proxy.drop_all()
        assert h.read(["/sys/devices/dev010/*"]).to_wire() == direct.to_wire()
        assert proxy.connections == 2


# ---------------------------------------------------------------- remote requirements
def test_missing_remote_python_is_a_clear_error(testbed: Testbed) -> None:
    h = testbed.ssh(python="python3-missing")
    with pytest.raises(RemoteRequirementMissing, match="python3-missing"):
        h.read(["/sys"])


def test_printable_names_are_quoted_for_the_remote_shell(testbed: Testbed) -> None:
    h = testbed.ssh()
    every = string.printable.replace("\x0b", "").replace("\x0c", "")
    assert h.run(["printf", "%s", every]).stdout == every


def test_waiting_for_the_exit_status_after_eof_does_not_spin(testbed: Testbed, host: SSHHost,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The command closes its output at once and exits 0.3 s later: between EOF and the exit status the
    # client must wait, not poll a channel that stays readable (that was ~1,000 select() calls per exec).
    import vgpuvirt.host.ssh as ssh_mod
    calls = []
    real_select = ssh_mod.select.select

    def counting_select(*args: object) -> object:
        calls.append(1)
        return real_select(*args)  # type: ignore[arg-type]
    monkeypatch.setattr(ssh_mod.select, "select", counting_select)
    res = host.run(["sh", "-c", "exec >&- 2>&-; sleep 0.3"])
    assert res.exit_code == 0
    assert len(calls) < 20


def test_a_resident_agent_that_does_not_answer_in_time_is_replaced(testbed: Testbed, wtree: Path) -> None:
    from vgpuvirt.errors import HostError
    h = testbed.ssh(sysfs_root=str(wtree), lock_path=str(wtree / "lock"), command_timeout=1.0)
    assert h.read(["/sys/class/x/a"]).text("/sys/class/x/a") == "old"
    port = client_port(h)
    # a wait the agent keeps for 3 s, longer than the client's 1 s command timeout
    with pytest.raises(HostError, match="did not answer within"):
        h.apply([Op.wait("/sys/class/x/never", "exists", timeout=3.0)], lock=False)
    assert h._resident is None
    # the next call starts a fresh agent on the same connection and gets a correct answer
    assert h.read(["/sys/class/x/b"]).text("/sys/class/x/b") == "old"
    assert client_port(h) == port
    assert server_execs(testbed, port) == 2
