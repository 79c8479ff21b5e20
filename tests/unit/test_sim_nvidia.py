"""NVIDIA SR-IOV mdev, MIG-backed types, vGPU 17+ vendor VFs and the emulated nvidia-smi/sriov-manage."""

from __future__ import annotations

import errno

import pytest
from lxml import etree

from vgpuvirt.host.base import Op
from vgpuvirt.sim import SimHost

D = "/sys/bus/pci/devices"


def write(host: SimHost, path: str, value: str) -> int | None:
    r = host.apply([Op.write(path, value)])[0]
    return None if r.ok else r.errno


def vf_avail(host: SimHost, vf: str) -> dict[str, int]:
    snap = host.read([f"{D}/{vf}/mdev_supported_types/*/available_instances"])
    return {p.split("/")[-2]: int(snap.text(p) or "-1") for p in snap}


# ---------------------------------------------------------------- A10: SR-IOV with mdev types on VFs

def test_a10_vfs_appear_with_sriov_manage_and_carry_mdev_types() -> None:
    host = SimHost.from_profile("a10-sriov")
    pf = "0000:41:00.0"
    assert not host.read([f"{D}/{pf}/mdev_supported_types", "/sys/class/mdev_bus/*"]).glob("/sys/class/mdev_bus/*")
    res = host.run(["/usr/lib/nvidia/sriov-manage", "-e", pf])
    assert res.exit_code == 0 and res.stdout == f"Enabling VFs on {pf}\n"
    snap = host.read([f"{D}/{pf}/sriov_numvfs", f"{D}/{pf}/virtfn*", "/sys/class/mdev_bus/*",
                      f"{D}/{pf}/mdev_supported_types"])
    assert snap.text(f"{D}/{pf}/sriov_numvfs") == "32"
    assert snap.link(f"{D}/{pf}/virtfn10") == "../0000:41:01.6"
    assert snap.link(f"{D}/{pf}/virtfn31") == "../0000:41:04.3"
    assert f"{D}/{pf}/mdev_supported_types" not in snap                # the PF is no mdev parent
    assert len(snap.glob("/sys/class/mdev_bus/*")) == 32
    a = vf_avail(host, "0000:41:00.4")
    assert len(a) == 23 and set(a.values()) == {1}


def test_a10_one_vgpu_per_vf_and_equal_size_across_vfs() -> None:
    host = SimHost.from_profile("a10-sriov")
    assert write(host, f"{D}/0000:41:00.0/sriov_numvfs", "8") is None
    uuid = "5b1c7a7e-9a3f-4f7b-a6a5-2f7e0d5c1a01"
    assert write(host, f"{D}/0000:41:00.4/mdev_supported_types/nvidia-593/create", uuid) is None
    assert set(vf_avail(host, "0000:41:00.4").values()) == {0}          # VF0 already hosts a vGPU
    a1 = vf_avail(host, "0000:41:00.5")                                   # hostdata section B
    assert (a1["nvidia-593"], a1["nvidia-601"], a1["nvidia-610"], a1["nvidia-591"], a1["nvidia-597"]) == (1, 1, 1, 0, 0)
    assert write(host, f"{D}/0000:41:00.4/mdev_supported_types/nvidia-593/create",
                 "5b1c7a7e-9a3f-4f7b-a6a5-2f7e0d5c1a02") == errno.EINVAL
    for i, vf in enumerate(["0000:41:00.5", "0000:41:00.6", "0000:41:00.7", "0000:41:01.0", "0000:41:01.1"]):
        assert write(host, f"{D}/{vf}/mdev_supported_types/nvidia-593/create",
                     f"5b1c7a7e-9a3f-4f7b-a6a5-2f7e0d5c1b0{i}") is None
    assert set(vf_avail(host, "0000:41:01.2").values()) == {0}           # 6 x 4 GB = 24 GB: full
    assert write(host, f"{D}/0000:41:00.0/sriov_numvfs", "0") == errno.EBUSY   # INFERRED: vGPUs exist


