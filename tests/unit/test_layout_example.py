"""examples/reshape_day_night.py runs end to end (3 simulated A100 hosts, a libvirt test driver each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import require_part  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]


def test_reshape_day_night_drains_and_brings_the_desktops_back() -> None:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require_part("libvirt-python", False, "pip install 'vgpuvirt[libvirt]' (needs libvirt-dev)")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "reshape_day_night.py")], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "12 desktops running" in out and "12 desktops running again" in out
    assert out.count("drained desk-") == 12 and out.count("no longer fits (no free vGPU of type nvidia-693") == 12
    assert out.count("started train-") == 6
    assert out.count("is not passed through any more") == 3 and out.count("nvidia-703, nor one as large") == 3
    assert "round trips {'read': 1, 'prepare': 1, 're-read': 1, 'devices': 1}" in out
