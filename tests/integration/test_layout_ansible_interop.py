"""vgpu_layout takes NVIDIA's files as they are: the vGPU Device Manager's T4 example config (its README's)
through the example playbook with real ansible-playbook on a FUSE-simulated two-T4 host: check mode with a
diff changes nothing, the apply makes the vGPUs, the rerun is unchanged, the host asserts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from test_ansible_examples import local_ansible  # type: ignore[import-not-found]
from test_ansible_fleet import (  # type: ignore[import-not-found]
    EXAMPLES,
    FleetHost,
    mount_sim,
    require_fleet_parts,
    unmount_sim,
)

from vgpuvirt.host.local import LocalHost
from vgpuvirt.layout import verbs
from vgpuvirt.layout.interop import import_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
T4 = EXAMPLES.parent / "layouts" / "nvidia" / "vgpu-dm-t4.yaml"


def test_vgpu_layout_playbook_with_a_vgpu_device_manager_file(tmp_path: Path) -> None:
    require_fleet_parts()
    mp, pid = mount_sim("t4x2", tmp_path, uuid.uuid4().hex[:6])
    try:
        h = FleetHost(f"vgpudm{uuid.uuid4().hex[:6]}", "localhost", 0, "t4x2", mp, pid)
        cfg = import_config(T4.read_text(), str(T4)).config("T4-small")
        assert verbs.check(LocalHost(mp, name=h.name), cfg) != []
        run = local_ansible(tmp_path, h, {}).playbook(EXAMPLES / "vgpu_layout.yml", "--diff", extra={
            "layout_text": T4.read_text(), "layout_config": "T4-small"})
        assert run.rc == 0, run.explain()
        assert run.recap[h.name].failed == 0 and run.recap[h.name].changed == 2, run.explain()   # check + apply
        assert "T4-1Q" in run.stdout                 # the diff names the types the host gets
        assert verbs.check(LocalHost(mp, name=h.name), cfg) == []
    finally:
        unmount_sim(mp, pid)
