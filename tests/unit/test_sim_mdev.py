"""Legacy NVIDIA mdev semantics of the simulator (t4x2), exercised only through host.read/host.apply."""

from __future__ import annotations

import errno

import pytest

from vgpuvirt.host.base import Op
from vgpuvirt.sim import SimHost

GPU0 = "0000:3b:00.0"
GPU1 = "0000:d8:00.0"
TYPES0 = f"/sys/class/mdev_bus/{GPU0}/mdev_supported_types"
U1 = "a1b2c3d4-0000-4000-8000-000000000001"
U2 = "a1b2c3d4-0000-4000-8000-000000000002"


@pytest.fixture
def host() -> SimHost:
    return SimHost.from_profile("t4x2")


def avail(host: SimHost, gpu: str = GPU0) -> dict[str, int]:
    snap = host.read([f"/sys/class/mdev_bus/{gpu}/mdev_supported_types/*/available_instances"])
    return {p.split("/")[-2]: int(snap.text(p) or "-1") for p in snap}


def write(host: SimHost, path: str, value: str) -> int | None:
    """Apply one write; return None on success, else the errno."""
    r = host.apply([Op.write(path, value)])[0]
    return None if r.ok else r.errno


def test_fresh_gpu_offers_every_type_at_max_instance(host: SimHost) -> None:
    snap = host.read([f"{TYPES0}/*/description", f"{TYPES0}/*/name", f"{TYPES0}/*/device_api"])
    a = avail(host)
    assert len(a) == 17
    for t, n in a.items():
        desc = snap.text(f"{TYPES0}/{t}/description") or ""
        assert n == int(desc.rsplit("max_instance=", 1)[1])
        assert snap.text(f"{TYPES0}/{t}/device_api") == "vfio-pci"
    assert snap.raw(f"{TYPES0}/nvidia-222/description") == (
        "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16\n")
    assert snap.raw(f"{TYPES0}/nvidia-231/name") == "GRID T4-2Q\n"


def test_create_applies_the_equal_size_rule_per_physical_gpu(host: SimHost) -> None:
    assert write(host, f"{TYPES0}/nvidia-231/create", U1 + "\n") is None
    a = avail(host)
    # hostdata section E: same framebuffer size (2048M: 2A/2B/2B4/2Q) -> max-1, everything else 0
    assert {t for t, n in a.items() if n} == {"nvidia-223", "nvidia-224", "nvidia-226", "nvidia-231"}
    assert a["nvidia-231"] == 7 and a["nvidia-226"] == 7
    assert avail(host, GPU1)["nvidia-231"] == 8          # the other GPU is independent
    assert write(host, f"{TYPES0}/nvidia-232/create", U2) == errno.EINVAL   # other size: the driver refuses


def test_created_mdev_appears_with_links_and_its_own_iommu_group(host: SimHost) -> None:
    assert write(host, f"{TYPES0}/nvidia-231/create", U1.upper()) is None   # kernel names it lower-case
    dev = f"/sys/bus/mdev/devices/{U1}"
    snap = host.read([dev, f"{dev}/mdev_type", f"{dev}/driver", f"{dev}/iommu_group", f"{dev}/nvidia/vgpu_params",
                      f"{TYPES0}/nvidia-231/devices/*", "/sys/kernel/iommu_groups/*/devices/*",
                      f"{dev}/mdev_type/name"])
    assert snap.link(dev) == f"../../../devices/pci0000:3a/0000:3a:00.0/{GPU0}/{U1}"
    assert snap.link(f"{dev}/mdev_type") == "../mdev_supported_types/nvidia-231"
    assert snap.link(f"{dev}/driver") == "../../../../../bus/mdev/drivers/nvidia-vgpu-vfio"
    assert snap.text(f"{dev}/mdev_type/name") == "GRID T4-2Q"          # a path through two symlinks
    assert snap.link(f"{TYPES0}/nvidia-231/devices/{U1}") == f"../../../{U1}"
    group = snap.link_name(f"{dev}/iommu_group")
    assert group is not None and group not in ("35", "120", "0")
    members = [p.rsplit("/", 1)[1] for p in snap.glob(f"/sys/kernel/iommu_groups/{group}/devices/*")]
    assert members == [U1]
    assert snap.raw(f"{dev}/nvidia/vgpu_params") == ""


