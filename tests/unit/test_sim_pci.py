"""PCI, driver binding, SR-IOV, IOMMU groups, NUMA/CPU and hugepages of the simulator."""

from __future__ import annotations

import errno
import posixpath
from pathlib import Path

import pytest

from vgpuvirt.host.base import Op, Snapshot
from vgpuvirt.model import parse_cpulist
from vgpuvirt.sim import SimHost

NIC = "0000:05:00.0"          # desktop: I350 with 7 VFs (offset 128, stride 4)
GPU = "0000:01:00.0"          # desktop: RTX 3080, group 1 with its audio and root port
D = "/sys/bus/pci/devices"



def _resolved(snap: Snapshot, path: str) -> str:
    """A symlink's target made absolute against the link's directory (lexically), as the kernel resolves it."""
    target = snap.link(path)
    assert target is not None, path
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), target))

def write(host: SimHost, path: str, value: str) -> int | None:
    r = host.apply([Op.write(path, value)])[0]
    return None if r.ok else r.errno


@pytest.fixture
def desktop() -> SimHost:
    return SimHost.from_profile("desktop")


def test_pci_attribute_formats(desktop: SimHost) -> None:
    snap = desktop.read([f"{D}/{GPU}/*"])
    assert snap.raw(f"{D}/{GPU}/vendor") == "0x10de\n"
    assert snap.raw(f"{D}/{GPU}/class") == "0x030000\n"
    assert snap.raw(f"{D}/{GPU}/driver_override") == "(null)\n"
    assert snap.raw(f"{D}/{GPU}/numa_node") == "0\n"
    assert snap.raw(f"{D}/{GPU}/reset_method") == "bus\n"
    assert snap.raw(f"{D}/{GPU}/local_cpulist") == "0-15\n"
    assert snap.raw(f"{D}/{GPU}/local_cpus") == "0000ffff\n"
    assert snap.link(f"{D}/{GPU}/driver") == "../../../../bus/pci/drivers/nvidia"
    assert snap.link(f"{D}/{GPU}/iommu_group") == "../../../../kernel/iommu_groups/1"
    assert snap.raw(f"{D}/{GPU}/boot_vga") == "0\n"
    assert f"{D}/{GPU}/sriov_totalvfs" not in snap


def test_iommu_groups_link_both_ways(desktop: SimHost) -> None:
    snap = desktop.read(["/sys/kernel/iommu_groups/*/devices/*", f"{D}/*", f"{D}/*/iommu_group"])
    groups: dict[str, list[str]] = {}
    for p in snap.glob("/sys/kernel/iommu_groups/*/devices/*"):
        groups.setdefault(p.split("/")[4], []).append(p.rsplit("/", 1)[1])
        # the group's link resolves to the same device directory as /sys/bus/pci/devices/X
        dev = p.rsplit("/", 1)[1]
        assert _resolved(snap, p) == _resolved(snap, f"{D}/{dev}")
        assert snap.link_name(f"{D}/{dev}/iommu_group") == p.split("/")[4]
    assert groups["1"] == ["0000:00:01.0", "0000:01:00.0", "0000:01:00.1"]
    assert groups["2"] == ["0000:00:02.0"]
    assert set(groups["8"]) >= {"0000:02:00.0", "0000:03:00.0", "0000:04:00.0"}