def test_heterogeneous_mode_switch_only_without_vgpus() -> None:
    host = SimHost.from_profile("a10-sriov")
    assert host.run(["/usr/lib/nvidia/sriov-manage", "-e", "ALL"]).ok
    res = host.run(["nvidia-smi", "vgpu", "-i", "0", "-shm", "1"])
    assert res.exit_code == 0, res.stderr
    assert write(host, f"{D}/0000:41:00.4/mdev_supported_types/nvidia-593/create",
                 "5b1c7a7e-9a3f-4f7b-a6a5-2f7e0d5c1a01") is None
    a = vf_avail(host, "0000:41:00.5")
    assert a["nvidia-597"] == 0 and a["nvidia-596"] == 1 and a["nvidia-591"] == 1   # 20 GB left, mixed sizes
    res = host.run(["nvidia-smi", "vgpu", "-i", "0", "-shm", "0"])
    assert res.exit_code == 19 and "In use by another client" in res.stderr
    t4 = SimHost.from_profile("t4x2")
    assert t4.run(["nvidia-smi", "vgpu", "-i", "0", "-shm", "1"]).exit_code == 3   # T4 has no mixed-size mode


# ---------------------------------------------------------------- A100: MIG-backed types

def test_mig_backed_types_follow_free_gpu_instances() -> None:
    host = SimHost.from_profile("a100-sriov")
    a = vf_avail(host, "0000:17:00.4")
    assert a["nvidia-700"] == 1 and a["nvidia-699"] == 1                 # 3 x 2g.20gb + 1 x 1g.10gb
    assert a["nvidia-701"] == 0 and a["nvidia-697"] == 0                 # no 3g GI; time-sliced off under MIG
    assert write(host, f"{D}/0000:17:00.7/mdev_supported_types/nvidia-699/create",
                 "f3b823d3-97c8-4e0a-ae1b-1f102dcb3bce") is None
    assert vf_avail(host, "0000:17:00.5")["nvidia-699"] == 0             # the only 1g.10gb GI is used
    assert write(host, f"{D}/0000:17:00.5/mdev_supported_types/nvidia-699/create",
                 "f3b823d3-97c8-4e0a-ae1b-1f102dcb3bcf") == errno.EINVAL
    for i, vf in enumerate(["0000:17:00.4", "0000:17:00.5", "0000:17:00.6"]):
        assert write(host, f"{D}/{vf}/mdev_supported_types/nvidia-700/create",
                     f"73269d0f-b2c9-438d-8f28-f9e4bc6c699{i}") is None
    assert vf_avail(host, "0000:17:01.0")["nvidia-700"] == 0
    # the time-sliced GPU: 2 x 40C fit an 80 GB card; MIG types stay 0
    b = vf_avail(host, "0000:65:00.4")
    assert b["nvidia-697"] == 1 and b["nvidia-699"] == 0


def test_mig_mode_and_gpu_instances_through_nvidia_smi() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert host.run(["nvidia-smi", "-i", "1", "-mig", "1"]).stdout.endswith("All done.\n")
    assert set(vf_avail(host, "0000:65:00.4").values()) == {0}           # MIG on, no GI yet
    res = host.run(["nvidia-smi", "mig", "-i", "1", "-cgi", "19,19"])
    assert res.exit_code == 0 and res.stdout.count("Successfully created GPU instance") == 2
    assert vf_avail(host, "0000:65:00.4")["nvidia-699"] == 1
    assert host.run(["nvidia-smi", "mig", "-i", "1", "-cgi", "9,9"]).exit_code == 23   # 2 + 6 slices > 7
    res = host.run(["nvidia-smi", "mig", "-i", "1", "-dgi", "-gi", "1"])
    assert res.exit_code == 0, res.stderr
    assert write(host, f"{D}/0000:17:00.4/mdev_supported_types/nvidia-700/create",
                 "73269d0f-b2c9-438d-8f28-f9e4bc6c6995") is None
    assert host.run(["nvidia-smi", "-i", "0", "-mig", "0"]).exit_code == 19           # vGPUs exist


def test_nvidia_smi_xml_and_unknown_commands() -> None:
    host = SimHost.from_profile("mixed")
    res = host.run(["nvidia-smi", "-q", "-x"])
    assert res.exit_code == 0
    doc = etree.fromstring(res.stdout.split("\n", 2)[2].encode())
    ids = [g.get("id") for g in doc.findall("gpu")]
    assert ids == ["00000000:3B:00.0", "00000000:3D:00.0", "00000000:41:00.0", "00000000:D8:00.0"]
    modes = {g.get("id"): g.findtext("gpu_virtualization_mode/host_vgpu_mode") for g in doc.findall("gpu")}
    assert modes["00000000:3B:00.0"] == "Non SR-IOV" and modes["00000000:41:00.0"] == "SR-IOV"
    assert host.run(["lspci", "-nn"]).exit_code == 127
    assert SimHost.from_profile("gvtg").run(["nvidia-smi", "-q", "-x"]).exit_code == 9
    batch = host.apply([Op.exec(["nvidia-smi", "-L"]), Op.exec(["rm", "-rf", "/"], ok_codes=(0,))], on_error="continue")
    assert batch[0].ok and batch[0].stdout.startswith("GPU 0: Tesla T4")
    assert not batch[1].ok and batch[1].rc == 127                         # exec never leaves the simulator


