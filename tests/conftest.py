"""Shared fixtures: the real-parts testbed (``scripts/testbed.sh``) and :func:`require_part`.

Integration tests talk to real parts (sshd, libvirtd, FUSE, mdevctl, ansible-playbook). Locally a
missing part skips the test with its reason; under CI (``CI=true``) it fails it, so that CI never
reports green for tests that did not run. See docs/testbed.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from vgpuvirt.host.ssh import SSHHost

# The suite keeps bytecode caches of its own modules, as Python and pytest do by default, where the shell asks
# for none (PYTHONDONTWRITEBYTECODE, set in these machines' shells): without them each xdist worker rewrites the
# asserts of every test module again at every run (collection 4.6 s of CPU per worker instead of 1.8 s), and every
# process a test starts compiles what it imports. Dropped here, before the workers start, so they inherit it.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parent.parent
TESTBED_SH = REPO / "scripts" / "testbed.sh"
SBX = Path(os.environ.get("VGPUVIRT_SBX", "/tmp/vgpuvirt-testbed"))
ENV_FILE = SBX / "testbed.json"
# what `scripts/testbed.sh start` needs on PATH (install provides them)
_BINARIES = ("/usr/sbin/sshd", "ssh-keygen", "libvirtd", "virtlogd", "virsh", "unshare", "mountpoint", "flock")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_part(name: str, available: bool, why: str) -> None:
    """Skip (locally) or fail (under CI=true) the calling test when a real part is not available."""
    if available:
        return
    message = f"real part missing: {name}: {why}"
    if in_ci():
        pytest.fail(message + " (CI=true: a missing real part is a failure, not a skip)", pytrace=False)
    pytest.skip(message)


@dataclass
class SshEndpoint:
    """One sshd of the testbed: where it listens, its log, and a directory for FUSE trees it can see."""

    name: str
    ssh_host: str
    ssh_port: int
    mnt_dir: str
    sshd_log: str
    identity: str
    known_hosts: str
    ssh_user: str = "root"
    _opened: list[SSHHost] = field(default_factory=list, repr=False)

    def ssh(self, sysfs_root: str = "/", **kw: Any) -> SSHHost:
        """An SSHHost on this sshd with the testbed's key and strict known_hosts (closed at session end)."""
        from vgpuvirt.host.ssh import SSHHost

        opts: dict[str, Any] = {"port": self.ssh_port, "username": self.ssh_user, "key_filename": self.identity,
                                "known_hosts": self.known_hosts, "sysfs_root": sysfs_root}
        opts.update(kw)
        host = SSHHost(self.ssh_host, **opts)
        self._opened.append(host)
        return host

    def close_all(self) -> None:
        while self._opened:
            self._opened.pop().close()