def test_driver_override_unbind_probe_rebinds_to_vfio(desktop: SimHost) -> None:
    dev = f"{D}/{GPU}"
    res = desktop.apply([Op.write(f"{dev}/driver_override", "vfio-pci\n"),
                         Op.write("/sys/bus/pci/drivers/nvidia/unbind", GPU),
                         Op.write("/sys/bus/pci/drivers_probe", GPU)],
                        reads_after=[f"{dev}/driver", f"{dev}/driver_override", "/sys/bus/pci/drivers/vfio-pci/*"])
    assert res.ok
    assert res.after.link_name(f"{dev}/driver") == "vfio-pci"
    assert res.after.text(f"{dev}/driver_override") == "vfio-pci"
    assert res.after.link(f"/sys/bus/pci/drivers/vfio-pci/{GPU}") == (
        "../../../../devices/pci0000:00/0000:00:01.0/" + GPU)
    # clearing the override does not rebind; unbind + probe returns the native driver
    assert desktop.apply([Op.write(f"{dev}/driver_override", "\n"),
                          Op.write("/sys/bus/pci/drivers/vfio-pci/unbind", GPU),
                          Op.write("/sys/bus/pci/drivers_probe", GPU)]).ok
    snap = desktop.read([f"{dev}/driver", f"{dev}/driver_override"])
    assert snap.link_name(f"{dev}/driver") == "nvidia"
    assert snap.text(f"{dev}/driver_override") == "(null)"


def test_bind_unbind_errnos(desktop: SimHost) -> None:
    assert write(desktop, "/sys/bus/pci/drivers/vfio-pci/bind", GPU) == errno.ENODEV      # no match, no override
    assert write(desktop, "/sys/bus/pci/drivers/vfio-pci/unbind", GPU) == errno.ENODEV    # not bound to it
    assert write(desktop, "/sys/bus/pci/drivers/nvidia/bind", GPU) == errno.EBUSY         # already bound
    assert write(desktop, "/sys/bus/pci/drivers/nvidia/bind", "0000:99:00.0") == errno.ENODEV
    assert write(desktop, "/sys/bus/pci/drivers_probe", "0000:99:00.0") == errno.ENODEV
    assert write(desktop, "/sys/bus/pci/drivers/nosuchdriver/bind", GPU) == errno.ENOENT
    assert write(desktop, f"{D}/{GPU}/driver_override", "x" * 4095) == errno.EINVAL
    assert write(desktop, "/sys/bus/pci/drivers/vfio-pci/new_id", "zz") == errno.EINVAL


def test_new_id_attaches_matching_unbound_devices(desktop: SimHost) -> None:
    audio = "0000:01:00.1"
    assert desktop.apply([Op.write("/sys/bus/pci/drivers/snd_hda_intel/unbind", audio),
                          Op.write("/sys/bus/pci/drivers/vfio-pci/new_id", "10de 1aef")]).ok
    assert desktop.read([f"{D}/{audio}/driver"]).link_name(f"{D}/{audio}/driver") == "vfio-pci"
    assert write(desktop, "/sys/bus/pci/drivers/vfio-pci/remove_id", "10de 1aef") is None
    assert write(desktop, "/sys/bus/pci/drivers/vfio-pci/remove_id", "10de 1aef") == errno.ENODEV


def test_sriov_numvfs_semantics(desktop: SimHost) -> None:
    pf = f"{D}/{NIC}"
    assert write(desktop, f"{pf}/sriov_numvfs", "abc") == errno.EINVAL
    assert write(desktop, f"{pf}/sriov_numvfs", "8") == errno.ERANGE         # > sriov_totalvfs (7)
    assert write(desktop, f"{pf}/sriov_numvfs", "70000") == errno.ERANGE     # kstrtou16 overflow
    assert write(desktop, f"{pf}/sriov_numvfs", "4\n") is None
    assert write(desktop, f"{pf}/sriov_numvfs", "4") is None                 # same value: no-op
    assert write(desktop, f"{pf}/sriov_numvfs", "2") == errno.EBUSY          # nonzero -> nonzero
    snap = desktop.read([f"{pf}/virtfn*", f"{pf}/sriov_*", f"{D}/*/physfn", f"{D}/*/iommu_group", f"{D}/*/driver",
                         f"{D}/*/device"])
    assert snap.text(f"{pf}/sriov_numvfs") == "4"
    assert snap.text(f"{pf}/sriov_vf_device") == "1520"
    vfs = {p.rsplit("/", 1)[1]: snap.link(p) for p in snap.glob(f"{pf}/virtfn*")}
    assert vfs == {"virtfn0": "../0000:05:10.0", "virtfn1": "../0000:05:10.4", "virtfn2": "../0000:05:11.0",
                   "virtfn3": "../0000:05:11.4"}
    vf = f"{D}/0000:05:10.4"
    assert snap.link(f"{vf}/physfn") == f"../{NIC}"
    assert snap.text(f"{vf}/device") == "0x1520"
    assert snap.link_name(f"{vf}/driver") == "igbvf"
    groups = {snap.link_name(f"{D}/0000:05:1{i}/iommu_group") for i in ("0.0", "0.4", "1.0", "1.4")}
    assert len(groups) == 4 and "9" not in groups                            # each VF its own group
    assert write(desktop, f"{pf}/sriov_numvfs", "0") is None
    snap = desktop.read([f"{pf}/virtfn*", f"{D}/*/physfn"])
    assert not snap.glob(f"{pf}/virtfn*") and not snap.glob(f"{D}/*/physfn")