# ---------------------------------------------------------------- L40S: vGPU 17+ vendor-specific VFs

L40S_HEADER = "ID    : vGPU Name\n"


def test_l40s_creatable_list_is_byte_exact_and_in_rm_order() -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    vf = f"{D}/0000:3d:00.4"
    snap = host.read([f"{vf}/nvidia/*", f"{vf}/mdev_supported_types", f"{D}/0000:3d:00.0/nvidia", f"{vf}/driver",
                      "/sys/bus/mdev", "/sys/class/mdev_bus"])
    text = snap.raw(f"{vf}/nvidia/creatable_vgpu_types") or ""
    assert text.startswith(L40S_HEADER + "1145  : NVIDIA L40S-1B\n1146  : NVIDIA L40S-2B\n")
    assert text.endswith("1165  : NVIDIA L40S-24A\n1166  : NVIDIA L40S-48A\n2164  : NVIDIA L40S-3B\n")
    assert len(text.splitlines()) == 24
    assert snap.raw(f"{vf}/nvidia/current_vgpu_type") == "0\n"
    assert f"{vf}/mdev_supported_types" not in snap and f"{D}/0000:3d:00.0/nvidia" not in snap
    assert "/sys/bus/mdev" not in snap and "/sys/class/mdev_bus" not in snap
    assert snap.link_name(f"{vf}/driver") == "nvidia"


def test_l40s_current_vgpu_type_semantics_and_collapse() -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    cur0 = f"{D}/0000:3d:00.4/nvidia/current_vgpu_type"
    assert write(host, cur0, "0") == errno.EPERM                           # nothing to remove
    assert write(host, cur0, "nvidia-1155") == errno.EINVAL
    assert write(host, cur0, "99999999999999999999") == errno.ERANGE
    assert write(host, cur0, "941") == errno.EIO                           # not an L40S type
    assert write(host, cur0, "1155\n") is None
    assert write(host, cur0, "1155") == errno.EPERM                        # already set
    snap = host.read([f"{D}/0000:3d:0*.*/nvidia/*", f"{D}/0000:3d:00.4/driver"])
    assert snap.raw(cur0) == "1155\n"
    assert snap.raw(f"{D}/0000:3d:00.4/nvidia/creatable_vgpu_types") == L40S_HEADER
    assert snap.raw(f"{D}/0000:3d:00.5/nvidia/creatable_vgpu_types") == (
        L40S_HEADER + "1155  : NVIDIA L40S-24Q\n1165  : NVIDIA L40S-24A\n")
    assert snap.link_name(f"{D}/0000:3d:00.4/driver") == "nvidia"          # the VF stays on nvidia
    assert write(host, f"{D}/0000:3d:00.5/nvidia/current_vgpu_type", "1150") == errno.EIO   # other size
    assert write(host, f"{D}/0000:3d:00.5/nvidia/current_vgpu_type", "1165") is None
    assert host.read([f"{D}/0000:3d:00.6/nvidia/creatable_vgpu_types"]).raw(
        f"{D}/0000:3d:00.6/nvidia/creatable_vgpu_types") == L40S_HEADER     # 2 x 24 GB: full
    assert write(host, cur0, "0") is None
    assert host.read([cur0]).raw(cur0) == "0\n"
    assert write(host, f"{D}/0000:3d:00.4/nvidia/creatable_vgpu_types", "1") == errno.EACCES


@pytest.mark.parametrize("profile", ["t4x2", "a100-sriov", "l40s-vgpu17", "a10-sriov", "gvtg", "mxgpu", "desktop",
                                     "mixed"])
def test_full_read_never_fails(profile: str) -> None:
    host = SimHost.from_profile(profile)
    snap = host.read(["/sys/bus/pci/devices/*/*", "/sys/bus/pci/devices/*/*/*", "/sys/class/mdev_bus/*/*/*/*",
                      "/sys/kernel/iommu_groups/*/*/*", "/sys/devices/system/*/*/*"])
    errors = {p: e.errno for p, e in snap.items() if e.kind == "error"}
    # only write-only attributes may refuse a read
    assert all(e == errno.EACCES and p.rsplit("/", 1)[1] in {"create", "remove", "bind", "unbind", "new_id",
               "remove_id", "reset", "drivers_probe", "rescan", "uevent"} for p, e in errors.items()), errors
