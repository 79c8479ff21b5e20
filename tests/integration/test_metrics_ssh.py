"""A metrics collection over a real sshd in ONE exec: a materialized simulated host with vGPUs and stubs that
print the simulator's nvidia-smi / dmesg answers; the snapshot equals the in-process SimHost's."""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import pytest

from vgpuvirt import sim
from vgpuvirt.host.base import Op
from vgpuvirt.observe.collect import Collector
from vgpuvirt.sim.materialize import materialize_fs
from vgpuvirt.testing.tool_stubs import write_tool_stubs

pytestmark = pytest.mark.integration


def test_collection_over_ssh_is_one_exec_and_matches_the_simulator(testbed: Any) -> None:
    h = sim.SimHost.from_profile("t4x2")
    h.model.telemetry.clock = lambda: 1_700_200_000.0
    u = str(uuid.uuid4())
    assert h.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create", u)]).ok
    h.model.telemetry.inject_xid("0000:d8:00.0", 79)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="w14-metrics-", dir=base) as tree:
        materialize_fs(h.fs, tree)
        stubs = write_tool_stubs(h, tree)
        host = testbed.ssh(sysfs_root=tree)
        try:
            before = host.round_trips
            remote = Collector(programs=stubs).collect(host)
            assert host.round_trips - before == 1
        finally:
            host.close()
    local = Collector().collect(h)
    assert remote.up and remote.sources == local.sources
    assert remote.gpus == local.gpus
    (v,) = remote.gpus[0].vgpus
    assert v.id == u and v.sm_util_pct is not None
    assert not remote.gpus[1].health.healthy and remote.gpus[1].xids_since_boot == (79,)