@dataclass
class Testbed(SshEndpoint):
    """What ``scripts/testbed.sh start`` brought up (read from its env file)."""

    __test__ = False  # not a test class, despite its name

    sbx: str = ""
    libvirt_uri: str = "qemu:///system"
    libvirt_ssh_uri: str = ""
    ssh_wrapper: str = ""
    env: dict[str, Any] = field(default_factory=dict, repr=False)
    _extra: list[SshEndpoint] = field(default_factory=list, repr=False)

    @classmethod
    def from_env(cls, env: dict[str, Any]) -> Testbed:
        return cls(name="main", ssh_host=env["ssh_host"], ssh_port=int(env["ssh_port"]), mnt_dir=env["mnt_dir"],
                   sshd_log=env["sshd_log"], identity=env["identity"], known_hosts=env["known_hosts"],
                   ssh_user=env.get("ssh_user", "root"), sbx=env["sbx"], libvirt_uri=env["libvirt_uri"],
                   libvirt_ssh_uri=env.get("libvirt_ssh_uri", ""), ssh_wrapper=env.get("ssh_wrapper", ""),
                   env=env)

    def extra_hosts(self, n: int) -> list[SshEndpoint]:
        """N more test hosts (sshd on 127.0.2.1..N:PORT, each with its own shared mnt dir); idempotent."""
        _testbed_sh("hosts-up", str(n))
        env = json.loads(ENV_FILE.read_text())
        hosts = [SshEndpoint(name=h["name"], ssh_host=h["ssh_host"], ssh_port=int(h["ssh_port"]),
                             mnt_dir=h["mnt_dir"], sshd_log=h["sshd_log"], identity=env["identity"],
                             known_hosts=env["known_hosts"], ssh_user=env.get("ssh_user", "root"))
                 for h in env["hosts"]][:n]
        require_part(f"{n} extra test hosts", len(hosts) == n, f"testbed.sh hosts-up {n} brought up {len(hosts)}")
        self._extra.extend(hosts)
        return hosts

    def migration_hosts(self, n: int) -> list[MigrationHost]:
        """N migration hosts m1..mN (scripts/testbed.sh mig-up N): each its own libvirtd (own mount namespace,
        host UUID and migration address 127.0.3.N) behind its own sshd; idempotent, restarts a killed libvirtd."""
        _testbed_sh("mig-up", str(n))
        env = json.loads((SBX / "mig" / "hosts.json").read_text())
        hosts = [MigrationHost(**h) for h in env["hosts"]][:n]
        require_part(f"{n} migration hosts", len(hosts) == n, f"testbed.sh mig-up {n} brought up {len(hosts)}")
        return hosts

    def stop_extra_host(self, n: int) -> None:
        """Stop extra host hN's sshd (scripts/testbed.sh host-down N); extra_hosts() brings it back."""
        _testbed_sh("host-down", str(n))

    def close_all(self) -> None:
        super().close_all()
        for h in self._extra:
            h.close_all()


