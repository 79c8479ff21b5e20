"""vgpu_pool's documented examples, each run as written through real ansible-playbook, its action plugin and the
module (issue 27 item 5: through the action plugin every ``gpus`` entry without ``series`` failed, the documented
``gpus: [{type: nvidia-231}]`` included, because the plugin handed the module its validated arguments, every unset
suboption filled with None).

Check mode on two local hosts (a T4 box and an L40S vGPU 17+ box, materialized simulator trees; libvirt's test
driver), so nothing needs root: the action plugin validates and places, the module validates again and plans.
Only the connection options come from module_defaults; an example that names a host's own resources (the golden
image and storage pool of a linked clone) must get as far as the plan, which names the missing pool. One
ansible-playbook run serves every example (check mode changes nothing: they cannot disturb one another).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ansible")
from test_ansible_modules import REPO, load  # type: ignore[import-not-found]

# one xdist worker for the module: its fixture runs ansible-playbook once for every example (~8 s); split
# across workers, each paid it again
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ansible-pool-examples")]

EXAMPLES = [t for t in yaml.safe_load(load("vgpu_pool").EXAMPLES) if "vgpuvirt.kvm_gpu.vgpu_pool" in t]
# what a documented example may fail on here: resources of a real hypervisor this test's hosts do not have
NEEDS_HOST_RESOURCES = {"clone": r"'default'.*storage pool|storage pool.*'?default",
                        "networks": r"PreflightFailed .*libvirt network 'vdi-net' does not exist",
                        # read on each host (never on the controller, where placement runs)
                        "license": r"InvalidSpec invalid license token file '/etc/vgpuvirt/"}


def ansible_playbook() -> str:
    exe = Path(sys.executable).parent / "ansible-playbook"
    return str(exe)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """One ansible-playbook run for all the examples (check mode changes nothing, so they cannot disturb one
    another): each example's registered result per host, in EXAMPLES order."""
    from vgpuvirt.sim.materialize import materialize

    tmp = tmp_path_factory.mktemp("pool-examples")
    hosts = {}
    for name, profile in (("hv-t4", "t4x2"), ("hv-l40s", "l40s-vgpu17")):
        hosts[name] = tmp / name
        materialize(profile, str(hosts[name]))
    py = tmp / "py"
    py.mkdir()
    (py / "vgpuvirt").symlink_to(REPO / "vgpuvirt", target_is_directory=True)   # vgpuvirt, not the collection
    inv = {"all": {"hosts": {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                 "vgpu_sysfs_root": str(root)} for h, root in hosts.items()}}}
    (tmp / "inventory.json").write_text(json.dumps(inv))
    tasks: list[dict[str, Any]] = [
        {"vgpuvirt.kvm_gpu.vgpu_info": {"survey": True, "host_name": "{{ inventory_hostname }}"}}]
    tasks += [{**t, "check_mode": True, "ignore_errors": True, "register": f"example{i}"}
              for i, t in enumerate(EXAMPLES)]
    # the last task's result is what the tree callback keeps: every example's, gathered
    tasks.append({"ansible.builtin.set_fact": {"examples": "{{ [" + ", ".join(
        f"example{i}" for i in range(len(EXAMPLES))) + "] }}"}})
    play = [{"hosts": "all", "gather_facts": False,
             "module_defaults": {"group/vgpuvirt.kvm_gpu.all": {"sysfs_root": "{{ vgpu_sysfs_root }}",
                                                                "uri": "test:///default"}},
             "tasks": tasks}]
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, PYTHONPATH=str(py), ANSIBLE_COLLECTIONS_PATH=str(REPO), ANSIBLE_HOME=str(tmp / "home"),
               ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree", ANSIBLE_CALLBACK_TREE_DIR=str(tmp / "tree"))
    proc = subprocess.run([ansible_playbook(), "-i", str(tmp / "inventory.json"), str(tmp / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp, check=False)
    out = {}
    for h in hosts:
        tree = tmp / "tree" / h
        assert tree.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
        out[h] = json.loads(tree.read_text())["ansible_facts"]["examples"]
        assert len(out[h]) == len(EXAMPLES), proc.stdout[-3000:]
    return out


@pytest.mark.parametrize("index", range(len(EXAMPLES)), ids=[t["name"][:40] for t in EXAMPLES])
def test_documented_example_runs_through_the_action_plugin(results: dict[str, list[dict[str, Any]]],
                                                          index: int) -> None:
    task = EXAMPLES[index]
    args = task["vgpuvirt.kvm_gpu.vgpu_pool"]
    allowed = next((v for k, v in NEEDS_HOST_RESOURCES.items() if k in args), None)
    mine = {h: r[index] for h, r in results.items()}
    for host, res in mine.items():
        failed = res.get("failed")
        if allowed and failed:
            assert re.search(allowed, f"{res.get('error')} {res['msg']}"), (host, res)
            continue
        assert not failed, (host, res.get("msg"), res.get("error"))
        assert "must be one of" not in json.dumps(res)
        if args.get("state", "defined") != "absent":
            assert res["fleet"]["count"] == args["count"], res
    if args.get("state", "defined") != "absent" and not allowed:
        placed = [n for res in mine.values() for n in res["members"]]
        assert sorted(placed) == [f"{args['name']}-{i:02d}" for i in range(1, args["count"] + 1)]


def test_every_documented_example_is_covered() -> None:
    assert len(EXAMPLES) >= 4
    assert any("series" not in g for t in EXAMPLES for g in t["vgpuvirt.kvm_gpu.vgpu_pool"].get("gpus", []))


def test_a_limited_play_holds_back_what_it_cannot_see(tmp_path: Path) -> None:
    """Hosts a --limit leaves out are not in the play at all: their members must not be taken for missing."""
    from vgpuvirt.sim.materialize import materialize

    root = tmp_path / "hv-t4"
    materialize("t4x2", str(root))
    py = tmp_path / "py"
    py.mkdir()
    (py / "vgpuvirt").symlink_to(REPO / "vgpuvirt", target_is_directory=True)
    inv = {"all": {"hosts": {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                 "vgpu_sysfs_root": str(root)} for h in ("hv-t4", "hv-other")}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inv))
    play = [{"hosts": "all", "gather_facts": False,
             "module_defaults": {"group/vgpuvirt.kvm_gpu.all": {"sysfs_root": "{{ vgpu_sysfs_root }}",
                                                                "uri": "test:///default"}},
             "tasks": [{"vgpuvirt.kvm_gpu.vgpu_info": {"survey": True, "host_name": "{{ inventory_hostname }}"}},
                       {"vgpuvirt.kvm_gpu.vgpu_pool": {"name": "vdi", "count": 2, "gpus": [{"type": "nvidia-231"}]},
                        "check_mode": True}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, PYTHONPATH=str(py), ANSIBLE_COLLECTIONS_PATH=str(REPO),
               ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree", ANSIBLE_CALLBACK_TREE_DIR=str(tmp_path / "tree"))
    proc = subprocess.run([ansible_playbook(), "-i", str(tmp_path / "inventory.json"), "--limit", "hv-t4",
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "tree" / "hv-t4").read_text())
    assert res["changed"] is False and res["members"] == {}, res
    assert res["fleet"]["held"] == ["vdi-01", "vdi-02"] and "--limit hv-t4" in res["fleet"]["unreachable"][0]
    said = " ".join(proc.stderr.split()) + " ".join(proc.stdout.split())
    assert "the hosts outside --limit hv-t4: what they hold is unknown" in said and "did not answer" not in said
