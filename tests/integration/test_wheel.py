"""A wheel that works (issue 26): ``python -m build`` makes an sdist and a wheel of a copy of this tree; the
wheel, installed into a fresh venv outside the source tree, runs as a user would run it.

- the sdist and the wheel carry the templates, the agent (and the boot agent), every simulator profile and
  py.typed (the wheel is built from the sdist, so a file the sdist forgets is missing from both);
- from the venv, with the source tree neither on sys.path nor the working directory: ``vgpuvirt --version``
  prints the package's version, ``--help`` lists the verbs, ``--host sim:t4x2 inventory`` reads the installed
  profiles, ``xml build`` fills each installed template (and validates it with libvirt's schema), the
  completion script completes a verb in bash, and an inventory over the testbed's sshd sends the installed
  agent and matches the simulator's.

The build runs without network when setuptools and wheel are at hand (the dev extra has both); otherwise
``python -m build`` fetches them for its isolated environment. The venv gets the wheel itself with
``--no-deps``; its dependencies (lxml, paramiko, ...) come from the dev venv through a .pth line, so no index
is needed; the probe checks that vgpuvirt itself is imported from the fresh venv, never from there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt import __version__, sim
from vgpuvirt.services.inventory.read import inventory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns(".git", ".venv", ".ci", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis")
TEMPLATES = ("vdi", "gaming", "compute")


def shipped_files() -> set[str]:
    """What the package must carry besides its modules, named from the source tree (a new profile or
    template is expected in the wheel without editing this test)."""
    pkg = REPO / "vgpuvirt"
    data = {"vgpuvirt/py.typed", "vgpuvirt/host/agent.py", "vgpuvirt/host/layout_boot.py"}
    data |= {f"vgpuvirt/templates/{p.name}" for p in (pkg / "templates").glob("*.xml")}
    data |= {f"vgpuvirt/sim/profiles/{p.name}" for p in (pkg / "sim" / "profiles").glob("*.yaml")}
    assert {f"vgpuvirt/templates/{t}.xml" for t in TEMPLATES} <= data and len(data) > 10
    return data


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist + wheel of a copy of the tree (building in place would write build/ and egg-info into it,
    under the feet of parallel workers)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=IGNORE, symlinks=True)
    out = base / "dist"
    cmd = [sys.executable, "-m", "build", "--outdir", str(out)]
    if importlib.util.find_spec("wheel") is not None and importlib.util.find_spec("setuptools") is not None:
        cmd.append("--no-isolation")   # no network: the dev venv has what [build-system] requires
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, check=False, cwd=base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_sdist_and_wheel_carry_the_package_data(dist: Path) -> None:
    (whl,) = dist.glob("vgpuvirt-*.whl")
    (sdist,) = dist.glob("vgpuvirt-*.tar.gz")
    assert whl.name.startswith(f"vgpuvirt-{__version__}-py3-none-any")
    assert sdist.name == f"vgpuvirt-{__version__}.tar.gz"
    want = shipped_files()
    in_wheel = set(zipfile.ZipFile(whl).namelist())
    assert want - in_wheel == set()
    with tarfile.open(sdist) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert want - in_sdist == set()
    entry = zipfile.ZipFile(whl).read(f"vgpuvirt-{__version__}.dist-info/entry_points.txt").decode()
    assert "vgpuvirt = vgpuvirt.cli:main" in entry


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fresh venv with the wheel installed; the paths and environment to run it with."""
    base = tmp_path_factory.mktemp("venv")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False, symlinks=True)
    py = env_dir / "bin" / "python"
    (whl,) = dist.glob("vgpuvirt-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(whl)], check=True, capture_output=True, text=True)
    site = subprocess.run([str(py), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(site) / "zz_borrowed_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}   # no PYTHONPATH to the source
    env["PATH"] = f"{env_dir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    work = base / "work"        # the working directory: outside the source tree
    work.mkdir()
    return {"bin": env_dir / "bin", "py": py, "site": site, "env": env, "work": work}


def run(inst: dict[str, Any], *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(inst["bin"] / "vgpuvirt"), *argv], capture_output=True, text=True,
                          env=inst["env"], cwd=inst["work"], check=False, timeout=300)
    if check:
        assert proc.returncode == 0, f"vgpuvirt {' '.join(argv)}: {proc.stderr}"
    return proc


def test_imports_come_from_the_venv(installed: dict[str, Any]) -> None:
    probe = ("import importlib.metadata as m, importlib.resources as r, vgpuvirt, vgpuvirt.xml.templates as t; "
             "print(vgpuvirt.__file__); print(r.files('vgpuvirt.host').joinpath('agent.py')); "
             "print(t.template_path('vdi')); print(m.version('vgpuvirt'))")
    out = subprocess.run([str(installed["py"]), "-c", probe], capture_output=True, text=True, check=True,
                         env=installed["env"], cwd=installed["work"]).stdout.split()
    assert all(p.startswith(installed["site"] + "/vgpuvirt/") for p in out[:3]), out
    assert out[3] == __version__


def test_version_help_and_sim_inventory(installed: dict[str, Any]) -> None:
    assert run(installed, "--version").stdout == f"vgpuvirt {__version__}\n"
    helptext = run(installed, "--help").stdout
    assert "inventory" in helptext and "completion" in helptext
    inv = json.loads(run(installed, "--host", "sim:t4x2", "--json", "inventory").stdout)
    assert [p["address"] for p in inv["mdev_parents"]] == ["0000:3b:00.0", "0000:d8:00.0"]
    assert all(t["id"].startswith("nvidia-") for p in inv["mdev_parents"] for t in p["types"])
    profiles = run(installed, "sim", "list").stdout
    assert all(p in profiles for p in ("t4x2", "a100-sriov", "l40s-vgpu17"))


def test_each_template_builds_a_valid_domain(installed: dict[str, Any]) -> None:
    for t in TEMPLATES:
        # xml build validates with libvirt's RelaxNG schema unless --no-validate
        xml = run(installed, "xml", "build", "--template", t, "--name", f"wheel-{t}", "--memory-mib", "2048",
                  "--pci", "0000:41:00.0").stdout
        assert f"<name>wheel-{t}</name>" in xml and "bus=\"0x41\"" in xml.replace("'", '"')


def test_bash_completion_from_the_installed_command(installed: dict[str, Any]) -> None:
    script = installed["work"] / "vgpuvirt.bash"
    script.write_text(run(installed, "completion", "bash").stdout)
    probe = f"source {script}; COMP_WORDS=(vgpuvirt provi); COMP_CWORD=1; _vgpuvirt; echo ${{COMPREPLY[*]}}"
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "provision"


def test_the_installed_agent_runs_over_the_testbed_sshd(installed: dict[str, Any], testbed: Any,
                                                        tmp_path: Path) -> None:
    tree = tmp_path / "t4x2"
    run(installed, "sim", "materialize", "t4x2", str(tree))
    target = f"ssh://{testbed.ssh_user}@{testbed.ssh_host}:{testbed.ssh_port}"
    proc = run(installed, "--host", target, "--identity", testbed.identity, "--known-hosts", testbed.known_hosts,
               "--sysfs-root", str(tree), "--json", "inventory")
    via_ssh = json.loads(proc.stdout)
    via_sim = inventory(sim.SimHost.from_profile("t4x2"), nvidia_smi=False).to_dict()
    assert via_ssh.pop("host").startswith("ssh://")
    via_sim.pop("host")
    assert via_ssh == via_sim