@dataclass(frozen=True)
class MigrationHost:
    """One migration host of the testbed (scripts/testbed.sh mig-up): its libvirt URI through its sshd."""

    name: str
    ssh_host: str
    ssh_port: int
    identity: str
    known_hosts: str
    ssh_wrapper: str
    libvirt_uri: str
    libvirtd_pidfile: str
    libvirtd_log: str
    sshd_log: str
    host_uuid: str

    def kill_libvirtd(self) -> None:
        """SIGKILL this host's libvirtd (a destination dying mid-migration); migration_hosts() restarts it."""
        import signal
        pid = int(Path(self.libvirtd_pidfile).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        # its own pid file is on its command line: a stale pid file whose number went to another libvirtd
        # (the main one, another host's) must not kill that one
        assert self.libvirtd_pidfile.encode() in cmdline.split(b"\0"), \
            f"pid {pid} is not {self.name}'s libvirtd: {cmdline!r}"
        os.kill(pid, signal.SIGKILL)


def _testbed_sh(*args: str) -> None:
    proc = subprocess.run(["bash", str(TESTBED_SH), *args], capture_output=True, text=True, timeout=600,
                          check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        require_part("testbed", False, f"scripts/testbed.sh {' '.join(args)} exited {proc.returncode}:\n{tail}")


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """sshd on loopback, libvirtd, a shared mnt dir: started once (idempotent), left running afterwards."""
    require_part("root", os.geteuid() == 0, "the testbed starts sshd/libvirtd and makes mounts")
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    require_part("testbed binaries", not missing, f"missing {', '.join(missing)}: run scripts/testbed.sh install")
    _testbed_sh("start")
    env = json.loads(ENV_FILE.read_text())
    tb = Testbed.from_env(env)
    if env.get("libvirtd_pidfile"):
        _LIBVIRTD.update(pidfile=env["libvirtd_pidfile"], log=env.get("libvirtd_log", ""),
                         pid=_read_pid(env["libvirtd_pidfile"]))
    try:
        yield tb
    finally:
        tb.close_all()


# -- the testbed's libvirtd, watched ------------------------------------------------------------------
# libvirtd 9.0 (Debian 12) has died under the suite: a general protection fault in virObjectUnref in one of its
# RPC worker threads (dmesg), once in a local run and once under CI, where every later libvirtd test then failed
# or errored (5 + 55). Each worker looks before a testbed test: a libvirtd that died is written down (when, which
# test came next, the kernel's line, its log's tail) and started again; a test that failed while it died under it
# runs once more (pytest_runtest_protocol below); the run's summary names the death and those tests. A failure
# with libvirtd alive is never run again.
_LIBVIRTD: dict[str, Any] = {}
_DEATHS = SBX / "run" / "libvirtd-deaths.jsonl"


def _read_pid(pidfile: str) -> int | None:
    try:
        return int(Path(pidfile).read_text().strip())
    except (OSError, ValueError):
        return None


def _running(pid: int) -> bool:
    """``pid`` runs (a zombie does not: here no init reaps a dead daemon at once, and kill -0 still finds it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _kernel_lines(pid: int) -> list[str]:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if f"[{pid}]" in line][-3:]


def _log_tail(path: str, n: int = 5) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def revive_libvirtd(before: str) -> dict[str, Any] | None:
    """Start the testbed's libvirtd again if the one this process saw has died; the record of its death or None."""
    import time
    pid = _LIBVIRTD.get("pid")
    if not pid or _running(pid):
        return None
    record = {"time": time.time(), "pid": pid, "noticed_before": before,
              "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "kernel": _kernel_lines(pid),
              "log_tail": _log_tail(_LIBVIRTD.get("log", ""))}
    _DEATHS.parent.mkdir(parents=True, exist_ok=True)
    with _DEATHS.open("a") as f:
        f.write(json.dumps(record) + "\n")
    _testbed_sh("start")            # idempotent and locked: the first worker to get there starts it
    _LIBVIRTD["pid"] = _read_pid(_LIBVIRTD["pidfile"])
    return record


def _note_rerun(pid: int, nodeid: str) -> None:
    import time
    with _DEATHS.open("a") as f:
        f.write(json.dumps({"time": time.time(), "pid": pid, "ran_again": nodeid}) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A testbed test runs on a live libvirtd (one found dead is started again first). One that failed while
    that libvirtd died under it runs once more on a new one, and the run's summary names it with the death: a
    crash of the daemon (seen: libvirtd 9.0's virObjectUnref) is not a verdict on the test, but it is shown."""
    if "testbed" not in getattr(item, "fixturenames", ()):
        return None
    from _pytest.runner import runtestprotocol
    revive_libvirtd(item.nodeid)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    pid = _LIBVIRTD.get("pid")
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    pid = pid or _LIBVIRTD.get("pid")           # the process's first testbed test: the fixture read it just now
    if pid and any(r.failed for r in reports) and not _running(pid):
        revive_libvirtd(item.nodeid)
        _note_rerun(pid, item.nodeid)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _libvirtd_deaths(since: float) -> list[dict[str, Any]]:
    """The deaths written down since ``since`` (wall clock), one per pid (several workers may notice one)."""
    seen: dict[int, dict[str, Any]] = {}
    try:
        lines = _DEATHS.read_text().splitlines()
    except OSError:
        return []
    reruns: dict[int, list[str]] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("time", 0) < since:
            continue
        if "ran_again" in rec:
            reruns.setdefault(rec["pid"], []).append(rec["ran_again"])
        elif rec.get("pid") not in seen:
            seen[rec["pid"]] = rec
    return [{**rec, "ran_again": reruns.get(pid, [])} for pid, rec in seen.items()]


# Under CI every part is installed, so any skip (a module-level importorskip, a missing binary, a
# fixture that could not start) hides something that did not run: report it as a failure.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if in_ci() and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"module skipped under CI=true, which counts as a failure: {report.longrepr}"


@pytest.fixture(autouse=True)
def _host_state_in_tmp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests keep their audit logs, and unit tests the host-side lock and log, under a temporary directory.

    The client's log (VGPUVIRT_AUDIT_LOG) would otherwise land in ~/.local/state. The host defaults,
    /run/vgpuvirt and /var/log/vgpuvirt, are root's (and shared with any real vgpuvirt on the machine);
    unit tests run without root. Integration tests (root, real parts) keep the real host defaults.
    (Not through ``monkeypatch``: an autouse fixture asking for it would tear it down after the tests'
    own fixtures.)
    """
    base = tmp_path_factory.getbasetemp()
    saved_env = os.environ.get("VGPUVIRT_AUDIT_LOG")
    os.environ["VGPUVIRT_AUDIT_LOG"] = str(base / "client-audit.jsonl")
    from vgpuvirt.host import agent
    from vgpuvirt.host.base import BaseHost
    saved = BaseHost.lock_path, BaseHost.audit_path
    saved_agent = agent.HOST_CONFIG, agent.DEFAULT_AUDIT_LOG
    if not request.node.get_closest_marker("integration"):
        BaseHost.lock_path = str(base / "host-state" / "lock")
        BaseHost.audit_path = str(base / "host-log" / "audit.jsonl")
        # the agent called in-process without a path (layout boot, tests of handle) takes the host's own
        agent.HOST_CONFIG = str(base / "host-config" / "agent.json")
        agent.DEFAULT_AUDIT_LOG = str(base / "host-log" / "audit.jsonl")
    try:
        yield
    finally:
        BaseHost.lock_path, BaseHost.audit_path = saved
        agent.HOST_CONFIG, agent.DEFAULT_AUDIT_LOG = saved_agent
        if saved_env is None:
            os.environ.pop("VGPUVIRT_AUDIT_LOG", None)
        else:
            os.environ["VGPUVIRT_AUDIT_LOG"] = saved_env


# -- generated-case suites (tests/property, tests/fuzz) --------------------------------------------
# Their fixtures and summary lines live here: a second file named conftest.py in a subdirectory would
# shadow this one for the test modules that `from conftest import ...` (pytest imports each as "conftest").

_REFEREE_TALLY = pytest.StashKey[Counter]()


@pytest.fixture(scope="session")
def referee_tally(request: pytest.FixtureRequest) -> Counter:
    """The capacity referee's session-wide counts (cases per property, planner refusals, ...)."""
    return request.config.stash.setdefault(_REFEREE_TALLY, Counter())


@pytest.fixture(scope="module")
def opened_hosts() -> Iterator[list[Any]]:
    """Every Host the CLI opens (through ``open_host``) is appended here, so a fuzz test can look at its state."""
    import vgpuvirt.cli.targets
    from vgpuvirt.hosts import open_host

    opened: list[Any] = []

    def recording_open_host(*a: Any, **kw: Any) -> Any:
        host = open_host(*a, **kw)
        opened.append(host)
        return host

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vgpuvirt.cli.targets, "open_host", recording_open_host)   # every verb opens hosts there
        yield opened


_FUZZ_CASES = pytest.StashKey[Counter]()
_LANES = pytest.StashKey[dict]()
_STARTED = pytest.StashKey[float]()
_STARTED_WALL = pytest.StashKey[float]()


def _fuzz_cases() -> Counter:
    fuzzkit = sys.modules.get("fuzzkit")          # tests/fuzz/fuzzkit.py, when the fuzz suite ran here
    return Counter(getattr(fuzzkit, "CASES", {}) if fuzzkit is not None else {})


def pytest_sessionstart(session: pytest.Session) -> None:
    import time
    session.config.stash[_STARTED] = time.monotonic()
    session.config.stash[_STARTED_WALL] = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # An xdist worker hands its counts to the controller, which prints the summary (pytest_testnodedown).
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["vgpuvirt_referee"] = dict(session.config.stash.get(_REFEREE_TALLY, Counter()))
        out["vgpuvirt_fuzz"] = dict(_fuzz_cases())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist: add a finished worker's generated-case counts to this (the controller's) session."""
    out = getattr(node, "workeroutput", None) or {}
    config = node.config
    config.stash.setdefault(_REFEREE_TALLY, Counter()).update(out.get("vgpuvirt_referee", {}))
    config.stash.setdefault(_FUZZ_CASES, Counter()).update(out.get("vgpuvirt_fuzz", {}))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Per lane (tests/unit, integration, property, fuzz): tests run and the time they took, all phases.
    Under xdist the controller sees every worker's reports here."""
    config = _CONFIG[0] if _CONFIG else None
    if config is None or getattr(config, "workerinput", None) is not None:
        return
    lanes = config.stash.setdefault(_LANES, {})
    parts = report.nodeid.split("/")
    lane = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    n, secs = lanes.get(lane, (0, 0.0))
    lanes[lane] = (n + (1 if report.when == "call" or (report.when == "setup" and report.skipped) else 0),
                   secs + report.duration)


#: the simulator's scale profile (256 mdev parents): a test run on it is `slow`; the inner loop runs the same code on
#: the other profiles, CI runs it on every one
SCALE_PROFILE = "large"


def _on_the_scale_profile(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("profile") == SCALE_PROFILE


@pytest.hookimpl(tryfirst=True)   # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test parametrized with ``profile="large"`` is marked `slow`. Then longest first (the LPT rule): the
    tests marked `waits` (they mostly wait on daemons, so their waiting overlaps the other workers' CPU work), then
    the `slow` tests, then the rest, each in collection order. xdist hands tests out in this order, so no worker is
    left with a minute-long test while the other idles at the end. Every process sorts the same collection the
    same way (xdist checks that the workers agree)."""
    for item in items:
        if _on_the_scale_profile(item):
            item.add_marker(pytest.mark.slow)

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("waits"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than CPUs. Several integration tests wait on daemons (Prometheus, libvirtd's
    QEMUs, sshd) rather than compute; the extra worker computes meanwhile (on 2 cores: 412 s against 449 s)."""
    return (os.cpu_count() or 1) + 1


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """How many generated cases the property and fuzz suites ran, and the time per lane (shown under ``-q``)."""
    import time
    tally = config.stash.get(_REFEREE_TALLY, None)
    if tally:
        total = tally["soundness cases"] + tally["completeness cases"]
        terminalreporter.write_sep("-", "capacity referee")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        terminalreporter.write_line(f"{total} generated cases run: {counts}")
    cases = config.stash.get(_FUZZ_CASES, None) or _fuzz_cases()
    if cases:
        terminalreporter.write_sep("-", f"fuzz: {sum(cases.values())} generated cases in {len(cases)} tests")
        if config.getoption("verbose") > 0:
            for name, n in sorted(cases.items()):
                terminalreporter.write_line(f"  {n:6d}  {name}")
    deaths = _libvirtd_deaths(config.stash.get(_STARTED_WALL, 0.0))
    if deaths and getattr(config, "workerinput", None) is None:
        terminalreporter.write_sep("!", f"the testbed's libvirtd died {len(deaths)} time(s) during this run")
        for rec in deaths:
            when = time.strftime("%H:%M:%S", time.localtime(rec["time"]))
            terminalreporter.write_line(f"  pid {rec['pid']}: noticed at {when} on {rec['worker']} before "
                                        f"{rec['noticed_before']}; started again")
            for nodeid in rec.get("ran_again", []):
                terminalreporter.write_line(f"    failed while it died, ran again: {nodeid}")
            for line in rec.get("kernel", []):
                terminalreporter.write_line(f"    kernel: {line}")
            for line in rec.get("log_tail", [])[-3:]:
                terminalreporter.write_line(f"    log: {line}")
    lanes = config.stash.get(_LANES, None)
    if lanes:
        started = config.stash.get(_STARTED, None)
        wall = time.monotonic() - started if started is not None else 0.0
        workers = getattr(config.option, "numprocesses", None) or 0
        terminalreporter.write_sep("-", f"lanes: wall {wall:.1f} s"
                                        + (f" on {workers} xdist workers" if workers else " (one process)"))
        for lane, (n, secs) in sorted(lanes.items()):
            terminalreporter.write_line(f"  {lane:12s} {n:5d} tests  {secs:8.1f} s of test time")
