"""The vgpu_layout module with real ansible-playbook: its example playbook on one FUSE-simulated host
(check mode with a diff, apply, rerun unchanged, assert), and fleet_layout.yml laying out three hosts over
the testbed's real sshd (T4, A10, L40S: each takes the entries of lab.yaml that select its GPUs), check
mode first (changes nothing), then for real, then converged (changed=0), then the night config."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_ansible_examples import local_ansible  # type: ignore[import-not-found]
from test_ansible_fleet import (  # type: ignore[import-not-found]
    EXAMPLES,
    Ansible,
    FleetHost,
    host_snapshot,
    mount_sim,
    repo_python,
    require_fleet_parts,
    unmount_sim,
)

from vgpuvirt.host.local import LocalHost
from vgpuvirt.layout import parse_layout, verbs

# xdist_group: the extra test hosts are shared, and the fleet test stops and restarts them; under
# `pytest -n ... --dist loadgroup` every module of the group runs on one worker, one after the other.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("extra-hosts")]
LAB = parse_layout((EXAMPLES.parent / "layouts" / "lab.yaml").read_text(), "lab.yaml")


def test_vgpu_layout_example_playbook(tmp_path: Path) -> None:
    require_fleet_parts()
    mp, pid = mount_sim("a10-sriov", tmp_path, uuid.uuid4().hex[:6])
    try:
        h = FleetHost(f"layout{uuid.uuid4().hex[:6]}", "localhost", 0, "a10-sriov", mp, pid)
        run = local_ansible(tmp_path, h, {}).playbook(EXAMPLES / "vgpu_layout.yml", "--diff")
        assert run.rc == 0, run.explain()
        assert run.recap[h.name].failed == 0 and run.recap[h.name].changed == 2, run.explain()   # check + apply
        assert "A10-4Q" in run.stdout              # the diff shows the layout the host gets
        assert verbs.check(LocalHost(mp, name=h.name), LAB.config("day")) == []
    finally:
        unmount_sim(mp, pid)


def _inventory(path: Path, hosts: list[FleetHost], env: dict[str, Any]) -> None:
    # the targets' python imports this checkout's vgpuvirt (the venv may hold another tree's)
    interp = repo_python(path.parent)
    inv = {"hypervisors": {
        "hosts": {h.name: {"ansible_host": h.ssh_host, "ansible_port": h.ssh_port, "vgpu_sysfs_root": h.sysfs_root,
                           "vgpu_host_name": h.name} for h in hosts},
        "vars": {"ansible_user": "root", "ansible_connection": "ssh",
                 "ansible_ssh_private_key_file": env["identity"],
                 "ansible_ssh_common_args": f"-o UserKnownHostsFile={env['known_hosts']} -o StrictHostKeyChecking=yes "
                                            "-o BatchMode=yes -o GlobalKnownHostsFile=/dev/null",
                 "ansible_python_interpreter": str(interp)}}}
    path.write_text(json.dumps({"all": {"children": inv}}))


def test_fleet_layout_playbook(testbed: Any, tmp_path: Path) -> None:
    require_fleet_parts()
    ends = testbed.extra_hosts(3)
    tag = uuid.uuid4().hex[:6]
    mounts: list[tuple[str, str]] = []
    hosts: list[FleetHost] = []
    try:
        for i, (profile, e) in enumerate(zip(("t4x2", "a10-sriov", "l40s-vgpu17"), ends, strict=True), start=1):
            mp, pid = mount_sim(profile, Path(e.mnt_dir), tag)
            mounts.append((mp, pid))
            hosts.append(FleetHost(f"lay{tag}-h{i}", e.ssh_host, e.ssh_port, profile, mp, pid))
        (tmp_path / "a").mkdir()
        # over a FUSE tree nvidia-smi is not read (it would describe this machine), so no sizing switch
        fleet_yaml = tmp_path / "a" / "fleet.yaml"
        fleet_yaml.write_text((EXAMPLES.parent / "layouts" / "lab.yaml").read_text().replace(
            "      sizing: mixed ", "      # sizing: mixed ").replace("{L40S-8Q: 2, L40S-16Q: 1}", "{L40S-8Q: 3}"))
        _inventory(tmp_path / "a" / "inventory.json", hosts, testbed.env)
        ans = Ansible(tmp_path / "a", tmp_path / "a" / "inventory.json")
        before = [host_snapshot(h) for h in hosts]
        lay = {"layout_file": str(fleet_yaml)}
        dry = ans.playbook(EXAMPLES / "fleet_layout.yml", "--check", "--diff", extra=lay)
        assert dry.rc == 0, dry.explain()
        assert [host_snapshot(h) for h in hosts] == before, "check mode changed a host"
        assert all(dry.recap[h.name].changed == 1 for h in hosts), dry.explain()
        assert "+++ after" in dry.stdout or "after" in dry.stdout
        real = ans.playbook(EXAMPLES / "fleet_layout.yml", extra=lay)
        assert real.rc == 0 and all(real.recap[h.name].changed == 1 for h in hosts), real.explain()
        again = ans.playbook(EXAMPLES / "fleet_layout.yml", extra=lay)
        assert again.rc == 0 and all(again.recap[h.name].changed == 0 for h in hosts), again.explain()
        night = ans.playbook(EXAMPLES / "fleet_layout.yml", extra={**lay, "layout_config": "night"})
        assert night.rc == 0, night.explain()
        for h in hosts:
            assert verbs.check(LocalHost(h.sysfs_root, name=h.name), LAB.config("night")) == [], h.profile
    finally:
        for mp, pid in mounts:
            unmount_sim(mp, pid)
