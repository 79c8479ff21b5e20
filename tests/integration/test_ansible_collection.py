"""The Ansible collection vgpuvirt.kvm_gpu as its users get it and as Ansible's own checks judge it.

``ansible-galaxy collection build`` + ``install`` into a temporary path (the same installed copy every playbook
test runs from: test_ansible_fleet.installed_collections), and ``ansible-test sanity`` with the collection at
``ansible_collections/vgpuvirt/kvm_gpu``, the way real collections run it in CI, on this venv's Python. The
sanity tests that need a container (docker) are not among the ones ansible-test runs without one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_ansible_fleet import COLLECTION_SRC, REPO, ansible_bin, installed_collections  # type: ignore[import-not-found]

pytestmark = [pytest.mark.integration]

MODULES = ("vgpu_domain", "vgpu_host", "vgpu_info", "vgpu_layout", "vgpu_mdev", "vgpu_passthrough", "vgpu_pool")


def test_the_collection_builds_and_installs_with_every_part_it_needs() -> None:
    root = installed_collections() / "ansible_collections" / "vgpuvirt" / "kvm_gpu"
    galaxy = yaml.safe_load((COLLECTION_SRC / "galaxy.yml").read_text())
    manifest = json.loads((root / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("vgpuvirt", "kvm_gpu", galaxy["version"])
    files = {f["name"] for f in json.loads((root / "FILES.json").read_text())["files"]}
    for m in MODULES:
        assert f"plugins/modules/{m}.py" in files
    assert {"plugins/action/vgpu_pool.py", "plugins/module_utils/common.py", "plugins/module_utils/pool.py",
            "plugins/doc_fragments/gpu_request.py", "meta/runtime.yml", "README.md",
            "changelogs/config.yaml"} <= files
    assert "ruff.toml" not in files and not any(f.startswith("tests/output") for f in files)
    # the old copy-the-files layout is gone: the collection is the one place the modules live
    assert not (REPO / "examples" / "ansible" / "library").exists()
    assert not (REPO / "examples" / "ansible" / "action_plugins").exists()


def test_changelog_fragments_follow_the_convention() -> None:
    sections = {s[0] for s in yaml.safe_load((COLLECTION_SRC / "changelogs" / "config.yaml").read_text())["sections"]}
    frags = sorted((COLLECTION_SRC / "changelogs" / "fragments").glob("*"))
    assert frags
    for f in frags:
        assert re.fullmatch(r"\d+-[a-z0-9_.-]+\.yml", f.name), f"{f.name}: ISSUE-short-slug.yml"
        data = yaml.safe_load(f.read_text())
        assert data and set(data) <= sections, f"{f.name}: sections {sorted(set(data) - sections)}"
        assert all(isinstance(x, str) and x for v in data.values() for x in v), f.name


@pytest.mark.slow
def test_ansible_test_sanity_passes(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    exe = ansible_bin("ansible-test")
    assert exe is not None, "ansible-test comes with ansible-core (the dev extra)"
    work = tmp_path / "ansible_collections" / "vgpuvirt" / "kvm_gpu"
    shutil.copytree(COLLECTION_SRC, work, ignore=shutil.ignore_patterns("tests/output", "__pycache__"))
    # ansible-test keeps a virtual environment per sanity test under ~/.ansible/test: a HOME kept between runs
    # (pytest's cache) makes reruns take seconds instead of minutes
    try:
        home = Path(request.config.cache.mkdir("ansible-test-home"))
    except AttributeError:  # -p no:cacheprovider
        home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(home))
    argv = [exe, "sanity", "--python", f"{sys.version_info.major}.{sys.version_info.minor}", "--color", "no"]
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)
    missing = re.search(r"can be manually downloaded and saved to: (\S+)", proc.stdout + proc.stderr)
    if missing:
        # ansible-test bootstraps pip in its virtual environments with a script from ci-files.testing.ansible.com;
        # where only the package index is reachable, give it one that installs the same pip from the index
        Path(missing[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(missing[1]).write_text(GET_PIP.replace("OUTER = None", f"OUTER = {sys.executable!r}", 1))
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for test in ("validate-modules", "pylint", "import", "ansible-doc", "yamllint", "pep8", "changelog"):
        assert f'Running sanity test "{test}"' in out, f"{test} did not run:\n{out[-3000:]}"


GET_PIP = '''"""pip for ansible-test's sanity virtual environments: the version asked, installed into this one by the
test's own pip (``pip --python``): one pip run per virtual environment, where ensurepip and then the version asked
were two; ensurepip then pip where that cannot run."""
import subprocess
import sys

OUTER = None   # the test's interpreter (its venv has pip), written in when the script is saved

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
if subprocess.call([OUTER, "-m", "pip", "--python", sys.executable, "install", *args]) != 0:
    # ensurepip in a child: in this process it would set PIP_CONFIG_FILE=/dev/null for the install below too
    subprocess.check_call([sys.executable, "-m", "ensurepip"])
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
'''
