"""The templates ship inside the wheel: build it, install it into a fresh venv, build a domain from there.

Marked integration: it builds a wheel (pip may fetch setuptools/wheel for the isolated build) and takes seconds.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_wheel_carries_templates(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)]
    if importlib.util.find_spec("wheel") is not None:
        cmd.insert(4, "--no-build-isolation")  # no network needed when setuptools + wheel are at hand
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    (whl,) = wheels.glob("vgpuvirt-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # Install the wheel itself (a wheel is a zip laid out for site-packages), and borrow only lxml
    # from the dev venv, so no index is needed and nothing of the source tree is importable.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site,
                    str(whl)], check=True, capture_output=True, text=True)
    lxml_dir = Path(sysconfig.get_paths()["purelib"])
    (Path(site) / "borrowed.pth").write_text(f"{lxml_dir}\n")
    probe = textwrap.dedent("""
        import vgpuvirt, vgpuvirt.xml as x
        from vgpuvirt.xml.templates import template_path
        p = template_path("gaming")
        assert str(p).startswith(SITE), p
        d = x.build_domain("gaming", name="from-wheel", memory_mib=1024, vcpus=2)
        print(vgpuvirt.__file__, p, d.root.find("cpu").get("mode"))
    """).replace("SITE", repr(site))
    out = subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(site) and out.stdout.split()[-1] == "host-passthrough"
