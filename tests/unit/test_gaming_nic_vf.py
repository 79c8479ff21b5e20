"""Issue 16, gaming: NIC VFs enabled when none is free (a plan step with rollback), the VF nearest the GPU,
vCPUs pinned to the GPU's local CPUs by default, and ``iommu check`` warning on the boot VGA device."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_part

from vgpuvirt.model import PciAddress
from vgpuvirt.provision import NicRequest, VgpuRequest, VmRequest
from vgpuvirt.provision.nic_vf import take_nic_vf
from vgpuvirt.provision.plan import plan
from vgpuvirt.provision.state import host_state
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.iommu.api import check_assignable
from vgpuvirt.sim import SimHost
from vgpuvirt.xml import Domain

ROOT = Path(__file__).resolve().parents[2]
NIC_PF = "0000:05:00.0"


def _need_libvirt() -> None:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require_part("libvirt-python", False, "pip install 'vgpuvirt[libvirt]'")


def _gaming(name: str = "gvm", **kw: object) -> VmRequest:
    kw.setdefault("vcpus", 4)
    return VmRequest(name, gpus=(VgpuRequest(mode="passthrough"),), template="gaming", memory_mib=8192,
                     **kw)  # type: ignore[arg-type]


def test_the_example_with_nic_vf_runs_on_its_default_host():
    _need_libvirt()
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "cloud_gaming.py"), "--nic-vf"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NIC VFs ['0000:05:10.0']" in proc.stdout
    assert "the nearest of 7 free VF(s) to GPU 0000:01:00.0" in proc.stdout
    assert "torn down" in proc.stdout


def test_plan_enables_the_nic_vfs_first_when_none_is_free():
    h = SimHost.from_profile("desktop")
    p = plan([inventory(h)], [_gaming(nic=NicRequest())])
    assert [(x.pf, x.vfs, x.purpose) for x in p.prep] == [(PciAddress.parse(NIC_PF), 7, "nic")]
    assert p.pending == ["gvm"] and not p.steps
    assert "enable 7 SR-IOV VFs on NIC 0000:05:00.0" in p.format()
    # A PF named in the request that cannot serve: the refusal stays, nothing is planned.
    from vgpuvirt.errors import NoCapacity
    with pytest.raises(NoCapacity, match="no free SR-IOV NIC VF"):
        plan([inventory(h)], [_gaming(nic=NicRequest(pf=PciAddress.parse("0000:03:00.0")))])


def test_a_failed_run_disables_the_vfs_it_enabled():
    _need_libvirt()
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision import provision

    h = SimHost.from_profile("desktop")
    conn = LibvirtConnection("test:///default")

    def cut(host: str, step: object) -> None:
        raise RuntimeError("cut after the first step")

    from vgpuvirt.errors import ProvisioningError
    with pytest.raises(ProvisioningError, match="cut") as ei:
        provision(h, conn, [_gaming("w16vm-nicfail", nic=NicRequest(), start=False)], progress=cut)
    assert "sim:desktop: set 0 SR-IOV VFs on 0000:05:00.0 again" in ei.value.rollback
    pf = next(d for d in inventory(h).pci_devices if str(d.address) == NIC_PF)
    assert pf.sriov_numvfs == 0 and not pf.virtfns
    assert not conn.exists("w16vm-nicfail")
    conn.close()


PROFILE = """
name: nic-numa
description: a GPU behind a PCIe switch on node 1, NICs on node 0, node 1 and behind the same switch
cpus: {sockets: 2, cores_per_socket: 4, threads_per_core: 1, memory_mib_per_node: 65536,
       hugepages_per_node: {2048: 4096}}   # 8 GiB per node: the gaming VM passes the pre-flight
drivers: [vfio-pci]
devices:
  - {address: "0000:00:00.0", vendor: 0x8086, device: 0x2020, class: 0x060000, numa_node: 0, iommu_group: 0}
  - {address: "0000:00:01.0", vendor: 0x8086, device: 0x2030, class: 0x060400, driver: pcieport, numa_node: 0,
     iommu_group: 1}
  - {address: "0000:01:00.0", parent: "0000:00:01.0", vendor: 0x8086, device: 0x1521, class: 0x020000, driver: igb,
     numa_node: 0, iommu_group: 2, reset_method: flr,
     sriov: {totalvfs: 2, numvfs: 2, offset: 128, stride: 4, vf_device: 0x1520, vf_driver: igbvf}}
  - {address: "0000:80:01.0", vendor: 0x8086, device: 0x2030, class: 0x060400, driver: pcieport, numa_node: 1,
     iommu_group: 10}
  - {address: "0000:81:00.0", parent: "0000:80:01.0", vendor: 0x10b5, device: 0x8724, class: 0x060400,
     driver: pcieport, numa_node: 1, iommu_group: 11}
  - {address: "0000:82:00.0", parent: "0000:81:00.0", vendor: 0x10b5, device: 0x8724, class: 0x060400,
     driver: pcieport, numa_node: 1, iommu_group: 12}
  - {address: "0000:82:01.0", parent: "0000:81:00.0", vendor: 0x10b5, device: 0x8724, class: 0x060400,
     driver: pcieport, numa_node: 1, iommu_group: 13}
  - {address: "0000:83:00.0", parent: "0000:82:00.0", vendor: 0x10de, device: 0x24b0, class: 0x030000,
     driver: nvidia, numa_node: 1, iommu_group: 14, reset_method: bus}
  - {address: "0000:84:00.0", parent: "0000:82:01.0", vendor: 0x8086, device: 0x1521, class: 0x020000, driver: igb,
     numa_node: 1, iommu_group: 15, reset_method: flr,
     sriov: {totalvfs: 2, numvfs: 2, offset: 128, stride: 4, vf_device: 0x1520, vf_driver: igbvf}}
  - {address: "0000:80:02.0", vendor: 0x8086, device: 0x2030, class: 0x060400, driver: pcieport, numa_node: 1,
     iommu_group: 16}
  - {address: "0000:85:00.0", parent: "0000:80:02.0", vendor: 0x8086, device: 0x1521, class: 0x020000, driver: igb,
     numa_node: 1, iommu_group: 17, reset_method: flr,
     sriov: {totalvfs: 2, numvfs: 2, offset: 128, stride: 4, vf_device: 0x1520, vf_driver: igbvf}}
