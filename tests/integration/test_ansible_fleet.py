"""The fleet proof: real ansible-playbook over real sshd to 3 test hosts, each with its own live
FUSE-simulated GPU host, provisioning a pool of VDI desktops counted across the fleet (vgpu_pool)
through the real libvirtd (qemu:///system).

Order of the main test: check mode (reports changes, changes nothing: verified on every host's
sysfs and in libvirt), the real run, the same playbook again (changed=0 everywhere), the pool grown,
then the teardown playbook (every host as it started: snapshot compared). The SSH sessions each
run opens on each host are counted in that host's sshd log (LogLevel VERBOSE logs one "Starting
session" per exec): a survey and one batched apply per host, whatever the count. A second test stops
one host's sshd: that host fails as unreachable, the others hold the whole pool.

Why qemu:///system and not the test driver: ``test:///default`` (and ``test:///PATH.xml``) live in
the process that opens them, and every Ansible task is a new process, so nothing would persist
from one task to the next. The three test hosts share the one libvirtd of this machine; each
records its inventory name in the domains it makes (``host_name``), and vgpuvirt ignores domains
recorded for another host.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import require_part  # type: ignore[import-not-found]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "ansible"
COLLECTION_SRC = REPO / "ansible_collections" / "vgpuvirt" / "kvm_gpu"
# One profile per host: mdev (T4), vGPU 17+ VFs (L40S), and a mixed box.
PROFILES = ("t4x2", "l40s-vgpu17", "mixed")
VDI_COUNT = 6          # across the three hosts (spread: 2 each); the grown pool has 12

# xdist_group: the extra test hosts are shared, and the fleet test stops and restarts them; under
# `pytest -n ... --dist loadgroup` every module of the group runs on one worker, one after the other.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("extra-hosts")]


def ansible_bin(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def require_fleet_parts() -> None:
    require_part("root", os.geteuid() == 0, "sshd, FUSE mounts and libvirtd need root")
    require_part("ansible-playbook", ansible_bin("ansible-playbook") is not None, "pip install ansible-core")
    require_part("sshd", os.path.exists("/usr/sbin/sshd") and shutil.which("ssh") is not None,
                 "apt-get install openssh-server openssh-client")
    require_part("fuse", os.path.exists("/dev/fuse") and _has_module("mfusepy"), "/dev/fuse and mfusepy")
    require_part("libvirt-python", _has_module("libvirt"), "pip install libvirt-python")


def _has_module(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------------------------------------------ the collection


@functools.cache
def installed_collections() -> Path:
    """The collection as users get it: ``ansible-galaxy collection build``, then ``install`` into a temporary
    path, once per test process. The playbooks run from there (collections_path), never from the source tree,
    so a file the build leaves out fails them."""
    exe = ansible_bin("ansible-galaxy")
    require_part("ansible-galaxy", exe is not None, "installed with ansible-core (the dev extra)")
    assert exe is not None
    top = Path(tempfile.mkdtemp(prefix="vgpuvirt-collection-"))
    atexit.register(shutil.rmtree, top, True)
    env = dict(os.environ, ANSIBLE_HOME=str(top / "home"), ANSIBLE_LOCAL_TEMP=str(top / "tmp"),
               PYTHONPATH=str(vgpuvirt_path()))
    subprocess.run([exe, "collection", "build", "--output-path", str(top / "dist"), str(COLLECTION_SRC)],
                   check=True, capture_output=True, text=True, env=env)
    (tarball,) = (top / "dist").glob("vgpuvirt-kvm_gpu-*.tar.gz")
    subprocess.run([exe, "collection", "install", "--offline", "-p", str(top / "collections"), str(tarball)],
                   check=True, capture_output=True, text=True, env=env)
    assert (top / "collections" / "ansible_collections" / "vgpuvirt" / "kvm_gpu" / "MANIFEST.json").is_file()
    return top / "collections"


@functools.cache
def vgpuvirt_path() -> Path:
    """A PYTHONPATH entry that gives this checkout's vgpuvirt and nothing else. Not the repository root: Ansible
    takes an ``ansible_collections`` directory on sys.path for installed collections, so the root would make
    every run load the collection's source instead of the installed copy (and ``install`` skip it)."""
    top = Path(tempfile.mkdtemp(prefix="vgpuvirt-pythonpath-"))
    atexit.register(shutil.rmtree, top, True)
    (top / "vgpuvirt").symlink_to(REPO / "vgpuvirt", target_is_directory=True)
    return top


