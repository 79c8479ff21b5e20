"""Every simulator profile inventoried three ways, with the same JSON: SimHost, a materialized tree read by
the CLI with ``--sysfs-root``, and the same tree over a real sshd (one exec per inventory)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from typing import Any

import pytest

from vgpuvirt import sim
from vgpuvirt.cli import main as cli_main
from vgpuvirt.services.inventory.read import inventory

pytestmark = pytest.mark.integration

def _cli_json(*argv: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli_main(list(argv))
    assert rc == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


# `large` (256 mdev parents) took 17 s in a loaded -n 2 run of the inner loop: `slow`, the others stay
@pytest.mark.parametrize("profile", [pytest.param(p, marks=pytest.mark.slow) if p == "large" else p
                                     for p in sim.list_profiles()])
def test_three_ways_same_json(testbed: Any, profile: str) -> None:
    via_sim = inventory(sim.SimHost.from_profile(profile), nvidia_smi=False).to_dict()
    # tmpfs when there is one: like sysfs an in-memory filesystem, and `large` (50k entries) is written in
    # ~2 s there instead of 5-25 s on the disk. The testbed's sshd sees it (same tmpfs in its namespace).
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix=f"inv-{profile}-", dir=base) as tree:
        sim.materialize(profile, tree)
        via_tree = _cli_json("--sysfs-root", tree, "inventory", "--json")
        host = testbed.ssh(sysfs_root=tree)
        try:
            before = host.round_trips
            via_ssh = inventory(host).to_dict()
            assert host.round_trips - before == 1
        finally:
            host.close()
    assert via_tree["host"] == "local" and via_ssh["host"].startswith("ssh://")
    for d in (via_sim, via_tree, via_ssh):
        d.pop("host")
    assert via_tree == via_sim
    assert via_ssh == via_sim


def test_nvidia_smi_rides_in_the_same_exec_over_ssh(testbed: Any) -> None:
    host = testbed.ssh()
    try:
        before = host.round_trips
        inv = inventory(host, nvidia_smi=True)
        assert host.round_trips - before == 1
    finally:
        host.close()
    # No GPU driver on the testbed machine: nvidia-smi is absent, which is normal and not a warning.
    assert inv.sources["nvidia_smi"] in ("not installed", "ok")
    if inv.sources["nvidia_smi"] == "not installed":
        assert not any("nvidia-smi" in w for w in inv.warnings)