def test_max_instances_then_everything_is_zero(host: SimHost) -> None:
    ops = [Op.write(f"{TYPES0}/nvidia-233/create", f"00000000-0000-0000-0000-00000000000{i}") for i in (1, 2)]
    assert host.apply(ops).ok
    assert set(avail(host).values()) == {0}
    assert write(host, f"{TYPES0}/nvidia-233/create", "00000000-0000-0000-0000-000000000003") == errno.EINVAL


@pytest.mark.parametrize("value", ["", "not-a-uuid", U1[:35], U1 + "\n\n", "g" + U1[1:], U1.replace("-", "_")])
def test_create_rejects_malformed_uuids_with_einval(host: SimHost, value: str) -> None:
    got = write(host, f"{TYPES0}/nvidia-231/create", value)
    if value == "":
        assert got is None                       # a zero-length write never reaches the driver
    else:
        assert got == errno.EINVAL
    assert avail(host)["nvidia-231"] == 8


def test_duplicate_uuid_is_eexist_on_any_parent(host: SimHost) -> None:
    assert write(host, f"{TYPES0}/nvidia-231/create", U1) is None
    assert write(host, f"{TYPES0}/nvidia-231/create", U1) == errno.EEXIST
    other = f"/sys/class/mdev_bus/{GPU1}/mdev_supported_types/nvidia-222/create"
    assert write(host, other, U1) == errno.EEXIST


def test_remove_semantics(host: SimHost) -> None:
    assert write(host, f"{TYPES0}/nvidia-231/create", U1) is None
    remove = f"/sys/bus/mdev/devices/{U1}/remove"
    assert write(host, remove, "yes") == errno.EINVAL
    assert write(host, remove, "0") is None
    assert host.read([f"/sys/bus/mdev/devices/{U1}"]).has(f"/sys/bus/mdev/devices/{U1}")
    assert write(host, remove, "1\n") is None
    snap = host.read(["/sys/bus/mdev/devices/*", "/sys/kernel/iommu_groups/*/devices/*"])
    assert not snap.glob("/sys/bus/mdev/devices/*")
    assert not any(U1 in p for p in snap)
    assert avail(host)["nvidia-222"] == 16
    assert write(host, remove, "1") == errno.ENOENT


def test_wrong_direction_access_is_eacces_and_big_writes_e2big(host: SimHost) -> None:
    snap = host.read([f"{TYPES0}/nvidia-231/create", f"/sys/bus/pci/devices/{GPU0}/vendor"])
    assert snap[f"{TYPES0}/nvidia-231/create"].kind == "error"
    assert snap[f"{TYPES0}/nvidia-231/create"].errno == errno.EACCES
    assert write(host, f"{TYPES0}/nvidia-231/available_instances", "5") == errno.EACCES
    assert write(host, f"/sys/bus/pci/devices/{GPU0}/vendor", "0x1234") == errno.EACCES
    assert write(host, f"{TYPES0}/nvidia-231/create", "x" * 5000) == errno.E2BIG
    assert write(host, f"{TYPES0}/nvidia-999/create", U1) == errno.ENOENT
    assert write(host, f"{TYPES0}/nvidia-231", U1) == errno.EISDIR


def test_mdevs_survive_only_while_the_parent_driver_is_bound(host: SimHost) -> None:
    assert write(host, f"{TYPES0}/nvidia-231/create", U1) is None
    assert write(host, "/sys/bus/pci/drivers/nvidia/unbind", GPU0) is None
    snap = host.read(["/sys/class/mdev_bus/*", "/sys/bus/mdev/devices/*"])
    assert snap.glob("/sys/class/mdev_bus/*") == [f"/sys/class/mdev_bus/{GPU1}"]
    assert not snap.glob("/sys/bus/mdev/devices/*")
    assert write(host, "/sys/bus/pci/drivers/nvidia/bind", GPU0) is None
    assert avail(host)["nvidia-231"] == 8


def test_check_int_and_lock_work_like_a_real_host(host: SimHost) -> None:
    res = host.apply([Op.check_int(f"{TYPES0}/nvidia-231/available_instances", 1),
                      Op.check_absent(f"/sys/bus/mdev/devices/{U1}"),
                      Op.write(f"{TYPES0}/nvidia-231/create", U1),
                      Op.wait(f"/sys/bus/mdev/devices/{U1}", "exists", timeout=1)], lock=True)
    assert res.ok
    assert host.round_trips == 1
