"""Each example in examples/ runs end to end on its simulated default (SimHost + test:///default)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libvirt")
ROOT = Path(__file__).resolve().parents[2]


def _run(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_vdi_pool_packs_40_desktops_onto_three_hosts_and_tears_down():
    out = _run("vdi_pool")
    assert "40 desktops with nvidia-231 (GRID T4-2Q)" in out
    assert out.count(": 8 desktops") == 5        # binpack: five full T4s, one left empty
    assert "torn down: 40 domains, 40 vGPUs" in out


def test_vdi_pool_spread():
    out = _run("vdi_pool", "--count", "6", "--policy", "spread")
    assert out.count(": 1 desktops") == 6


def test_cloud_gaming_passes_the_whole_gpu_with_its_audio_function():
    out = _run("cloud_gaming", "--explain", "--cpus", "2-9")
    assert "passed through with functions 0000:01:00.0, 0000:01:00.1" in out
    assert "boot VGA" in out                      # the iGPU was skipped, and --explain says why
    assert "torn down" in out


def test_compute_mig_places_mig_backed_c_types():
    out = _run("compute_mig")
    assert "GRID A100D-1-10C" in out and "GRID A100D-2-20C" in out and "torn down" in out


def test_demo_script_runs_the_main_job(tmp_path):
    import os
    env = {**os.environ, "VGPUVIRT_DEMO_SKIP_INSTALL": "1", "VGPUVIRT_VENV": sys.prefix}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--count", "3"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "+ create vGPU nvidia-231" in proc.stdout          # the dry-run plan
    assert "provisioned VMs" in proc.stdout and proc.stdout.count("created") >= 3
