"""``vgpuvirt capture`` over a real sshd, on every simulated profile mounted live with FUSE: one round trip records
the host, and the replay answers each reading verb as the host answers it over SSH."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]

from vgpuvirt import sim
from vgpuvirt.capture.record import CAPTURE_ARGVS, capture
from vgpuvirt.cli import main as cli_main
from vgpuvirt.host.base import Host
from vgpuvirt.host.replay import ReplayHost, save_capture
from vgpuvirt.layout import verbs as layout_verbs
from vgpuvirt.observe.collect import Collector
from vgpuvirt.services.inventory.read import inventory, type_capacity
from vgpuvirt.services.mig.state import read_mig_state
from vgpuvirt.services.scheduler.service import nvidia_gpus, read_schedulers
from vgpuvirt.testing.tool_stubs import write_program_stubs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _answers(host: Host, programs: dict[str, str] | None = None) -> dict[str, Any]:
    inv = inventory(host)
    m = Collector(programs=programs).collect(host)
    out = {"inventory": inv.to_dict(), "types": [r.to_dict() for r in type_capacity(inv)],
           "metrics": (m.up, m.sources, m.gpus, m.warnings, m.driver_version),
           "scheduler": [g.to_dict() for g in read_schedulers(host, nvidia_gpus(host))],
           "layout": layout_verbs.export(host).to_dict()}
    return json.loads(json.dumps(out, default=str))


@pytest.mark.parametrize("profile", sim.list_profiles())
def test_capture_over_ssh_replays_as_the_host_answers(testbed: Any, profile: str, tmp_path: Path) -> None:
    with sim_mount(testbed.mnt_dir, profile) as mnt:
        # the simulator's tools, frozen, as programs on the host (this machine has no nvidia-smi)
        stubs = write_program_stubs(sim.SimHost.from_profile(profile), str(tmp_path), CAPTURE_ARGVS)
        host = testbed.ssh(sysfs_root=mnt)
        try:
            before = host.round_trips
            data = capture(host, programs=stubs)
            assert host.round_trips - before == 1
            live = _answers(host, stubs)
        finally:
            host.close()
    path = str(tmp_path / f"{profile}.capture.json")
    save_capture(data, path)
    replay = ReplayHost(path)
    assert replay.name == host.name and replay.sysfs_root == mnt
    assert _answers(replay) == live
    # the programs' answers are the simulator's, recorded under the names vgpuvirt runs
    here = sim.SimHost.from_profile(profile)
    assert read_mig_state(replay).to_dict() == dict(read_mig_state(here).to_dict(), host=host.name)


def test_cli_capture_over_ssh_with_redact(testbed: Any, tmp_path: Path) -> None:
    out = tmp_path / "t4x2.json"
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt:
        host = f"ssh://{testbed.ssh_user}@{testbed.ssh_host}:{testbed.ssh_port}"
        argv = ["--host", host, "--sysfs-root", mnt, "--identity", testbed.identity, "--known-hosts",
                testbed.known_hosts]
        assert cli_main([*argv, "capture", "--redact", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["redacted"] and data["host"] == f"ssh://{testbed.ssh_user}@redacted-host:{testbed.ssh_port}"
    assert testbed.ssh_host not in out.read_text()
    assert cli_main(["--host", f"capture:{out}", "--json", "inventory"]) == 0
