"""Inventory on trees built from hostdata transcripts (tests/fixtures/hostdata) and from scratch, read
through LocalHost."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest

from vgpuvirt.errors import HostError, InvalidSpec
from vgpuvirt.host import agent
from vgpuvirt.host.base import Op, OpResult, Snapshot
from vgpuvirt.host.local import LocalHost
from vgpuvirt.model import PciAddress
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS, build_inventory, inventory, type_capacity

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import trees

T4_MDEV = "a1b2c3d4-0000-4000-8000-000000000001"


def mdev_domain(name: str, uuid: str) -> tuple[str, str]:
    return name, (f"<domain type='kvm'><name>{name}</name><devices><hostdev mode='subsystem' type='mdev' "
                  f"model='vfio-pci'><source><address uuid='{uuid}'/></source></hostdev></devices></domain>")


def pci_domain(name: str, *addrs: str) -> tuple[str, str]:
    devs = "".join(
        "<hostdev mode='subsystem' type='pci' managed='yes'><source><address "
        f"domain='0x{a.domain:04x}' bus='0x{a.bus:02x}' slot='0x{a.slot:02x}' function='0x{a.function:x}'/>"
        "</source></hostdev>" for a in map(PciAddress.parse, addrs))
    return name, f"<domain type='kvm'><name>{name}</name><devices>{devs}</devices></domain>"


@pytest.fixture
def t4(tmp_path: Path) -> LocalHost:
    trees.tree_from_transcript(tmp_path, "nvidia_t4_sysfs.txt", "E.")
    return LocalHost(str(tmp_path))


def test_t4_transcript_legacy_mdev_in_one_round_trip(t4: LocalHost) -> None:
    inv = inventory(t4)
    assert t4.round_trips == 1
    assert inv.iommu_enabled
    assert [(str(g.address), g.backend, g.numa_node, g.vgpus_in_use) for g in inv.gpus] == [
        ("0000:3b:00.0", "mdev", 0, 1), ("0000:d8:00.0", "mdev", 1, 0)]
    gpu0 = inv.gpus[0]
    assert gpu0.reset_methods == ["flr", "bus"] and gpu0.iommu_group == 35
    assert inv.iommu_groups[35] == [PciAddress.parse("3a:00.0"), PciAddress.parse("3b:00.0")]
    parent = inv.mdev_parent("0000:3b:00.0")
    assert parent is not None and len(parent.types) == 17
    t231 = parent.type("nvidia-231")
    assert t231 is not None
    assert (t231.name, t231.available_instances, t231.max_instances, t231.framebuffer_mib, t231.series,
            t231.instances) == ("GRID T4-2Q", 7, 8, 2048, "Q", 1)
    assert [(str(m.uuid), m.parent, m.type, m.iommu_group, m.driver, m.orphan) for m in inv.mdevs] == [
        (T4_MDEV, "0000:3b:00.0", "nvidia-231", 150, "nvidia-vgpu-vfio", None)]
    # types are in numeric order, not the string order mdevctl prints
    assert [t.id for t in parent.types][:3] == ["nvidia-222", "nvidia-223", "nvidia-224"]
    assert parent.types[-1].id == "nvidia-321"


def test_contract_field_names(t4: LocalHost) -> None:
    d = inventory(t4).to_dict()
    assert {"host", "pci_devices", "iommu_groups", "mdev_parents", "mdevs", "vendor_vgpu", "gpus"} <= set(d)
    dev = next(x for x in d["pci_devices"] if x["address"] == "0000:3b:00.0")
    assert {"address", "vendor", "device", "class", "driver", "iommu_group", "numa_node", "physfn", "virtfns",
            "sriov_totalvfs", "sriov_numvfs"} <= set(dev)
    assert dev["vendor"] == "0x10de" and dev["class"] == "0x030200" and dev["iommu_group"] == 35
    t = d["mdev_parents"][0]["types"][0]
    assert {"id", "name", "description", "device_api", "available_instances", "framebuffer_mib", "max_instances",
            "num_heads", "max_resolution", "frl"} <= set(t)
    assert d["iommu_groups"]["35"] == ["0000:3a:00.0", "0000:3b:00.0"]
    assert set(d["mdevs"][0]) >= {"uuid", "parent", "type"}


def test_domains_join_mdevs_and_flag_orphans_and_dangling_refs(t4: LocalHost) -> None:
    used = inventory(t4, domains=[mdev_domain("desk1", T4_MDEV.upper())])
    assert used.mdevs[0].domain == "desk1" and used.mdevs[0].orphan is False
    assert not any("orphan" in w for w in used.warnings)
    idle = inventory(t4, domains=[mdev_domain("desk2", "00000000-0000-0000-0000-000000000100")])
    assert idle.mdevs[0].domain is None and idle.mdevs[0].orphan is True
    assert any(T4_MDEV in w and "orphan" in w for w in idle.warnings)
    assert any("desk2 uses mdev 00000000-0000-0000-0000-000000000100, which does not exist" in w
               for w in idle.warnings)


def test_no_iommu_is_reported_not_an_empty_success(tmp_path: Path) -> None:
    lines = [ln for ln in trees.transcript_lines("nvidia_t4_sysfs.txt", "E.")
             if "iommu" not in ln[1] and "iommu" not in (ln[2] or "")]
    trees.tree_from_lines(tmp_path, lines)
    trees.write_file(tmp_path, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet\n")
    inv = inventory(LocalHost(str(tmp_path)))
    assert inv.iommu_enabled is False and inv.iommu_groups == {}
    assert inv.gpus and all(g.iommu_group is None for g in inv.gpus)
    warning = next(w for w in inv.warnings if w.startswith("IOMMU off"))
    assert "intel_iommu=on" in warning


def test_a10_transcript_mdev_on_sriov_vfs(tmp_path: Path) -> None:
    # The transcript elides links the kernel always has: bus/pci/devices/<VF> and class/mdev_bus/<VF> for VF1.
    lines = [("link", "/sys/bus/pci/devices/0000:41:00.4", "../../../devices/pci0000:40/0000:40:03.1/0000:41:00.4"),
             ("link", "/sys/bus/pci/devices/0000:41:00.5", "../../../devices/pci0000:40/0000:40:03.1/0000:41:00.5"),
             ("link", "/sys/class/mdev_bus/0000:41:00.5", "../../devices/pci0000:40/0000:40:03.1/0000:41:00.5"),
             *trees.transcript_lines("a100_sriov_sysfs.txt", "B.")]
    trees.tree_from_lines(tmp_path, lines)
    inv = inventory(LocalHost(str(tmp_path)), domains=[])
    (gpu,) = inv.gpus
    assert str(gpu.address) == "0000:41:00.0" and gpu.backend == "mdev-sriov"
    assert gpu.numa_node is None                       # numa_node -1
    # virtfn10 comes after virtfn4 (numeric, not lexicographic order)
    assert [str(v) for v in gpu.vfs] == ["0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7",
                                         "0000:41:01.0", "0000:41:01.6", "0000:41:04.2", "0000:41:04.3"]
    assert gpu.sriov_totalvfs == 32 and gpu.sriov_numvfs == 32 and gpu.vgpus_in_use == 1
    assert gpu.functions == []                          # VFs share the slot but are not card functions
    vf0 = inv.mdev_parent("0000:41:00.4")
    assert vf0 is not None and vf0.physfn == gpu.address
    assert vf0.types[0].name == "NVIDIA A10-4Q" and vf0.types[0].instances == 1
    assert inv.mdevs[0].parent == "0000:41:00.4" and inv.mdevs[0].orphan is True
    rows = {r.id: r for r in type_capacity(inv)}
    # The capacity model counts it exactly: 24 GiB equal-size, 4 GiB type: 6 - 1 in use = 5, one free VF left.
    assert rows["nvidia-593"].parent == "0000:41:00.0" and rows["nvidia-593"].exact
    assert rows["nvidia-593"].free_vfs == 1 and rows["nvidia-593"].available == 1   # min(1 VF, 6 - 1)
    assert "max 6 per GPU, 1 in use: 5 fit; 1 free VF(s) offer it" in (rows["nvidia-593"].reason or "")
    assert rows["nvidia-591"].available == 0
    per_vf = type_capacity(inv, parent="41:00.5")
    assert {r.id for r in per_vf} == {"nvidia-593", "nvidia-601", "nvidia-610", "nvidia-591", "nvidia-597"}
    assert all(r.exact for r in per_vf)


def test_l40s_vendor_specific_vfs(tmp_path: Path) -> None:
    trees.tree_from_transcript(tmp_path, "nvidia_vfio_vendor_specific.txt", "Simulated L40S")
    inv = inventory(LocalHost(str(tmp_path)), domains=[pci_domain("render1", "3d:00.4")])
    (gpu,) = inv.gpus
    assert gpu.backend == "vendor-vfio" and gpu.vgpus_in_use == 1
    vf4, vf5 = inv.vendor_vgpu
    assert (str(vf4.address), vf4.current_type, vf4.current_type_name, vf4.creatable_types) == (
        "0000:3d:00.4", 1155, "NVIDIA L40S-24Q", [])
    assert vf4.domain == "render1" and vf4.orphan is False
    assert [(t.id, t.name) for t in vf5.creatable_types] == [(1155, "NVIDIA L40S-24Q"), (1165, "NVIDIA L40S-24A")]
    assert vf5.to_dict()["creatable_types"][0] == {"id": 1155, "name": "NVIDIA L40S-24Q", "series": "Q",
                                                   "framebuffer_mib": 24576, "mig_backed": False,
                                                   "gi_profile": None, "board": "L40S"}
    assert inv.device("3d:00.4").domain == "render1"  # type: ignore[union-attr]
    rows = {r.id: r for r in type_capacity(inv)}
    assert rows["1155"].in_use == 1 and rows["1155"].free_vfs == 1 and rows["1165"].in_use == 0
    # what `vgpuvirt types --json` prints for it: the vGPU in use is counted there too
    row = rows["1155"].to_dict()
    assert (row["in_use"], row["free_vfs"], row["parent"]) == (1, 1, "0000:3d:00.0")
    # asked about the free VF alone: its own sysfs says one of either type can be made on it
    per_vf = {r.id: (r.available, r.in_use) for r in type_capacity(inv, parent="3d:00.5")}
    assert per_vf == {"1155": (1, 0), "1165": (1, 0)}


def test_gvtg_transcript(tmp_path: Path) -> None:
    # The transcript shows the class/mdev_bus link but not the bus/pci/devices one; both name the same device.
    lines = [("link", "/sys/bus/pci/devices/0000:00:02.0", "../../../devices/pci0000:00/0000:00:02.0"),
             *trees.transcript_lines("gvtg_sysfs.txt", "A.")]
    trees.tree_from_lines(tmp_path, lines)
    inv = inventory(LocalHost(str(tmp_path)))
    (gpu,) = inv.gpus
    assert gpu.backend == "gvtg" and gpu.vendor_name == "Intel" and gpu.vgpus_in_use == 1
    (parent,) = inv.mdev_parents
    v54 = parent.type("i915-GVTg_V5_4")
    assert v54 is not None and v54.gvtg is not None
    assert (v54.gvtg.low_gm_mib, v54.gvtg.weight, v54.max_resolution, v54.max_instances, v54.available_instances) == (
        128, 4, "1920x1200", None, 5)
    assert v54.description is not None and "\n" in v54.description    # raw multi-line text kept
    assert inv.mdevs[0].driver == "intel_vgpu_mdev"


def _desktop(root: Path) -> None:
    trees.populate_pci_device(root, "0000:00:01.0", vendor="0x8086", device="0x1901", pci_class="0x060400",
                              driver="pcieport", group=1)
    trees.populate_pci_device(root, "0000:01:00.0", vendor="0x10de", device="0x1b81", pci_class="0x030000",
                              driver="vfio-pci", group=1, upstream="0000:00:01.0",
                              attrs={"boot_vga": "0", "reset_method": "bus", "local_cpulist": "0-3,8-11"})
    trees.populate_pci_device(root, "0000:01:00.1", vendor="0x10de", device="0x10f0", pci_class="0x040300",
                              driver="snd_hda_intel", group=1, upstream="0000:00:01.0")
    trees.populate_pci_device(root, "0000:02:00.0", vendor="0x8086", device="0x1533", pci_class="0x020000",
                              driver="igb", group=1, upstream="0000:00:01.0")
    trees.write_link(root, "/sys/class/iommu/dmar0", "../../devices/virtual/iommu/dmar0")


def test_desktop_passthrough_with_a_nic_in_the_gpu_group(tmp_path: Path) -> None:
    _desktop(tmp_path)
    inv = inventory(LocalHost(str(tmp_path)), domains=[pci_domain("gamer", "01:00.0", "01:00.1")])
    (gpu,) = inv.gpus
    assert gpu.backend == "passthrough" and gpu.driver == "vfio-pci" and gpu.domain == "gamer"
    assert [str(a) for a in gpu.functions] == ["0000:01:00.1"]
    assert gpu.local_cpulist == "0-3,8-11" and gpu.boot_vga is False
    assert inv.device("01:00.0").upstream == PciAddress.parse("00:01.0")  # type: ignore[union-attr]
    assert inv.iommu_units == ["dmar0"]
    nic = [w for w in inv.warnings if "shares its IOMMU group" in w]
    assert len(nic) == 1 and "0000:02:00.0" in nic[0] and "NIC" in nic[0] and "igb" in nic[0]
    assert not any("0000:01:00.1" in w or "0000:00:01.0" in w for w in nic)


def test_amd_style_sriov_vf_passthrough(tmp_path: Path) -> None:
    trees.populate_pci_device(tmp_path, "0000:83:00.0", vendor="0x1002", device="0x74a1", pci_class="0x038000",
                              driver="gim", group=40)
    vfs = ["0000:83:02.0", "0000:83:02.1"]
    for i, vf in enumerate(vfs):
        trees.populate_pci_device(tmp_path, vf, vendor="0x1002", device="0x74b5", pci_class="0x038000",
                                  driver="vfio-pci", group=41 + i)
    trees.populate_vfs(tmp_path, "0000:83:00.0", vfs, total=16)
    inv = inventory(LocalHost(str(tmp_path)))
    (gpu,) = inv.gpus
    assert gpu.backend == "sriov-vf" and [str(v) for v in gpu.vfs] == vfs and gpu.vendor_name == "AMD"
    assert inv.device(vfs[1]).physfn == gpu.address  # type: ignore[union-attr]


def test_sriov_capable_nvidia_without_vfs_gets_a_note(tmp_path: Path) -> None:
    trees.populate_pci_device(tmp_path, "0000:41:00.0", vendor="0x10de", device="0x2236", pci_class="0x030200",
                              driver="nvidia", group=44, attrs={"sriov_totalvfs": "32", "sriov_numvfs": "0"})
    (gpu,) = inventory(LocalHost(str(tmp_path))).gpus
    assert gpu.backend == "passthrough"
    assert any("sriov-manage -e 0000:41:00.0" in n for n in gpu.notes)


def test_unreadable_creatable_list_is_reported(tmp_path: Path) -> None:
    snap = Snapshot({
        "/sys/bus/pci/devices/0000:3d:00.0/class": _file("0x030200"),
        "/sys/bus/pci/devices/0000:3d:00.0/vendor": _file("0x10de"),
        "/sys/bus/pci/devices/0000:3d:00.0/virtfn0": _link("../0000:3d:00.4"),
        "/sys/bus/pci/devices/0000:3d:00.4/physfn": _link("../0000:3d:00.0"),
        "/sys/bus/pci/devices/0000:3d:00.4/nvidia/current_vgpu_type": _file("0"),
        "/sys/bus/pci/devices/0000:3d:00.4/nvidia/creatable_vgpu_types": _err(errno.EINVAL),
    })
    inv = build_inventory(snap, host="h")
    assert inv.vendor_vgpu[0].read_error == "EINVAL (22)"
    assert inv.gpus[0].backend == "vendor-vfio"
    assert any("creatable_vgpu_types failed: EINVAL" in w for w in inv.warnings)


def _file(v: str):  # type: ignore[no-untyped-def]
    from vgpuvirt.host.base import Entry
    return Entry("file", text=v + "\n")


def _link(t: str):  # type: ignore[no-untyped-def]
    from vgpuvirt.host.base import Entry
    return Entry("link", target=t)


def _err(code: int):  # type: ignore[no-untyped-def]
    from vgpuvirt.host.base import Entry
    return Entry("error", errno=code)


def test_inventory_globs_are_valid_host_paths_and_pci_attrs_are_separate_patterns() -> None:
    assert all(p.startswith("/") and ".." not in p for p in INVENTORY_GLOBS)
    agent._build_trie(list(INVENTORY_GLOBS))   # every guard parses
    assert "/sys/bus/pci/devices/*/iommu_group" in INVENTORY_GLOBS
    assert "/sys/bus/pci/devices/*/virtfn*" in INVENTORY_GLOBS


def test_nvidia_smi_runs_in_the_same_round_trip_and_absence_is_normal(t4: LocalHost) -> None:
    inv = inventory(t4, nvidia_smi=True)
    assert t4.round_trips == 1
    assert inv.sources["nvidia_smi"] in ("not installed", "ok")
    if inv.sources["nvidia_smi"] == "not installed":
        assert not any("nvidia-smi" in w for w in inv.warnings)


def test_nvidia_smi_facts_are_joined_to_gpus(t4: LocalHost) -> None:
    xml = (Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "vgpu_host_t4x2.xml").read_text()
    snap = t4.read(INVENTORY_GLOBS)
    op = Op.exec(["nvidia-smi", "-q", "-x"])
    inv = build_inventory(snap, nvidia_smi=OpResult(op=op, ok=True, rc=0, stdout=xml))
    assert inv.sources["nvidia_smi"] == "ok"
    assert [g.name for g in inv.gpus] == ["Tesla T4", "Tesla T4"]
    assert inv.gpus[0].nvidia is not None and inv.gpus[0].nvidia.vgpu_host
    failed = build_inventory(snap, nvidia_smi=OpResult(op=op, ok=False, rc=9, stderr="NVIDIA-SMI has failed"))
    assert any("exit 9" in w and "NVIDIA-SMI has failed" in w for w in failed.warnings)
    missing = build_inventory(snap, nvidia_smi=OpResult(op=op, ok=False, rc=127, errno=errno.ENOENT))
    assert missing.sources["nvidia_smi"] == "not installed" and not any("nvidia-smi" in w for w in missing.warnings)


def test_use_nvml_is_refused_for_a_tree_that_is_not_this_machine(t4: LocalHost) -> None:
    with pytest.raises(InvalidSpec):
        inventory(t4, use_nvml=True)
    assert t4.round_trips == 0


def test_empty_tree_is_no_sysfs_tree_not_an_empty_host(tmp_path: Path) -> None:
    # issue 16: an empty --sysfs-root reported "0 GPUs, IOMMU OFF" as if it were a host
    with pytest.raises(HostError, match=r"no sysfs tree here: nothing under .*/sys/bus/pci/devices"):
        inventory(LocalHost(str(tmp_path)))


def test_vf_types_take_static_attributes_from_their_pfs_sampled_vf() -> None:
    from vgpuvirt.host.base import Entry
    pci, bus = "/sys/bus/pci/devices", "/sys/class/mdev_bus"
    desc = "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=6"
    entries = {
        f"{pci}/0000:41:00.0": Entry("link", target="../../../devices/pci0000:40/0000:40:03.1/0000:41:00.0"),
        f"{pci}/0000:41:00.0/class": Entry("file", text="0x030200\n"),
        f"{pci}/0000:41:00.0/vendor": Entry("file", text="0x10de\n"),
        f"{pci}/0000:41:00.0/virtfn0": Entry("link", target="../0000:41:00.4"),
        f"{pci}/0000:41:00.0/virtfn1": Entry("link", target="../0000:41:00.5"),
        # what the {1?mdev_supported_types} guard read: the types' static files, on virtfn0 only
        f"{pci}/0000:41:00.0/virtfn0/mdev_supported_types/nvidia-593/name": Entry("file", text="NVIDIA A10-4Q\n"),
        f"{pci}/0000:41:00.0/virtfn0/mdev_supported_types/nvidia-593/description": Entry("file", text=desc + "\n"),
        f"{pci}/0000:41:00.0/virtfn0/mdev_supported_types/nvidia-593/device_api": Entry("file", text="vfio-pci\n"),
    }
    for vf, avail in (("0000:41:00.4", "1"), ("0000:41:00.5", "0")):
        entries[f"{pci}/{vf}"] = Entry("link", target=f"../../../devices/pci0000:40/0000:40:03.1/{vf}")
        entries[f"{pci}/{vf}/physfn"] = Entry("link", target="../0000:41:00.0")
        entries[f"{bus}/{vf}"] = Entry("link", target=f"../../devices/pci0000:40/0000:40:03.1/{vf}")
        entries[f"{bus}/{vf}/mdev_supported_types/nvidia-593/available_instances"] = Entry("file", text=avail + "\n")
    # a VF that shows its own name keeps it (the sample only fills what a VF lacks)
    entries[f"{bus}/0000:41:00.5/mdev_supported_types/nvidia-593/name"] = Entry("file", text="Own name\n")
    inv = build_inventory(Snapshot(entries))
    got = {p.address: p.types[0] for p in inv.mdev_parents}
    a, b = got["0000:41:00.4"], got["0000:41:00.5"]
    assert (a.name, a.framebuffer_mib, a.max_instances, a.device_api, a.available_instances, a.series) == (
        "NVIDIA A10-4Q", 4096, 6, "vfio-pci", 1, "Q")
    assert (b.name, b.framebuffer_mib, b.available_instances) == ("Own name", 4096, 0)
    assert inv.gpus[0].backend == "mdev-sriov"


def test_the_read_samples_type_names_once_per_pf_not_on_every_vf() -> None:
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile("a100-sriov")
    snap = host.read(INVENTORY_GLOBS)
    vf_parents = [p for p in snap if p.startswith("/sys/class/mdev_bus/") and p.count("/") == 4
                  and snap.has(f"/sys/bus/pci/devices/{p.rsplit('/', 1)[1]}/physfn")]
    assert len(vf_parents) > 1
    own_names = [p for p in snap if p.startswith("/sys/class/mdev_bus/") and p.endswith("/name")
                 and p.split("/")[4] in {v.rsplit("/", 1)[1] for v in vf_parents}]
    assert own_names == []                                   # no VF's own name file was opened
    assert any("/virtfn" in p and p.endswith("/name") for p in snap)
    inv = build_inventory(snap)
    vf_types = [t for p in inv.mdev_parents if p.physfn is not None for t in p.types]
    assert vf_types and all(t.name and t.description and t.framebuffer_mib for t in vf_types)


def test_a_gpu_passed_through_whole_has_no_room_for_vgpus(t4: LocalHost) -> None:
    # the second T4 (no vGPU on it) is a domain's whole GPU: its budget names the domain and offers nothing
    from vgpuvirt.services.capacity.build import gpu_budgets
    inv = inventory(t4, domains=[pci_domain("gamer", "d8:00.0")])
    b = next(x for x in gpu_budgets(inv) if str(x.address) == "0000:d8:00.0")
    assert b.whole_holder == "gamer"
    assert all(f.fits_now == 0 for f in b.fits())
    assert "passed through to domain gamer" in b.fit("nvidia-231").reason