def test_sriov_needs_a_pf_driver(desktop: SimHost) -> None:
    assert write(desktop, "/sys/bus/pci/drivers/igb/unbind", NIC) is None
    assert write(desktop, f"{D}/{NIC}/sriov_numvfs", "2") == errno.ENOENT


def test_iommu_off_profile(tmp_path: Path) -> None:
    text = Path(__file__).parents[2].joinpath("vgpuvirt/sim/profiles/t4x2.yaml").read_text()
    f = tmp_path / "noiommu.yaml"
    f.write_text(text.replace("name: t4x2", "name: noiommu\niommu: false"))
    host = SimHost.from_profile(str(f))
    snap = host.read(["/sys/kernel/iommu_groups/*", f"{D}/*/iommu_group", "/sys/class/iommu/*", f"{D}/*/vendor"])
    assert not snap.glob("/sys/kernel/iommu_groups/*")
    assert not snap.glob(f"{D}/*/iommu_group")
    assert not snap.glob("/sys/class/iommu/*")
    assert len(snap.glob(f"{D}/*/vendor")) == 5


def test_numa_cpus_and_topology() -> None:
    host = SimHost.from_profile("t4x2")
    snap = host.read(["/sys/devices/system/node/node*/cpulist", "/sys/devices/system/cpu/online",
                      "/sys/devices/system/cpu/cpu3/topology/*", f"{D}/0000:d8:00.0/local_cpulist"])
    assert snap.text("/sys/devices/system/node/node0/cpulist") == "0-15,32-47"
    assert snap.text("/sys/devices/system/node/node1/cpulist") == "16-31,48-63"
    assert snap.text("/sys/devices/system/cpu/online") == "0-63"
    assert snap.text("/sys/devices/system/cpu/cpu3/topology/thread_siblings_list") == "3,35"
    assert parse_cpulist(snap.text(f"{D}/0000:d8:00.0/local_cpulist") or "") == frozenset(
        list(range(16, 32)) + list(range(48, 64)))
    assert write(host, f"{D}/0000:d8:00.0/numa_node", "7") == errno.EINVAL


def test_hugepages_are_writable(desktop: SimHost) -> None:
    hp = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
    assert write(desktop, hp, "16") is None
    snap = desktop.read([hp, "/sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages"])
    assert snap.text(hp) == "16"
    assert snap.text("/sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages") == "16"
    assert write(desktop, hp, "lots") == errno.EINVAL


def test_reset_method_store(desktop: SimHost) -> None:
    rm = f"{D}/{NIC}/reset_method"
    assert write(desktop, rm, "bogus") == errno.EINVAL
    assert write(desktop, rm, "bus") is None
    assert desktop.read([rm]).text(rm) == "bus"
    assert write(desktop, rm, "default") is None
    assert desktop.read([rm]).text(rm) == "flr bus"
