"""LocalHost on a temporary tree: the Host semantics every host shares (reads, batches, lock, exec)."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vgpuvirt.errors import HostError, InvalidSpec, LockTimeout
from vgpuvirt.host import Host, LocalHost, Op

DEV = "/sys/bus/pci/devices"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for i, dev in enumerate(("0000:3b:00.0", "0000:3c:00.0", "0000:af:00.0")):
        d = root / DEV.lstrip("/") / dev
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "device").write_text(f"0x1eb{i}\n")
        (d / "avail").write_text(f"{i}\n")
        (d / ".hidden").write_text("x\n")
        (d / "mdev_supported_types").mkdir()
    drv = root / "sys/bus/pci/drivers/nvidia"
    drv.mkdir(parents=True)
    os.symlink("../../drivers/nvidia", root / DEV.lstrip("/") / "0000:3b:00.0/driver")
    os.symlink("../../nowhere", root / DEV.lstrip("/") / "0000:3c:00.0/driver")  # dangling: still a link
    return root


@pytest.fixture
def host(tree: Path, tmp_path: Path) -> LocalHost:
    return LocalHost(str(tree), lock_path=str(tmp_path / "lock"))


def test_is_a_host(host: LocalHost) -> None:
    assert isinstance(host, Host)
    assert host.sysfs_root.endswith("/root")


@pytest.mark.parametrize("root", ["relative/dir", "/nonexistent/dir"])
def test_bad_sysfs_root_refused(root: str) -> None:
    with pytest.raises(InvalidSpec):
        LocalHost(root)


# ---------------------------------------------------------------- read
def test_read_globs_files_links_dirs_in_one_round_trip(host: LocalHost) -> None:
    snap = host.read([f"{DEV}/*/vendor", f"{DEV}/*/driver", f"{DEV}/0000:3[bc]:00.?/mdev_supported_types",
                      f"{DEV}/*/missing"])
    assert host.round_trips == 1
    assert snap.glob(f"{DEV}/*/vendor") == [f"{DEV}/0000:3b:00.0/vendor", f"{DEV}/0000:3c:00.0/vendor",
                                            f"{DEV}/0000:af:00.0/vendor"]
    assert snap.text(f"{DEV}/0000:af:00.0/vendor") == "0x10de"
    assert snap.raw(f"{DEV}/0000:af:00.0/vendor") == "0x10de\n"
    assert snap[f"{DEV}/0000:3b:00.0/driver"].kind == "link"
    assert snap.link_name(f"{DEV}/0000:3b:00.0/driver") == "nvidia"
    assert snap.link(f"{DEV}/0000:3b:00.0/driver") == "../../drivers/nvidia"
    assert snap.link(f"{DEV}/0000:3c:00.0/driver") == "../../nowhere"
    assert not snap.has(f"{DEV}/0000:af:00.0/driver")          # absent: simply not in the snapshot
    assert snap.is_dir(f"{DEV}/0000:3b:00.0/mdev_supported_types")
    assert not snap.has(f"{DEV}/0000:af:00.0/mdev_supported_types")  # [bc] excluded af
    assert not any(p.endswith("missing") for p in snap)


def test_star_skips_dotfiles_unless_asked(host: LocalHost) -> None:
    assert not any(".hidden" in p for p in host.read([f"{DEV}/0000:3b:00.0/*"]))
    assert host.read([f"{DEV}/0000:3b:00.0/.*"]).text(f"{DEV}/0000:3b:00.0/.hidden") == "x"


def test_overlapping_patterns_give_each_path_once(host: LocalHost) -> None:
    snap = host.read([f"{DEV}/*/vendor", f"{DEV}/0000:3b:00.0/vendor", f"{DEV}/0000:3b:00.0/*"])
    assert snap.children(f"{DEV}/0000:3b:00.0") == ["avail", "device", "driver", "mdev_supported_types", "vendor"]
    assert len(snap) == len(set(snap))


def test_unreadable_file_is_an_error_entry_with_errno(tmp_path: Path) -> None:
    # /proc/self/mem opens but read(2) at offset 0 fails with EIO: a per-entry error, not a failed read
    snap = LocalHost("/").read(["/proc/self/mem", "/proc/self/comm"])
    assert snap["/proc/self/mem"].kind == "error"
    assert snap["/proc/self/mem"].errno == errno.EIO
    assert snap.text("/proc/self/mem") is None
    assert snap.text("/proc/self/comm")


@pytest.mark.parametrize("bad", ["/sys/../etc/shadow", "sys/bus", "/sys/./x"])
def test_read_refuses_dot_components_before_anything_runs(host: LocalHost, bad: str) -> None:
    with pytest.raises(InvalidSpec):
        host.read([bad])
    assert host.round_trips == 0


def test_agent_refusal_is_a_host_error(host: LocalHost) -> None:
    # a request that bypasses the client's validation is refused by the agent itself
    with pytest.raises(HostError, match="refused"):
        host._checked(host._exchange({"root": host.sysfs_root, "reads": ["/sys/.."]}, idempotent=True))


# ---------------------------------------------------------------- apply
def test_writes_land_and_errors_are_per_item(host: LocalHost, tree: Path) -> None:
    d = f"{DEV}/0000:3b:00.0"
    res = host.apply([Op.write(f"{d}/avail", "7"), Op.write(f"{d}/nope", "1"),
                      Op.write(f"{d}/mdev_supported_types", "1"), Op.write(f"{d}/vendor/x", "1")],
                     on_error="continue")
    assert host.round_trips == 1
    assert [r.ok for r in res] == [True, False, False, False]
    assert [r.errno for r in res] == [None, errno.ENOENT, errno.EISDIR, errno.ENOTDIR]
    assert all(r.error for r in res.failures())
    assert (tree / d.lstrip("/") / "avail").read_text() == "7"
    assert not (tree / d.lstrip("/") / "nope").exists()  # never O_CREAT: a missing attribute stays missing


def test_on_error_stop_skips_the_rest(host: LocalHost, tree: Path) -> None:
    d = f"{DEV}/0000:3b:00.0"
    res = host.apply([Op.write(f"{d}/nope", "1"), Op.write(f"{d}/avail", "9")])
    assert [(r.ok, r.skipped) for r in res] == [(False, False), (False, True)]
    assert res.failures() == [res[0]]
    assert (tree / d.lstrip("/") / "avail").read_text() == "0\n"


def test_on_error_continue_with_groups_skips_only_the_failed_group(host: LocalHost, tree: Path) -> None:
    a, b = f"{DEV}/0000:3b:00.0", f"{DEV}/0000:3c:00.0"
    res = host.apply([Op.write(f"{a}/nope", "1", group="a"), Op.write(f"{b}/avail", "5", group="b"),
                      Op.write(f"{a}/avail", "5", group="a"), Op.write(f"{b}/device", "0x1", group="b")],
                     on_error="continue")
    assert [(r.ok, r.skipped) for r in res] == [(False, False), (True, False), (False, True), (True, False)]
    assert (tree / a.lstrip("/") / "avail").read_text() == "0\n"
    assert (tree / b.lstrip("/") / "avail").read_text() == "5"


def test_on_error_value_checked(host: LocalHost) -> None:
    with pytest.raises(InvalidSpec):
        host.apply([], on_error="ignore")


def test_check_int(host: LocalHost, tree: Path) -> None:
    d = f"{DEV}/0000:3c:00.0"
    (tree / d.lstrip("/") / "device").write_text("not a number\n")
    res = host.apply([Op.check_int(f"{d}/avail", 1), Op.check_int(f"{d}/avail", 2), Op.check_int(f"{d}/device", 0),
                      Op.check_int(f"{d}/nope", 0)], on_error="continue")
    assert [(r.ok, r.errno, r.value) for r in res] == [
        (True, None, 1), (False, errno.ENOSPC, 1), (False, errno.EINVAL, None), (False, errno.ENOENT, None)]


def test_check_absent(host: LocalHost) -> None:
    res = host.apply([Op.check_absent(f"{DEV}/0000:3b:00.0/nope"), Op.check_absent(f"{DEV}/0000:3b:00.0/vendor")],
                     on_error="continue")
    assert [(r.ok, r.errno) for r in res] == [(True, None), (False, errno.EEXIST)]


def test_wait_sees_a_change_made_meanwhile(host: LocalHost, tree: Path) -> None:
    target = tree / DEV.lstrip("/") / "0000:3b:00.0" / "late"
    timer = threading.Timer(0.2, target.write_text, args=("ready\n",))
    timer.start()
    try:
        res = host.apply([Op.wait(f"{DEV}/0000:3b:00.0/late", timeout=30),
                          Op.wait(f"{DEV}/0000:3b:00.0/late", "equals", "ready", timeout=30)])
    finally:
        timer.join()
    assert res.ok


def test_wait_states_and_timeout(host: LocalHost) -> None:
    d = f"{DEV}/0000:3b:00.0"
    res = host.apply([Op.wait(f"{d}/nope", "absent", timeout=0), Op.wait(f"{d}/driver", "link_endswith", "nvidia",
                                                                         timeout=0),
                      Op.wait(f"{d}/vendor", "equals", "0x8086", timeout=0.05)], on_error="continue")
    assert [(r.ok, r.errno) for r in res] == [(True, None), (True, None), (False, errno.ETIMEDOUT)]
    with pytest.raises(InvalidSpec):
        Op.wait(f"{d}/vendor", "changed")


def test_exec_ops(host: LocalHost) -> None:
    res = host.apply([Op.exec([sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc"),
                      Op.exec([sys.executable, "-c", "raise SystemExit(3)"], ok_codes=(0, 3)),
                      Op.exec([sys.executable, "-c", "raise SystemExit(4)"]),
                      Op.exec(["/nonexistent/tool"]),
                      Op.exec([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.2)],
                     on_error="continue")
    assert (res[0].ok, res[0].rc, res[0].stdout) == (True, 0, "cba\n")
    assert (res[1].ok, res[1].rc) == (True, 3)
    assert (res[2].ok, res[2].rc) == (False, 4)
    assert (res[3].ok, res[3].rc, res[3].errno) == (False, 127, errno.ENOENT)
    assert (res[4].ok, res[4].errno) == (False, errno.ETIMEDOUT)


def test_reads_after_come_back_with_the_batch(host: LocalHost) -> None:
    d = f"{DEV}/0000:3b:00.0"
    res = host.apply([Op.write(f"{d}/avail", "3\n")], reads_after=[f"{d}/avail"])
    assert res.after.text(f"{d}/avail") == "3"
    assert host.round_trips == 1


@pytest.mark.parametrize("make", [lambda: Op.write("/sys/../x", "1"), lambda: Op.write("/sys/x", "a\0b"),
                                  lambda: Op.exec([]), lambda: Op.exec(["ls", "a\0"]), lambda: Op.check_int("x", 1)])
def test_bad_ops_refused_at_construction(make: object) -> None:
    with pytest.raises(InvalidSpec):
        make()  # type: ignore[operator]


# ---------------------------------------------------------------- the host-side lock
_LOCKED_APPLY = """
import sys
from vgpuvirt.host import LocalHost, Op
root, lock, log, path, value = sys.argv[1:]
h = LocalHost(root, lock_path=lock, audit_path=log)
print("ready", flush=True)
r = h.apply([Op.write(path, value)])
print("done", r.ok, r.lock_wait_s, flush=True)
"""


def test_flock_serializes_batches_across_processes(tree: Path, tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    attr = f"{DEV}/0000:3b:00.0/avail"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another vgpuvirt holds the host lock
    proc = subprocess.Popen([sys.executable, "-c", _LOCKED_APPLY, str(tree), str(lock),
                             str(tmp_path / "log" / "audit.jsonl"), attr, "42"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.5)  # room for a broken lock to let the write through
        assert (tree / attr.lstrip("/")).read_text() == "0\n"
        assert proc.poll() is None
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    out, _ = proc.communicate(timeout=60)
    ok, waited = out.split()[1:]
    assert ok == "True"
    # it waited for the lock: the parent held it 0.5 s after "ready", and the child's wait starts a little after
    # it printed that (a run measured 0.4984 s)
    assert float(waited) >= 0.4
    assert (tree / attr.lstrip("/")).read_text() == "42"


def test_lock_timeout_is_a_clear_error_and_nothing_runs(host: LocalHost, tree: Path, tmp_path: Path) -> None:
    host.lock_timeout = 0.1
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(LockTimeout, match="lock"):
            host.apply([Op.write(f"{DEV}/0000:3b:00.0/avail", "5")])
    finally:
        os.close(fd)
    assert (tree / DEV.lstrip("/") / "0000:3b:00.0/avail").read_text() == "0\n"
    assert host.apply([Op.write(f"{DEV}/0000:3b:00.0/avail", "5")], lock=False).ok


# ---------------------------------------------------------------- run
def test_run(host: LocalHost) -> None:
    r = host.run([sys.executable, "-c", "import sys; sys.stdout.write(sys.argv[1]); sys.exit(2)", "a b;$(c)"])
    assert (r.exit_code, r.stdout, r.ok) == (2, "a b;$(c)", False)
    assert r.argv[-1] == "a b;$(c)"
    assert host.run(["/nonexistent/tool"]).exit_code == 127
    with pytest.raises(HostError, match="timed out"):
        host.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.2)
    with pytest.raises(InvalidSpec):
        host.run([])
