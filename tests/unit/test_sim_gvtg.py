"""Intel GVT-g: shared resource pool and multi-line descriptions (shared/hostdata/gvtg_sysfs.txt)."""

from __future__ import annotations

import errno

from vgpuvirt.host.base import Op
from vgpuvirt.sim import SimHost

T = "/sys/class/mdev_bus/0000:00:02.0/mdev_supported_types"


def avail(host: SimHost) -> dict[str, int]:
    snap = host.read([f"{T}/*/available_instances"])
    return {p.split("/")[-2]: int(snap.text(p) or "-1") for p in snap}


def test_initial_counts_match_the_real_mdevctl_output() -> None:
    host = SimHost.from_profile("gvtg")
    assert avail(host) == {"i915-GVTg_V5_1": 1, "i915-GVTg_V5_2": 2, "i915-GVTg_V5_4": 5, "i915-GVTg_V5_8": 7}
    snap = host.read([f"{T}/i915-GVTg_V5_4/description", f"{T}/i915-GVTg_V5_4/name"])
    assert snap.raw(f"{T}/i915-GVTg_V5_4/description") == (
        "low_gm_size: 128MB\nhigh_gm_size: 512MB\nfence: 4\nresolution: 1920x1200\nweight: 4\n")
    assert snap.text(f"{T}/i915-GVTg_V5_4/name") == "GVTg_V5_4"


def test_pool_is_shared_and_recomputed_for_every_type() -> None:
    host = SimHost.from_profile("gvtg")
    uuid = "fa9d3c62-1f4b-4c4a-a0a1-4dbf3d4f2b11"
    assert host.apply([Op.write(f"{T}/i915-GVTg_V5_4/create", uuid)]).ok
    assert avail(host) == {"i915-GVTg_V5_1": 1, "i915-GVTg_V5_2": 2, "i915-GVTg_V5_4": 4, "i915-GVTg_V5_8": 6}
    snap = host.read([f"/sys/bus/mdev/devices/{uuid}/intel_vgpu/vgpu_id", f"/sys/bus/mdev/devices/{uuid}/driver"])
    assert snap.text(f"/sys/bus/mdev/devices/{uuid}/intel_vgpu/vgpu_id") == "1"
    assert snap.link_name(f"/sys/bus/mdev/devices/{uuid}/driver") == "intel_vgpu_mdev"
    # different types coexist until the pool runs out; then the create fails with ENOSPC
    ops = [Op.write(f"{T}/i915-GVTg_V5_8/create", f"fa9d3c62-1f4b-4c4a-a0a1-4dbf3d4f2b2{i}") for i in range(6)]
    assert host.apply(ops).ok
    assert set(avail(host).values()) == {0}
    res = host.apply([Op.write(f"{T}/i915-GVTg_V5_8/create", "fa9d3c62-1f4b-4c4a-a0a1-4dbf3d4f2b30")])
    assert res[0].errno == errno.ENOSPC