# ------------------------------------------------------------------------------------------ ansible runs


@dataclass
class Recap:
    ok: int
    changed: int
    unreachable: int
    failed: int


@dataclass
class PlaybookRun:
    rc: int
    stdout: str
    stderr: str
    recap: dict[str, Recap]

    def changed_items(self, host: str) -> int:
        """Loop items reported changed for ``host`` (the recap counts tasks, not items)."""
        return len(re.findall(rf"^changed: \[{re.escape(host)}\] => \(item=", self.stdout, re.M))

    def explain(self) -> str:
        return f"rc={self.rc}\n--- stdout (tail)\n{self.stdout[-6000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}"


_RECAP_RE = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def parse_recap(text: str) -> dict[str, Recap]:
    part = text.rsplit("PLAY RECAP", 1)[-1] if "PLAY RECAP" in text else ""
    return {m[1]: Recap(int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in _RECAP_RE.finditer(part)}


@dataclass
class Ansible:
    """ansible-playbook with everything it writes under one tmp dir (ansible.cfg: home, local_tmp,
    remote_tmp, control_path_dir)."""

    workdir: Path
    inventory: Path
    cfg: Path = field(init=False)

    def __post_init__(self) -> None:
        self.cfg = self.workdir / "ansible.cfg"
        (self.workdir / "cp").mkdir(parents=True, exist_ok=True)
        self.cfg.write_text(f"""[defaults]
home = {self.workdir}/home
local_tmp = {self.workdir}/local_tmp
remote_tmp = {self.workdir}/remote_tmp
collections_path = {installed_collections()}
inventory = {self.inventory}
forks = 10
host_key_checking = True
retry_files_enabled = False
nocolor = True
stdout_callback = default
callback_result_format = yaml
interpreter_python = {sys.executable}
timeout = 15

[ssh_connection]
control_path_dir = {self.workdir}/cp
pipelining = True
""")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(PYTHONPATH=str(vgpuvirt_path()), ANSIBLE_CONFIG=str(self.cfg), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOME=str(self.workdir / "home"),
                   ANSIBLE_LOCAL_TEMP=str(self.workdir / "local_tmp"))
        return env

    def playbook(self, playbook: Path, *args: str, extra: dict[str, Any] | None = None) -> PlaybookRun:
        exe = ansible_bin("ansible-playbook")
        assert exe is not None
        argv = [exe, str(playbook), *args]
        if extra:
            argv += ["-e", json.dumps(extra)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env(), cwd=self.workdir, check=False)
        return PlaybookRun(proc.returncode, proc.stdout, proc.stderr, parse_recap(proc.stdout))


# ------------------------------------------------------------------------------------------ the fleet


@dataclass
class FleetHost:
    name: str                 # inventory name (unique per test run: domain names derive from it)
    ssh_host: str
    ssh_port: int
    profile: str
    sysfs_root: str           # the FUSE mount point (holds sys/)
    pid_file: str
    sshd_log: str = ""


def mount_sim(profile: str, parent: Path, tag: str) -> tuple[str, str]:
    from vgpuvirt.sim import fuse

    mp = parent / f"ansible-{tag}-{profile}"
    mp.mkdir(parents=True, exist_ok=True)
    pid_file = str(parent / f".ansible-{tag}-{profile}.pid")
    fuse.start(profile, str(mp), pid_file=pid_file)
    return str(mp), pid_file


def unmount_sim(mp: str, pid_file: str) -> None:
    from vgpuvirt.sim import fuse

    fuse.stop(mp, pid_file=pid_file)
    shutil.rmtree(mp, ignore_errors=True)


def write_inventory(path: Path, hosts: list[FleetHost], env: dict[str, Any], known_hosts: str, prefix: str,
                    bind: str) -> None:
    inv = {"hypervisors": {
        "hosts": {h.name: {"ansible_host": h.ssh_host, "ansible_port": h.ssh_port,
                           "vgpu_sysfs_root": h.sysfs_root, "vgpu_host_name": h.name} for h in hosts},
        "vars": {
            "ansible_user": "root",
            "ansible_connection": "ssh",
            "ansible_ssh_private_key_file": env["identity"],
            # BindAddress: this test's connections come from their own loopback address, so sshd's log tells
            # them apart from other tests' sessions on the same hosts
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
                                       f"-o BatchMode=yes -o GlobalKnownHostsFile=/dev/null -o BindAddress={bind}",
            # the interpreter where vgpuvirt is installed on the target: this repo's venv, importing this repo
            "ansible_python_interpreter": str(repo_python(path.parent)),
            "vgpu_uri": env["libvirt_uri"],
            # no vdi_state: the playbook's default (defined) must work here (no VFIO: no vGPU VM starts)
            "vdi_count": VDI_COUNT,
            "vdi_prefix": prefix + "vdi",
            "vdi_policy": "spread",
            "vdi_memory_mib": 512,
            # the pool runs the CLI's pre-flight: the vdi template's libvirt network "default" does not exist on
            # the testbed's libvirtd, so the desktops get a user-mode NIC
            "vdi_domain_options": {"virtio_nics": [{"kind": "user"}]},
        },
    }}
    path.write_text(json.dumps({"all": {"children": inv}}, indent=1))


def repo_python(where: Path) -> Path:
    """A wrapper around this venv's Python that imports THIS checkout's vgpuvirt on the targets (a
    worktree is not what the venv has installed; sshd passes no PYTHONPATH along)."""
    exe = where / "python-repo"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={vgpuvirt_path()} exec {sys.executable} "$@"\n')
    exe.chmod(0o755)
    return exe


def host_snapshot(h: FleetHost) -> dict[str, Any]:
    """What a teardown must restore: mdevs, free instances, VF types, drivers (read from the FUSE tree)."""
    from vgpuvirt.host.local import LocalHost

    snap = LocalHost(h.sysfs_root, name=h.name).read([
        "/sys/bus/mdev/devices/*",
        "/sys/bus/mdev/devices/*/mdev_type",
        "/sys/class/mdev_bus/*/mdev_supported_types/*/available_instances",
        "/sys/bus/pci/devices/*/nvidia/current_vgpu_type",
        "/sys/bus/pci/devices/*/driver",
    ])
    return snap.to_wire()


def vgpus_on(h: FleetHost) -> list[str]:
    """mdev UUIDs and VFs with a vGPU type on one host."""
    from vgpuvirt.host.local import LocalHost
    from vgpuvirt.services.inventory.read import inventory

    inv = inventory(LocalHost(h.sysfs_root, name=h.name), use_nvml=False)
    return sorted([str(m.uuid) for m in inv.mdevs] + [str(v.address) for v in inv.vendor_vgpu if v.current_type])


def fleet_domains(uri: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Our domains in libvirt: name -> vgpuvirt metadata (host, gpus)."""
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision.plan import domain_meta

    with LibvirtConnection(uri) as conn:
        return {d.name: domain_meta(d.xml) or {} for d in conn.domains() if d.name.startswith(prefix)}


def undefine_all(uri: str, prefix: str) -> None:
    from vgpuvirt.libvirt_conn import LibvirtConnection

    with LibvirtConnection(uri) as conn:
        for d in conn.domains():
            if d.name.startswith(prefix):
                conn.destroy(d.name)
                conn.undefine(d.name)


@dataclass
class Fleet:
    hosts: list[FleetHost]
    env: dict[str, Any]
    prefix: str
    workdir: Path
    known_hosts: str
    stop_host: Callable[[int], None] = lambda n: None   # scripts/testbed.sh host-down N
    start_hosts: Callable[[int], Any] = lambda n: None  # scripts/testbed.sh hosts-up N
    bind: str = "127.0.0.1"                              # this test's source address

    def ansible(self, hosts: list[FleetHost], tag: str) -> Ansible:
        d = self.workdir / tag
        d.mkdir(parents=True, exist_ok=True)
        inv = d / "inventory.json"
        write_inventory(inv, hosts, self.env, self.known_hosts, self.prefix, self.bind)
        return Ansible(d, inv)


@pytest.fixture(scope="module")
def fleet(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_fleet_parts()
    # three hosts that stay up, and a fourth whose sshd test_journey_a_pool_with_a_host_down_and_back stops
    extra = testbed.extra_hosts(len(PROFILES) + 1)   # scripts/testbed.sh hosts-up 4 (idempotent: restarts h4)
    env = dict(testbed.env, hosts=[{"ssh_host": h.ssh_host, "ssh_port": h.ssh_port, "mnt_dir": h.mnt_dir,
                                    "sshd_log": h.sshd_log} for h in extra])
    tag = uuid.uuid4().hex[:6]
    workdir = Path(tmp_path_factory.mktemp("ansible-fleet"))
    mounts: list[tuple[str, str]] = []
    hosts: list[FleetHost] = []
    try:
        for i, (profile, th) in enumerate(zip([*PROFILES, "t4x2"], env["hosts"], strict=True), start=1):
            parent = Path(th["mnt_dir"])
            mp, pid_file = mount_sim(profile, parent, tag)
            mounts.append((mp, pid_file))
            hosts.append(FleetHost(f"fleet{tag}-h{i}", th["ssh_host"], int(th["ssh_port"]), profile, mp, pid_file,
                                   th["sshd_log"]))
        bind = f"127.0.3.{int(tag, 16) % 250 + 2}"
        yield Fleet(hosts, env, f"fleet{tag}-", workdir, env["known_hosts"], testbed.stop_extra_host,
                    testbed.extra_hosts, bind)
    finally:
        if "env" in locals():
            undefine_all(env["libvirt_uri"], f"fleet{tag}-")
        for mp, pid_file in mounts:
            unmount_sim(mp, pid_file)


# ------------------------------------------------------------------------------------------ ssh sessions


def log_size(h: FleetHost) -> int:
    return Path(h.sshd_log).stat().st_size if os.path.exists(h.sshd_log) else 0


def sessions_since(h: FleetHost, offset: int, bind: str) -> int:
    """Execs this test opened on ``h`` since ``offset`` of its sshd log (sshd logs one "Starting session"
    per exec at LogLevel VERBOSE; our connections come from our own address, ``bind``)."""
    with open(h.sshd_log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return len(re.findall(rf"Starting session: command for \S+ from {re.escape(bind)} port \d+", text))


def counted(fleet: Fleet, hosts: list[FleetHost], go: Callable[[], PlaybookRun]) -> tuple[PlaybookRun, dict[str, int]]:
    """Run a playbook and count the SSH sessions it opened on each host."""
    marks = {h.name: log_size(h) for h in hosts}
    run = go()
    return run, {h.name: sessions_since(h, marks[h.name], fleet.bind) for h in hosts}


def pool_members(run: PlaybookRun) -> dict[str, dict[str, str]]:
    """host -> {member: state} from the Summary task's lines."""
    import yaml  # ansible-core's own dependency

    out: dict[str, dict[str, str]] = {}
    summary = run.stdout.split("TASK [Summary]", 1)[-1].split("PLAY RECAP", 1)[0]
    # each result is YAML under "ok: [HOST] =>", its msg possibly folded over several lines
    for m in re.finditer(r"^ok: \[(\S+)\] =>\s*\n((?:[ \t]+\S.*\n?)+)", summary, re.M):
        text = str(yaml.safe_load(m[2])["msg"])
        out[m[1]] = {} if text == "no desktops here" else dict(p.split(": ") for p in text.split(", "))
    return out


# ------------------------------------------------------------------------------------------ the tests


def test_fleet_pool_check_apply_converge_grow_teardown(fleet: Fleet) -> None:
    hosts = fleet.hosts[:3]
    ans = fleet.ansible(hosts, "main")
    uri = fleet.env["libvirt_uri"]
    prefix = fleet.prefix + "vdi"
    start = {h.name: host_snapshot(h) for h in hosts}
    assert fleet_domains(uri, fleet.prefix) == {}

    # 1. check mode: the pool is placed across the fleet and diffed; nothing changes anywhere
    run = ans.playbook(EXAMPLES / "fleet_vdi.yml", "--check", "--diff")
    assert run.rc == 0, run.explain()
    assert set(run.recap) == {h.name for h in hosts}, run.explain()
    planned = pool_members(run)
    assert sum(len(v) for v in planned.values()) == VDI_COUNT, run.explain()
    assert sorted(n for v in planned.values() for n in v) == [f"{prefix}-{i:02d}" for i in range(1, VDI_COUNT + 1)]
    for h in hosts:
        r = run.recap[h.name]
        assert r.failed == 0 and r.unreachable == 0 and r.changed == (1 if planned[h.name] else 0), run.explain()
        assert host_snapshot(h) == start[h.name], f"check mode changed {h.name}'s sysfs"
    assert fleet_domains(uri, fleet.prefix) == {}, "check mode defined domains"
    # the diff lists each new member
    assert len(re.findall(rf"^\+\s+{re.escape(prefix)}-\d+: defined$", run.stdout, re.M)) == VDI_COUNT, run.explain()
    # spread over the fleet: every host takes a share (counts are fleet-wide, not per host)
    assert all(planned[h.name] for h in hosts), planned

    # 2. the real run, with the playbook's default state (defined): SSH sessions counted per host
    run, sessions = counted(fleet, hosts, lambda: ans.playbook(EXAMPLES / "fleet_vdi.yml"))
    assert run.rc == 0, run.explain()
    placed = pool_members(run)
    assert placed == planned, run.explain()     # the real run did what check mode showed
    doms = fleet_domains(uri, fleet.prefix)
    assert sorted(doms) == sorted(n for v in placed.values() for n in v)
    for h in hosts:
        mine = {n: m for n, m in doms.items() if n in placed[h.name]}
        assert all(m["host"] == h.name for m in mine.values())
        recorded = sorted(g.get("uuid") or g.get("vf") for m in mine.values() for g in m["gpus"])
        assert vgpus_on(h) == recorded, f"{h.name}: vGPUs on the host do not match the domains"
        assert all(v == "defined" for v in placed[h.name].values())
    # a survey and one batched apply per host, however many desktops it got
    assert all(1 <= n <= 2 for n in sessions.values()), sessions
    after_apply = {h.name: host_snapshot(h) for h in hosts}

    # 3. the same playbook again: changed=0 everywhere, nothing moved
    run = ans.playbook(EXAMPLES / "fleet_vdi.yml")
    assert run.rc == 0, run.explain()
    for h in hosts:
        assert run.recap[h.name].changed == 0 and run.recap[h.name].failed == 0, run.explain()
        assert host_snapshot(h) == after_apply[h.name]
    assert fleet_domains(uri, fleet.prefix) == doms
    run = ans.playbook(EXAMPLES / "fleet_vdi.yml", "--check")
    assert run.rc == 0 and all(run.recap[h.name].changed == 0 for h in hosts), run.explain()

    # 4. twice the pool: the existing members stay where they are, the new ones are placed fleet-wide, and
    #    each host still costs the same sessions (O(1) per host, not one per VM)
    run, grown_sessions = counted(fleet, hosts, lambda: ans.playbook(EXAMPLES / "fleet_vdi.yml",
                                                                     extra={"vdi_count": 2 * VDI_COUNT}))
    assert run.rc == 0, run.explain()
    grown = pool_members(run)
    assert sum(len(v) for v in grown.values()) == 2 * VDI_COUNT, run.explain()
    for h in hosts:
        assert set(placed[h.name]) <= set(grown[h.name]), "an existing member moved"
    print(f"\nssh sessions per host: {VDI_COUNT} desktops {sessions}, {2 * VDI_COUNT} desktops {grown_sessions}")
    assert grown_sessions == sessions, (sessions, grown_sessions)

    # ... and back to the first count: the members above it are removed where they are
    run = ans.playbook(EXAMPLES / "fleet_vdi.yml")
    assert run.rc == 0 and pool_members(run) == placed, run.explain()

    # 5. teardown: every host as it started, one session per host
    run, sessions = counted(fleet, hosts, lambda: ans.playbook(EXAMPLES / "fleet_teardown.yml"))
    assert run.rc == 0, run.explain()
    for h in hosts:
        assert run.recap[h.name].changed == (1 if placed[h.name] else 0), run.explain()
        assert host_snapshot(h) == start[h.name], f"{h.name} is not as it started"
    assert all(n == 1 for n in sessions.values()), sessions
    assert fleet_domains(uri, fleet.prefix) == {}
    run = ans.playbook(EXAMPLES / "fleet_teardown.yml")
    assert run.rc == 0 and all(run.recap[h.name].changed == 0 for h in hosts), run.explain()


def test_journey_a_pool_with_a_host_down_and_back(fleet: Fleet) -> None:
    """The Ansible engineer's journey (issue 28): a pool across three hosts, one host goes down
    (scripts/testbed.sh host-down), the playbook again in check mode with a diff and for real: the host that
    does not answer is unknown, not empty, so none of its desktops is re-created on the others (before the fix:
    all of them were, and stayed duplicated); the host comes back (hosts-up), the playbook converges with no
    change, every desktop exists once, and every host holds exactly the vGPUs its desktops record."""
    up, down = fleet.hosts[:2], fleet.hosts[3]
    hosts = [*up, down]
    uri = fleet.env["libvirt_uri"]
    count = 9
    extra = {"vdi_count": count, "vdi_prefix": fleet.prefix + "jvdi"}
    start = {h.name: host_snapshot(h) for h in hosts}

    # 1. the pool across the three hosts
    run = fleet.ansible(hosts, "journey").playbook(EXAMPLES / "fleet_vdi.yml", extra=extra)
    assert run.rc == 0, run.explain()
    placed = pool_members(run)
    assert placed[down.name] and sum(len(v) for v in placed.values()) == count, run.explain()
    doms = fleet_domains(uri, fleet.prefix + "jvdi")
    after_apply = {h.name: host_snapshot(h) for h in hosts}

    # 2. one host goes down (its sshd stops; the next hosts-up brings it back)
    fleet.stop_host(4)
    try:
        # a fresh control_path_dir each time: a ControlPersist master would still reach the stopped host
        run = fleet.ansible(hosts, "journey-down-check").playbook(EXAMPLES / "fleet_vdi.yml", "--check", "--diff",
                                                                  extra=extra)
        assert run.recap[down.name].unreachable == 1, run.explain()
        for h in up:
            r = run.recap[h.name]
            assert r.failed == 0 and r.changed == 0, run.explain()   # nothing re-created elsewhere
        assert not re.search(r"^\+\s+\S+-jvdi-\d+: defined$", run.stdout, re.M), run.explain()
        held = sorted(placed[down.name])
        warned = " ".join((run.stdout + run.stderr).split())   # Ansible's warnings: stderr, folded
        assert f"{down.name} did not answer" in warned and all(n in warned for n in held), run.explain()
        run = fleet.ansible(hosts, "journey-down").playbook(EXAMPLES / "fleet_vdi.yml", extra=extra)
        assert run.recap[down.name].unreachable == 1, run.explain()
        assert all(run.recap[h.name].changed == 0 and run.recap[h.name].failed == 0 for h in up), run.explain()
        assert pool_members(run) == {h.name: placed[h.name] for h in up}, run.explain()
        assert fleet_domains(uri, fleet.prefix + "jvdi") == doms
        assert all(host_snapshot(h) == after_apply[h.name] for h in hosts)
    finally:
        # 3. the host comes back
        fleet.start_hosts(len(PROFILES) + 1)

    run = fleet.ansible(hosts, "journey-back").playbook(EXAMPLES / "fleet_vdi.yml", extra=extra)
    assert run.rc == 0, run.explain()
    assert all(run.recap[h.name].changed == 0 for h in hosts), run.explain()
    assert pool_members(run) == placed, run.explain()
    assert fleet_domains(uri, fleet.prefix + "jvdi") == doms
    for h in hosts:   # no orphan: each host holds exactly the vGPUs its desktops record
        recorded = sorted(g.get("uuid") or g.get("vf") for n, m in doms.items() if n in placed[h.name]
                          for g in m["gpus"])
        assert vgpus_on(h) == recorded, h.name

    run = fleet.ansible(hosts, "journey-teardown").playbook(EXAMPLES / "fleet_teardown.yml",
                                                            extra={"vdi_prefix": extra["vdi_prefix"]})
    assert run.rc == 0, run.explain()
    assert all(host_snapshot(h) == start[h.name] for h in hosts)
    assert fleet_domains(uri, fleet.prefix + "jvdi") == {}


LOOP_PLAYBOOK = """
- hosts: hypervisors
  gather_facts: false
  tasks:
    - vgpuvirt.kvm_gpu.vgpu_domain:
        name: "{{ vdi_prefix }}-loop-{{ item }}"
        state: defined
        gpus: [{min_framebuffer_mib: 2048, series: Q}]
        memory_mib: 512
        domain_options: "{{ vdi_domain_options }}"
        uri: "{{ vgpu_uri }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
        host_name: "{{ vgpu_host_name }}"
      loop: "{{ range(1, n + 1) | list }}"
    - vgpuvirt.kvm_gpu.vgpu_domain:
        name: "{{ vdi_prefix }}-loop-{{ item }}"
        state: absent
        uri: "{{ vgpu_uri }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
        host_name: "{{ vgpu_host_name }}"
      loop: "{{ range(1, n + 1) | list }}"
"""


def test_a_task_per_vm_costs_sessions_per_vm_the_pool_does_not(fleet: Fleet) -> None:
    """The figure behind the pool: one vgpu_domain task per VM opens a session per VM (and per removal);
    the pool's two tasks open one each per host, whatever the count (test_fleet_pool_... asserts that)."""
    h = fleet.hosts[0]
    ans = fleet.ansible([h], "loop")
    book = ans.workdir / "loop.yml"
    book.write_text(LOOP_PLAYBOOK)
    n = 4
    run, loop = counted(fleet, [h], lambda: ans.playbook(book, extra={"n": n}))
    assert run.rc == 0, run.explain()
    run, pool = counted(fleet, [h], lambda: ans.playbook(EXAMPLES / "fleet_vdi.yml", extra={"vdi_count": n}))
    assert run.rc == 0, run.explain()
    run, gone = counted(fleet, [h], lambda: ans.playbook(EXAMPLES / "fleet_teardown.yml"))
    assert run.rc == 0, run.explain()
    print(f"\nssh sessions on {h.name} for {n} VMs: a task per VM {loop[h.name]} (define + remove), "
          f"vgpu_pool {pool[h.name]} (survey + apply) + {gone[h.name]} (remove)")
    assert loop[h.name] >= 2 * n and pool[h.name] + gone[h.name] <= 3
    assert fleet_domains(fleet.env["libvirt_uri"], fleet.prefix) == {}
