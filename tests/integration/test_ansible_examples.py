"""Each module's example playbook (examples/ansible/vgpu_*.yml), run by real ansible-playbook against
this machine (connection local, the repo's venv as interpreter) with a live FUSE-simulated GPU host
as its sysfs. The playbooks assert their own results (check mode changes nothing, a rerun reports no
change); the test also checks that each leaves the simulated host as it found it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_ansible_fleet import (  # type: ignore[import-not-found]
    EXAMPLES,
    SBX,
    TESTBED,
    Ansible,
    FleetHost,
    fleet_domains,
    host_snapshot,
    mount_sim,
    require_fleet_parts,
    unmount_sim,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def local_sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FleetHost]:
    require_fleet_parts()
    profile = request.param
    mp, pid_file = mount_sim(profile, tmp_path, uuid.uuid4().hex[:6])
    try:
        yield FleetHost(f"example{uuid.uuid4().hex[:6]}", "localhost", 0, profile, mp, pid_file)
    finally:
        unmount_sim(mp, pid_file)


def local_ansible(tmp_path: Path, host: FleetHost, extra_vars: dict[str, Any]) -> Ansible:
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"all": {"children": {"hypervisors": {"hosts": {host.name: {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vgpu_sysfs_root": host.sysfs_root,
        **extra_vars,
    }}}}}}))
    return Ansible(tmp_path / "ansible", inv)


@pytest.mark.parametrize("playbook,local_sim,extra", [
    ("vgpu_info.yml", "t4x2", {}),
    ("vgpu_mdev.yml", "t4x2", {}),
    ("vgpu_mdev.yml", "a100-sriov", {}),
    ("vgpu_passthrough.yml", "desktop", {"gpu_functions": ["0000:01:00.0", "0000:01:00.1"]}),
], indirect=["local_sim"])
def test_module_example_playbook(tmp_path: Path, local_sim: FleetHost, playbook: str, extra: dict[str, Any]) -> None:
    before = host_snapshot(local_sim)
    run = local_ansible(tmp_path, local_sim, extra).playbook(EXAMPLES / playbook)
    assert run.rc == 0, run.explain()
    r = run.recap[local_sim.name]
    assert r.failed == 0 and r.ok > 0, run.explain()
    assert host_snapshot(local_sim) == before, "the example left something behind"


@pytest.mark.parametrize("local_sim", ["t4x2", "l40s-vgpu17"], indirect=True)
def test_domain_example_playbook(tmp_path: Path, local_sim: FleetHost) -> None:
    proc = subprocess.run(["bash", str(TESTBED), "start"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    uri = json.loads((SBX / "testbed.json").read_text())["libvirt_uri"]
    before = host_snapshot(local_sim)
    run = local_ansible(tmp_path, local_sim, {"vgpu_uri": uri}).playbook(EXAMPLES / "vgpu_domain.yml")
    assert run.rc == 0, run.explain()
    assert run.recap[local_sim.name].failed == 0, run.explain()
    assert host_snapshot(local_sim) == before
    assert fleet_domains(uri, local_sim.name) == {}
