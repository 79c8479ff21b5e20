"""The simulator's MIG: the guide's placements and slice rules on A100 40GB/80GB, H100 and A30, the pending mode,
the refusals, compute instances, and MIG-backed vGPU types following the GPU instances."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from lxml import etree

from vgpuvirt.host.base import Op
from vgpuvirt.services.mig.parse import parse_lci, parse_lgi, parse_lgip
from vgpuvirt.sim import SimHost

D = "/sys/bus/pci/devices"
GUIDE_PLACEMENTS = ("GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1\n"
                    "GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1\n"
                    "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2\n"
                    "GPU  0 Profile ID 14 Placements: {0,2,4}:2\n"
                    "GPU  0 Profile ID  9 Placements: {0,4}:4\n"
                    "GPU  0 Profile ID  5 Placement : {0}:4\n"
                    "GPU  0 Profile ID  0 Placement : {0}:8\n")


def one_gpu(tmp_path: Path, table: str, *, mig: bool = True) -> SimHost:
    """A host with one bare MIG-capable GPU of ``table`` (PF only, no VFs)."""
    prof = {"name": f"mig-{table}", "cpus": {"sockets": 1, "cores_per_socket": 4, "threads_per_core": 1,
                                             "memory_mib_per_node": 65536},
            "devices": [{"address": "0000:17:00.0", "vendor": 0x10DE, "device": 0x20B5, "class": 0x030200,
                         "driver": "nvidia", "iommu_group": 20, "product": f"NVIDIA {table}",
                         "vgpu": {"mode": "mdev", "types": table, "mig": {"enabled": mig}}}]}
    f = tmp_path / f"{table}.yaml"
    f.write_text(yaml.safe_dump(prof), encoding="utf-8")
    return SimHost.from_profile(str(f))


def smi(host: SimHost, *args: str) -> tuple[int, str, str]:
    r = host.run(["nvidia-smi", *args])
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("table", ["a100", "a100d", "h100"])
def test_eight_memory_slice_boards_have_the_guides_placements(tmp_path: Path, table: str) -> None:
    assert smi(one_gpu(tmp_path, table), "mig", "-lgipp")[1] == GUIDE_PLACEMENTS


def test_a30_has_four_slices(tmp_path: Path) -> None:
    host = one_gpu(tmp_path, "a30")
    assert smi(host, "mig", "-lgipp")[1] == ("GPU  0 Profile ID 14 Placements: {0,1,2,3}:1\n"
                                              "GPU  0 Profile ID 21 Placements: {0,1,2,3}:1\n"
                                              "GPU  0 Profile ID  5 Placements: {0,2}:2\n"
                                              "GPU  0 Profile ID  6 Placements: {0,2}:2\n"
                                              "GPU  0 Profile ID  0 Placement : {0}:4\n")
    rc, out, _ = smi(host, "mig", "-cgi", "14,14,14,14")
    assert rc == 0 and out.count("Successfully created GPU instance") == 4
    assert smi(host, "mig", "-cgi", "14")[0] == 23                          # four slices, all taken
    assert {p.name: p.free for p in parse_lgip(smi(host, "mig", "-lgip")[1])} == {
        "1g.6gb": 0, "1g.6gb+me": 0, "2g.12gb": 0, "2g.12gb+me": 0, "4g.24gb": 0}


def test_placement_overlap_and_slice_tree_ids(tmp_path: Path) -> None:
    host = one_gpu(tmp_path, "a100d")
    rc, out, _ = smi(host, "mig", "-cgi", "19:3")                           # a 1g in the first half ...
    assert rc == 0 and "GPU instance ID 10 " in out                          # ... is node 7 + 3
    rc, _, err = smi(host, "mig", "-cgi", "9:0")                            # 3g.40gb at 0 takes slices 0-3
    assert rc == 23 and err == "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources\n"
    rc, out, _ = smi(host, "mig", "-cgi", "9")                              # without a start it goes to 4
    assert rc == 0 and "GPU instance ID  2 " in out
    assert smi(host, "mig", "-cgi", "14:6")[0] == 2                         # not a 2g.20gb placement
    gis = {(g.profile, g.start, g.size) for g in parse_lgi(smi(host, "mig", "-lgi")[1])}
    assert gis == {("1g.10gb", 3, 1), ("3g.40gb", 4, 4)}
    free = {p.name: p.free for p in parse_lgip(smi(host, "mig", "-lgip")[1])}
    assert free == {"1g.10gb": 3, "1g.10gb+me": 1, "1g.20gb": 1, "2g.20gb": 1, "3g.40gb": 0, "4g.40gb": 0,
                    "7g.80gb": 0}


def test_seven_compute_slices_and_the_max_per_profile(tmp_path: Path) -> None:
    host = one_gpu(tmp_path, "a100")
    rc, out, _ = smi(host, "mig", "-cgi", "20,20")
    assert rc == 23 and out.count("Successfully") == 1                     # one +me instance at most
    assert smi(host, "mig", "-dgi") == (0, "Successfully destroyed GPU instance ID 13 from GPU  0\n", "")
    rc, out, _ = smi(host, "mig", "-cgi", "4g.20gb,3g.20gb")
    assert rc == 0 and "ID  1 on GPU  0 using profile MIG 4g.20gb (ID  5)" in out and "ID  2 " in out
    assert smi(host, "mig", "-dgi")[0] == 0
    rc, out, _ = smi(host, "mig", "-cgi", "0")
    assert rc == 0 and "GPU instance ID  0 " in out                         # 7g.40gb is the root node


def test_compute_instances_and_destroy_order(tmp_path: Path) -> None:
    host = one_gpu(tmp_path, "h100")
    rc, out, _ = smi(host, "mig", "-cgi", "9", "-C")
    assert rc == 0 and ("Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile "
                        "MIG 3g.40gb (ID  2)") in out
    assert smi(host, "mig", "-gi", "1", "-cci", "0")[0] == 23               # the whole GI already has a CI
    assert smi(host, "mig", "-dgi", "-gi", "1")[0] == 19                     # CIs first
    assert smi(host, "mig", "-dci", "-gi", "1")[0] == 0
    rc, out, _ = smi(host, "mig", "-gi", "1", "-cci", "0,0,1c.3g.40gb")
    assert rc == 0 and out.count("MIG 1c.3g.40gb (ID  0)") == 3
    assert [(c.id, c.start, c.size) for c in parse_lci(smi(host, "mig", "-lci")[1])] == [(0, 0, 1), (1, 1, 1),
                                                                                          (2, 2, 1)]
    assert smi(host, "mig", "-dci", "-gi", "1", "-ci", "7")[0] == 6
    assert smi(host, "mig", "-dci")[0] == 0 and smi(host, "mig", "-dgi", "-gi", "1")[0] == 0
    assert smi(host, "mig", "-lgi") == (6, "", "No GPU instances found: Not Found\n")


def _modes(host: SimHost) -> list[tuple[str | None, str | None]]:
    doc = etree.fromstring(smi(host, "-q", "-x")[1].split("\n", 2)[2].encode())
    return [(g.findtext("mig_mode/current_mig"), g.findtext("mig_mode/pending_mig")) for g in doc.findall("gpu")]


def test_mode_is_pending_while_the_gpu_is_busy_until_reset_or_reboot(tmp_path: Path) -> None:
    host = one_gpu(tmp_path, "a100d", mig=False)
    host.model.gpus["0000:17:00.0"].processes = 1                            # e.g. DCGM holds the GPU
    rc, out, _ = smi(host, "-i", "0", "-mig", "1")
    assert rc == 0 and out.startswith("Warning: MIG mode is in pending enable state for GPU 00000000:17:00.0:"
                                      "In use by another client\n") and out.endswith("All done.\n")
    assert _modes(host) == [("Disabled", "Enabled")]
    assert smi(host, "mig", "-cgi", "19")[0] == 6                           # not in MIG mode yet
    assert smi(host, "-i", "0", "-r")[0] == 19                              # cannot reset while in use
    host.model.gpus["0000:17:00.0"].processes = 0
    assert smi(host, "-i", "0", "-r") == (0, "GPU 00000000:17:00.0 was successfully reset.\nAll done.\n", "")
    assert _modes(host) == [("Enabled", "Enabled")]
    host.model.gpus["0000:17:00.0"].processes = 1
    assert smi(host, "-i", "0", "-mig", "0")[0] == 0 and _modes(host) == [("Enabled", "Disabled")]
    host.reboot()
    assert _modes(host) == [("Disabled", "Disabled")]


def test_hopper_needs_no_reset(tmp_path: Path) -> None:
    host = one_gpu(tmp_path, "h100", mig=False)
    host.model.gpus["0000:17:00.0"].processes = 1
    assert smi(host, "-mig", "1") == (0, "Enabled MIG Mode for GPU 00000000:17:00.0\nAll done.\n", "")
    assert _modes(host) == [("Enabled", "Enabled")]


def test_refusals_change_nothing() -> None:
    host = SimHost.from_profile("a100-sriov")
    vf = "0000:17:00.4"
    assert host.apply([Op.write(f"{D}/{vf}/mdev_supported_types/nvidia-700/create",
                                "73269d0f-b2c9-438d-8f28-f9e4bc6c6990")]).ok
    rc, _, err = smi(host, "-i", "0", "-mig", "0")
    assert rc == 19 and err == "Unable to disable MIG Mode for GPU 00000000:17:00.0: In use by another client\n"
    rc, _, err = smi(host, "mig", "-i", "0", "-dgi")                        # the vGPU holds one 2g.20gb GI
    assert rc == 19 and err.count("In use by another client") == 1
    assert len(parse_lgi(smi(host, "mig", "-lgi")[1])) == 1                 # only that one is left
    assert _modes(host)[0] == ("Enabled", "Enabled")
    assert smi(host, "-i", "7", "-mig", "1")[0] == 2


def test_a_vf_assigned_to_vfio_keeps_the_new_mode_pending() -> None:
    host = SimHost.from_profile("a100-sriov")
    vf = "0000:65:00.4"
    assert host.apply([Op.write(f"{D}/{vf}/driver/unbind", vf), Op.write(f"{D}/{vf}/driver_override", "vfio-pci"),
                       Op.write("/sys/bus/pci/drivers_probe", vf)]).ok
    rc, out, _ = smi(host, "-i", "1", "-mig", "1")
    assert rc == 0 and "pending enable state" in out and _modes(host)[1] == ("Disabled", "Enabled")


def test_mig_backed_types_follow_the_gpu_instances() -> None:
    host = SimHost.from_profile("a100-sriov")
    avail = f"{D}/0000:65:00.4/mdev_supported_types/nvidia-701/available_instances"
    assert smi(host, "-i", "1", "-mig", "1")[0] == 0
    assert host.read([avail]).text(avail) == "0"
    assert smi(host, "mig", "-i", "1", "-cgi", "3g.40gb")[0] == 0
    assert host.read([avail]).text(avail) == "1"
    assert smi(host, "mig", "-i", "1", "-dgi")[0] == 0
    assert host.read([avail]).text(avail) == "0"


def test_mig_devices_in_the_xml_and_the_gpu_list() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert smi(host, "mig", "-i", "0", "-gi", "13,3", "-cci")[0] == 0      # no profile: each GI's whole-GI CI
    out = smi(host, "-L")[1].splitlines()
    assert out[1].startswith("  MIG 2g.20gb     Device  0: (UUID: MIG-")
    assert out[2].startswith("  MIG 1g.10gb     Device  1:")
    doc = etree.fromstring(smi(host, "-q", "-x")[1].split("\n", 2)[2].encode())
    devs = doc.find("gpu").findall("mig_devices/mig_device")              # type: ignore[union-attr]
    ids = [(d.findtext("gpu_instance_id"), d.findtext("compute_instance_id")) for d in devs]
    assert ids == [("3", "0"), ("13", "0")]


def test_a_profile_whose_gpu_instances_overlap_is_refused(tmp_path: Path) -> None:
    from vgpuvirt.sim import ProfileError
    prof = {"name": "mig-overlap", "cpus": {"sockets": 1, "cores_per_socket": 2, "threads_per_core": 1,
                                            "memory_mib_per_node": 8192},
            "devices": [{"address": "0000:17:00.0", "vendor": 0x10DE, "device": 0x20B5, "class": 0x030200,
                         "driver": "nvidia", "iommu_group": 1,
                         "vgpu": {"mode": "mdev", "types": "a100d", "mig": {"enabled": True, "instances": [
                             {"id": 1, "profile": "3g.40gb"}, {"id": 2, "profile": "3g.40gb"},
                             {"id": 7, "profile": "1g.10gb"}]}}}]}   # 7 compute slices, but 9 memory slices
    f = tmp_path / "overlap.yaml"
    f.write_text(yaml.safe_dump(prof), encoding="utf-8")
    with pytest.raises(ProfileError, match=r"GPU instance 7 \(1g\.10gb\) has no free placement"):
        SimHost.from_profile(str(f))


def test_mig_mode_on_every_gpu_goes_on_past_a_refusal() -> None:
    host = SimHost.from_profile("mixed")                                     # T4 x2, A10, L40S: no MIG anywhere
    rc, out, err = smi(host, "-mig", "1")
    assert rc == 3 and out == "" and err.count("Not Supported\n") == 4
    a100 = SimHost.from_profile("a100-sriov")
    assert a100.apply([Op.write(f"{D}/0000:17:00.4/mdev_supported_types/nvidia-700/create",
                                "73269d0f-b2c9-438d-8f28-f9e4bc6c6990")]).ok
    rc, out, err = smi(a100, "-mig", "0")                                    # GPU 0 refuses, GPU 1 was off
    assert rc == 19 and out == "Disabled MIG Mode for GPU 00000000:65:00.0\n" and "00000000:17:00.0" in err


def test_type_tables_keep_their_names() -> None:
    from vgpuvirt.sim.profiles import builtin_type_tables
    assert {n: t.name for n, t in builtin_type_tables().items()} == {n: n for n in builtin_type_tables()}
