"""Cordon over real SSH on a FUSE-mounted simulated host: one controller cordons (the agent's locked, audited
batch writes the mark in the host's tree), another controller's CLI plan skips the host and says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]

from vgpuvirt.provision.plan import plan
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.services.cordon import CORDON_FILE, read_cordon, set_cordon
from vgpuvirt.services.inventory.read import inventory

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_a_cordon_set_over_ssh_is_seen_by_another_controller(testbed: Any) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as ctl1:
        before, after = set_cordon(ctl1, "firmware update", by="ctl1")
        assert before is None and after is not None
        records = [r for r in ctl1.read_audit().records if r.get("op") == "replace_file"]
        assert records and records[-1]["path"] == CORDON_FILE and "firmware update" in records[-1]["value"]
        cli = [sys.executable, "-m", "vgpuvirt", "--host", f"ssh://root@{testbed.ssh_host}:{testbed.ssh_port}",
               "--sysfs-root", mnt, "--identity", testbed.identity, "--known-hosts", testbed.known_hosts]
        refused = subprocess.run([*cli, "plan", "--connect", "test:///default", "--count", "1", "--gpu", "nvidia-231"],
                                 capture_output=True, text=True, check=False, cwd=REPO, timeout=120)
        assert refused.returncode != 0 and "is cordoned: firmware update" in refused.stderr, refused.stderr
        done = subprocess.run([*cli, "host", "uncordon"], capture_output=True, text=True, check=False, cwd=REPO,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert read_cordon(ctl1) is None
        p = plan([inventory(ctl1)], [VmRequest("vm1", gpus=(VgpuRequest(type="nvidia-231"),))])
        assert p.steps
