"""Each module's example playbook (examples/ansible/vgpu_*.yml), run by real ansible-playbook against
this machine (connection local, the repo's venv as interpreter) with a live FUSE-simulated GPU host
as its sysfs. The playbooks assert their own results (check mode changes nothing, a rerun reports no
change); the test also checks that each leaves the simulated host as it found it.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_ansible_fleet import (  # type: ignore[import-not-found]
    EXAMPLES,
    Ansible,
    FleetHost,
    fleet_domains,
    host_snapshot,
    mount_sim,
    require_fleet_parts,
    unmount_sim,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]   # a real ansible-playbook run per case


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
    ("vgpu_mdev.yml", "a100-sriov", {"vgpu_need": {"min_framebuffer_mib": 4096, "series": "C"}}),
    ("vgpu_passthrough.yml", "desktop", {"gpu_functions": ["0000:01:00.0", "0000:01:00.1"]}),
], indirect=["local_sim"])
def test_module_example_playbook(tmp_path: Path, local_sim: FleetHost, playbook: str, extra: dict[str, Any]) -> None:
    before = host_snapshot(local_sim)
    run = local_ansible(tmp_path, local_sim, extra).playbook(EXAMPLES / playbook)
    assert run.rc == 0, run.explain()
    r = run.recap[local_sim.name]
    assert r.failed == 0 and r.ok > 0, run.explain()
    assert host_snapshot(local_sim) == before, "the example left something behind"


@pytest.mark.parametrize("local_sim", ["l40s-vgpu17"], indirect=True)
def test_info_example_shows_a_vgpu17_host(tmp_path: Path, local_sim: FleetHost) -> None:
    """Issue 28 item 11: on a vGPU 17+ host (no mdev) the example printed nothing about its vGPUs."""
    run = local_ansible(tmp_path, local_sim, {}).playbook(EXAMPLES / "vgpu_info.yml")
    assert run.rc == 0, run.explain()
    text = " ".join(run.stdout.split())    # the callback folds long messages over lines
    assert re.search(r"\(VF of 0000:[0-9a-f:.]+\): NVIDIA L40S-\d+[BQ]", text), run.explain()
    m = re.search(r"0 mdev types with free instances, (\d+) vGPU 17\+ VFs free, 0 in use", text)
    assert m and int(m[1]) > 0, run.explain()


@pytest.mark.parametrize("local_sim", ["t4x2", "l40s-vgpu17"], indirect=True)
def test_domain_example_playbook(testbed: Any, tmp_path: Path, local_sim: FleetHost) -> None:
    uri = testbed.libvirt_uri    # the real libvirtd: test:///default forgets between tasks
    before = host_snapshot(local_sim)
    # the template's network "default" does not exist on the testbed's libvirtd (the pre-flight says so)
    nic = {"virtio_nics": [{"kind": "user"}]}
    run = local_ansible(tmp_path, local_sim, {"vgpu_uri": uri, "desk_domain_options": nic}).playbook(
        EXAMPLES / "vgpu_domain.yml")
    assert run.rc == 0, run.explain()
    assert run.recap[local_sim.name].failed == 0, run.explain()
    assert host_snapshot(local_sim) == before
    assert fleet_domains(uri, local_sim.name) == {}


PERSIST_PLAY = """
- hosts: hypervisors
  gather_facts: false
  tasks:
    - name: A persistent vGPU (sysfs + mdevctl define --auto)
      vgpuvirt.kvm_gpu.vgpu_mdev:
        name: persistent-desk
        type: GRID T4-2Q
        persistent: true
        mdevctl_command: "{{ mdevctl }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
      register: made
    - name: Again
      vgpuvirt.kvm_gpu.vgpu_mdev:
        name: persistent-desk
        type: GRID T4-2Q
        persistent: true
        mdevctl_command: "{{ mdevctl }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
      register: again
    - name: What mdevctl has defined
      ansible.builtin.command:
        argv: "{{ mdevctl + ['list', '--defined', '--dumpjson'] }}"
      register: defined
      changed_when: false
    - name: Remove (and undefine)
      vgpuvirt.kvm_gpu.vgpu_mdev:
        name: persistent-desk
        state: absent
        mdevctl_command: "{{ mdevctl }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
      register: gone
    - name: Verify
      ansible.builtin.assert:
        that:
          - made is changed
          - again is not changed
          - made.vgpu.uuid in defined.stdout
          - "'auto' in defined.stdout"
          - gone is changed
"""


@pytest.mark.parametrize("local_sim", ["t4x2"], indirect=True)
def test_persistent_vgpu_with_real_mdevctl(tmp_path: Path, local_sim: FleetHost) -> None:
    import shutil

    require_fleet_parts()
    from test_ansible_fleet import require_part  # type: ignore[import-not-found]

    require_part("mdevctl", shutil.which("mdevctl") is not None and shutil.which("unshare") is not None,
                 "apt-get install mdevctl util-linux")
    etc = tmp_path / "mdevctl.d"
    for d in ("scripts.d/callouts", "scripts.d/notifiers"):
        (etc / d).mkdir(parents=True)
    # mdevctl has no fake-root option: a private mount namespace shows it the simulator as /sys
    # and an empty config dir as /etc/mdevctl.d (TESTBED.md).
    mdevctl = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               'mount --bind "$0/sys" /sys && mount --bind "$1" /etc/mdevctl.d && shift && exec mdevctl "$@"',
               local_sim.sysfs_root, str(etc)]
    play = tmp_path / "persist.yml"
    play.write_text(PERSIST_PLAY)
    ans = local_ansible(tmp_path, local_sim, {"mdevctl": mdevctl})
    before = host_snapshot(local_sim)
    run = ans.playbook(play)
    assert run.rc == 0, run.explain()
    assert host_snapshot(local_sim) == before
    assert not any(p.is_file() for p in etc.rglob("*") if "scripts.d" not in p.parts), "a definition was left"
