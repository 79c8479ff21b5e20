"""``vgpuvirt top`` in a real terminal: tmux (its own server socket, a fixed 150x45 window) runs the view,
``capture-pane`` reads the screen, ``send-keys`` presses q or Ctrl-C. The view shows each host, its GPUs,
their vGPUs with the VMs that own them (provisioned on libvirt's test driver), refreshes, and quits cleanly:
the process exits 0 and the shell's screen comes back (the alternate screen is left)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_part  # type: ignore[import-not-found]

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

# Runs inside tmux: two simulated hosts with VMs provisioned on test:///default, then the live view.
DRIVER = """
import sys
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.observe.exporter import ParallelScraper
from vgpuvirt.cli.top_live import view
from vgpuvirt.provision import VgpuRequest, VmRequest, provision
from vgpuvirt.sim import SimHost
conn = LibvirtConnection("test:///default")
hosts = [SimHost.from_profile("t4x2", name="sim-top-a"), SimHost.from_profile("a10-sriov", name="sim-top-b")]
provision(hosts[0], conn, VmRequest.pool("desk", 2, gpu=VgpuRequest(type="nvidia-231")))
provision(hosts[1], conn, VmRequest.pool("cad", 1, gpu=VgpuRequest(min_framebuffer_mib=4096)))
scraper = ParallelScraper(hosts, timeout=5, domains={h.name: conn.domain_xml_pairs for h in hosts})
view(scraper, interval=float(sys.argv[1]))
print("TOP-EXITED-CLEANLY")
"""


class Tmux:
    def __init__(self, tmp: Path) -> None:
        self.socket = f"vgpuvirt-test-{uuid.uuid4().hex[:8]}"     # never the user's tmux server
        self.tmp = tmp

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=20).stdout

    def start(self, command: str) -> None:
        # the terminal says its size (a COLUMNS inherited from the test runner would override it)
        env = f"env -u COLUMNS -u LINES PYTHONPATH={REPO} TERM=xterm-256color"
        # the shell stays after the command so that its exit and the restored screen can be read
        self("new-session", "-d", "-x", "150", "-y", "45", "-s", "top", "sh")
        self("send-keys", "-t", "top", f"{env} {command}; echo rc=$?", "Enter")

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait_for(self, text: str, deadline_s: float = 60.0) -> str:
        end = time.monotonic() + deadline_s
        shown = ""
        while time.monotonic() < end:
            shown = self.screen()
            if text in shown:
                return shown
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared; the screen:\n{shown}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


@pytest.fixture
def tmux(tmp_path) -> Iterator[Tmux]:
    require_part("tmux", shutil.which("tmux") is not None, "apt-get install tmux (testbed.sh install)")
    t = Tmux(tmp_path)
    yield t
    t.kill()


def _stamp(screen: str) -> str:
    head = next(line for line in screen.splitlines() if "vgpuvirt top" in line)
    return head.split()[2]          # HH:MM:SS of the frame's collection


def test_top_shows_hosts_gpus_vgpus_and_vms_refreshes_and_q_quits(tmux, tmp_path):
    pytest.importorskip("libvirt")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    tmux.start(f"{sys.executable} {driver} 0.5")
    screen = tmux.wait_for("desk-002")
    for want in ("sim-top-a", "sim-top-b", "0000:3b:00.0", "0000:d8:00.0", "desk-001", "desk-002", "cad-001",
                 "GRID T4-2Q", "SM use", "%", "█", "q quits"):
        assert want in screen, f"{want!r} not on the screen:\n{screen}"
    # the vGPUs are drawn under their GPU, each with its VM
    lines = screen.splitlines()
    gpu_row = next(i for i, line in enumerate(lines) if "0000:3b:00.0" in line)
    assert any("desk-00" in line and "─" in line for line in lines[gpu_row + 1:gpu_row + 4])
    first = _stamp(screen)
    end = time.monotonic() + 30
    while _stamp(tmux.screen()) == first and time.monotonic() < end:
        time.sleep(0.2)
    assert _stamp(tmux.screen()) != first, "the view did not refresh"
    tmux("send-keys", "-t", "top", "q")
    after = tmux.wait_for("rc=0")
    assert "TOP-EXITED-CLEANLY" in after
    assert "desk-001" not in after                # the alternate screen is gone: the shell's own is back


def test_top_cli_ctrl_c_quits_cleanly_and_once_prints_one_frame(tmux):
    tmux.start(f"{sys.executable} -m vgpuvirt top sim:t4x2 sim:l40s-vgpu17 --interval 0.5")
    screen = tmux.wait_for("0000:3d:00.0")           # an L40S GPU row (not in the typed command)
    assert "sim:t4x2" in screen and "0000:3b:00.0" in screen and "NVIDIA L40S" in screen
    tmux("send-keys", "-t", "top", "C-c")
    after = tmux.wait_for("rc=0")
    assert "Traceback" not in after and "0000:3b:00.0" not in after
    # the terminal is back in cooked mode: a typed line echoes and runs
    tmux("send-keys", "-t", "top", "echo $((6*7))-ok", "Enter")
    tmux.wait_for("42-ok")
    once = subprocess.run([sys.executable, "-m", "vgpuvirt", "--host", "sim:t4x2", "top", "--once"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert once.returncode == 0, once.stderr
    assert "0000:3b:00.0" in once.stdout and "\x1b[?1049h" not in once.stdout   # no alternate screen