"""


def test_the_vf_nearest_the_gpu_is_taken_first(tmp_path):
    (tmp_path / "nic-numa.yaml").write_text(PROFILE)
    inv = inventory(SimHost.from_profile(tmp_path / "nic-numa.yaml"))
    hs = host_state(inv)
    gpu = PciAddress.parse("0000:83:00.0")
    vm = _gaming(nic=NicRequest())
    picks = [take_nic_vf(vm, hs, gpu) for _ in range(6)]
    pfs = [str(c.pf) for c in picks]
    # Behind the same switch first, then the same NUMA node on another branch, then the other node.
    assert pfs == ["0000:84:00.0"] * 2 + ["0000:85:00.0"] * 2 + ["0000:01:00.0"] * 2
    assert "behind the same PCIe switch/bridge 0000:81:00.0" in picks[0].reason
    assert "same NUMA node 1, on another PCIe branch" in picks[2].reason
    assert "NUMA node 0 (the GPU is on node 1)" in picks[4].reason
    # And the plan uses it: the gaming VM's interface is the switch-local VF, its vCPUs on node 1's CPUs.
    p = plan([inv], [vm])
    xml = next(s for s in p.steps if s.kind == "define").xml  # type: ignore[attr-defined]
    dom = Domain.from_xml(xml)
    assert [str(a) for a in dom.gpu_devices().interfaces] == [str(picks[0].vf)]
    node1 = set(range(4, 8))
    assert dom.cpu_pinning() is not None and set(dom.cpu_pinning().vcpu_cpus) <= node1  # type: ignore[union-attr]


def test_gaming_vcpus_are_pinned_to_the_gpus_local_cpus_by_default_with_an_opt_out():
    inv = inventory(SimHost.from_profile("desktop"))

    def pinning(vm: VmRequest) -> tuple[int, ...] | None:
        xml = next(s for s in plan([inv], [vm]).steps if s.kind == "define").xml  # type: ignore[attr-defined]
        pins = Domain.from_xml(xml).cpu_pinning()
        return pins.vcpu_cpus if pins is not None else None

    # desktop: 8 cores, CPU n and n+8 are one core's two threads. Whole cores (issue 28 item 9): 1+9 and 2+10,
    # the host's core (0+8) left out and given the emulator threads; the guest is told 2 cores x 2 threads.
    assert pinning(_gaming()) == (1, 9, 2, 10)
    p = plan([inv], [_gaming()])
    dom = Domain.from_xml(next(s for s in p.steps if s.kind == "define").xml)  # type: ignore[attr-defined]
    assert dom.cpu_pinning().emulator_cpus == {0, 8}  # type: ignore[union-attr]
    assert dom.root.find("cpu/topology").attrib == {"sockets": "1", "dies": "1", "cores": "2", "threads": "2"}
    assert any("2 whole core(s) with their SMT siblings (2 threads each)" in c.reason
               and "emulator threads on the host's core 0,8" in c.reason for c in p.explain)
    assert pinning(_gaming(pin_cpus=False)) is None
    assert pinning(_gaming(host_cpus="8-11")) == (8, 9, 10, 11)
    # Not the gaming template: no pinning unless asked.
    assert pinning(VmRequest("v", gpus=(VgpuRequest(mode="passthrough"),), template="compute")) is None
    # More vCPUs than the GPU has local CPUs: left unpinned, and the explanation says why.
    p = plan([inv], [_gaming(vcpus=20)])
    assert any("vCPUs not pinned" in c.reason for c in p.explain)


def test_iommu_check_warns_on_the_boot_vga_device():
    h = SimHost.from_profile("desktop")
    rep = check_assignable(h, ["0000:00:02.0"])
    assert rep.assignable
    assert any("boot VGA device (boot_vga=1)" in w for w in rep.warnings)
    assert not any("boot VGA" in w for w in check_assignable(h, ["0000:01:00.0"]).warnings)


def test_a_vgpu_board_and_a_nic_both_with_sriov_off_are_enabled_in_turn(tmp_path):
    _need_libvirt()
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision import provision, teardown

    a10 = (ROOT / "vgpuvirt" / "sim" / "profiles" / "a10-sriov.yaml").read_text()
    nic = """
  - {address: "0000:40:05.0", vendor: 0x1022, device: 0x1483, class: 0x060400, driver: pcieport, iommu_group: 50}
  - {address: "0000:42:00.0", parent: "0000:40:05.0", vendor: 0x8086, device: 0x1521, class: 0x020000, driver: igb,
     iommu_group: 51, reset_method: flr,
     sriov: {totalvfs: 4, numvfs: 0, offset: 128, stride: 4, vf_device: 0x1520, vf_driver: igbvf}}
"""
    (tmp_path / "a10-nic.yaml").write_text(a10.replace("name: a10-sriov", "name: a10-nic") + nic)
    h = SimHost.from_profile(tmp_path / "a10-nic.yaml")
    conn = LibvirtConnection("test:///default")
    vm = VmRequest("w16vm-a10nic", gpus=(VgpuRequest.parse("fb>=2G"),), nic=NicRequest(), start=False)
    r = provision(h, conn, [vm])
    devs = Domain.from_xml(conn.xml(vm.name)).gpu_devices()
    assert len(devs.mdev_uuids) == 1 and [str(a.physfn) for a in inventory(h).pci_devices
                                          if a.address in devs.interfaces] == ["0000:42:00.0"]
    assert r.plan.assignments[0].kind == "mdev"
    assert teardown(h, conn, [vm.name]).ok
    conn.close()


def _pinned_domain(name: str, cpus: tuple[int, ...]) -> str:
    pins = "".join(f"<vcpupin vcpu='{i}' cpuset='{c}'/>" for i, c in enumerate(cpus))
    return (f"<domain type='kvm'><name>{name}</name><memory>1048576</memory><vcpu>{len(cpus)}</vcpu>"
            f"<cputune>{pins}</cputune><os><type arch='x86_64'>hvm</type></os></domain>")


def test_gaming_vms_do_not_share_pinned_cpus():
    from vgpuvirt.provision.cpu_pinning import PinLedger

    host = SimHost.from_profile("desktop")

    def pinning(domains: list[tuple[str, str]]) -> tuple[int, ...] | None:
        p = plan([inventory(host)], [_gaming()], domains={host.name: domains})
        xml = next(s for s in p.steps if s.kind == "define").xml  # type: ignore[attr-defined]
        pins = Domain.from_xml(xml).cpu_pinning()
        return pins.vcpu_cpus if pins is not None else None

    # Another VM holds CPUs 1 and 2 (the first threads of cores 1+9 and 2+10): this one takes the next two
    # whole cores, never the siblings 9 and 10 (issue 28 item 9: they were left to others).
    assert pinning([("other", _pinned_domain("other", (1, 2)))]) == (3, 11, 4, 12)
    # A rerun: the VM's own domain does not count against it, so it keeps its CPUs.
    rerun = PinLedger({"h": {"gvm": _pinned_domain("gvm", (1, 2, 3, 5)), "x": _pinned_domain("x", (4,))}})
    assert rerun.choose("h", _gaming(), "0-7")[0].vcpu_cpus == (1, 2, 3, 5)  # type: ignore[union-attr]
    # Within one plan: the second VM near the same GPU node gets the CPUs the first did not take, the host's
    # CPU 0 last.
    ledger = PinLedger({"h": {}})
    a = ledger.choose("h", _gaming("a"), "0-7")
    b = ledger.choose("h", _gaming("b"), "0-7")
    c = ledger.choose("h", _gaming("c"), "0-7")
    assert (a[0].vcpu_cpus, b[0].vcpu_cpus, c[0]) == ((1, 2, 3, 4), (5, 6, 7, 0), None)  # type: ignore[union-attr]
    assert "4 of them pinned by other VMs" not in c[1] and "8 of them pinned by other VMs" in c[1]


def test_an_odd_vcpu_count_keeps_its_cores_idle_sibling_from_others():
    from vgpuvirt.provision.cpu_pinning import PinLedger

    siblings = {c: frozenset({c % 4, c % 4 + 4}) for c in range(8)}        # 4 cores: n and n+4
    ledger = PinLedger({"h": {}}, {"h": siblings})
    a, _ = ledger.choose("h", _gaming("a", vcpus=3), "0-7")
    b, _ = ledger.choose("h", _gaming("b", vcpus=2), "0-7")
    assert a is not None and a.vcpu_cpus == (1, 5, 2) and a.emulator_cpus == {0, 4}
    # 6 (core 2's other thread) stays with a: b takes core 3 whole
    assert b is not None and b.vcpu_cpus == (3, 7)
    # the host's core is the last one given out
    c, _ = ledger.choose("h", _gaming("c", vcpus=2), "0-7")
    assert c is not None and c.vcpu_cpus == (0, 4)
