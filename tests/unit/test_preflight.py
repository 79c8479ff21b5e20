"""Pre-flight at plan time (simulator + libvirt's test driver): a VM whose host lacks its network, storage pool,
golden image, firmware, hugepages or pinned CPUs is refused in the plan, with the reason, and nothing changes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from provision_fixtures import drop_test_domains

from vgpuvirt.errors import PreflightFailed
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.libvirt_storage import LibvirtFacts, PoolFacts
from vgpuvirt.provision import VgpuRequest, VmRequest, plan, provision
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.xml.storage import FirmwareCaps

pytest.importorskip("libvirt")
Q2 = VgpuRequest(type="nvidia-231")
HEADLESS = VgpuRequest(type="nvidia-231", display=False)
HP2M = "/sys/devices/system/node/node{}/hugepages/hugepages-2048kB/nr_hugepages"


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    c = LibvirtConnection("test:///default")
    yield c
    drop_test_domains(c)


def _refused(host: SimHost, conn: LibvirtConnection, vms: list[VmRequest]) -> str:
    """Provision must refuse at plan time and leave the host and libvirt as they were."""
    mdevs = {m.uuid for m in inventory(host).mdevs}
    doms = {d.name for d in conn.domains()}
    with pytest.raises(PreflightFailed) as ei:
        provision(host, conn, vms)
    assert {m.uuid for m in inventory(host).mdevs} == mdevs and {d.name for d in conn.domains()} == doms
    assert str(ei.value).startswith("pre-flight refused the plan, nothing was changed: ")
    return str(ei.value)


def _name() -> str:
    return "pf" + uuid.uuid4().hex[:6]


def test_a_missing_or_inactive_network_is_refused(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("t4x2")
    vm = VmRequest(_name(), gpus=(Q2,), options={"virtio_nics": [{"kind": "network", "source": "lan42"}]})
    msg = _refused(host, conn, [vm])
    assert f"sim:t4x2: {vm.name}: libvirt network 'lan42' does not exist (networks: default; " in msg
    conn.raw.networkLookupByName("default").destroy()
    try:
        msg = _refused(host, conn, [VmRequest(_name(), gpus=(Q2,))])     # the vdi template's 'default'
        assert "libvirt network 'default' is not active (virsh net-start default)" in msg
    finally:
        conn.raw.networkLookupByName("default").create()
    provision(host, conn, [VmRequest(_name(), gpus=(Q2,), start=False)])    # active again: accepted


def test_a_missing_pool_or_golden_image_is_refused(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("t4x2")
    msg = _refused(host, conn, [VmRequest(_name(), gpus=(Q2,), disk=ClonedDisk("vdi", "/srv/golden.qcow2"))])
    assert "storage pool 'vdi' does not exist (pools: default-pool)" in msg
    assert "golden image /srv/golden.qcow2 is not a volume of any active storage pool" in msg
    msg = _refused(host, conn, [VmRequest(_name(), gpus=(Q2,), disk="/default-pool/{name}.qcow2")])
    assert "does not exist (it is not a volume of pool 'default-pool'" in msg


def test_firmware_libvirt_cannot_give_is_refused() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    nets = {"default": True}
    no_efi = LibvirtFacts(nets, {}, FirmwareCaps(frozenset(), frozenset({"/usr/share/OVMF/OVMF_CODE_4M.fd"})))
    with pytest.raises(PreflightFailed, match="firmware 'efi' cannot be selected by libvirt here"):
        plan([inv], [VmRequest("fw", gpus=(Q2,))], libvirt={inv.host: no_efi})
    efi = LibvirtFacts(nets, {"p": PoolFacts("p", True, "/p", {})}, FirmwareCaps(frozenset({"efi"}), frozenset()))
    assert plan([inv], [VmRequest("fw", gpus=(Q2,))], libvirt={inv.host: efi}).steps


def test_hugepages_are_counted_against_every_vm_planned(conn: LibvirtConnection) -> None:
    t4 = SimHost.from_profile("t4x2")                      # no hugepages reserved
    msg = _refused(t4, conn, [VmRequest(_name(), gpus=(HEADLESS,), template="gaming", memory_mib=2048)])
    assert "needs 1024 free hugepages of 2 MiB on the host; 0 free" in msg
    desk = SimHost.from_profile("desktop")                 # 8192 x 2 MiB on node 0: two 8 GiB VMs fit, not three
    vms = [VmRequest(_name(), gpus=(), template="gaming", memory_mib=8192, start=False) for _ in range(3)]
    msg = _refused(desk, conn, vms)
    assert f"{vms[2].name}: needs 4096 free hugepages of 2 MiB on the host; 8192 free, 8192 of them promised" in msg
    assert vms[0].name not in msg and vms[1].name not in msg
    assert provision(desk, conn, vms[:2]).applied is not None


def test_hugepages_on_the_wrong_numa_node_are_refused(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("t4x2")
    from vgpuvirt.host.base import Op
    assert host.apply([Op.write(HP2M.format(1), "4096")]).ok     # 8 GiB, all on node 1
    vm = VmRequest(_name(), gpus=(HEADLESS,), template="compute", memory_mib=2048, numa_node=0, numa_strict=True,
                   options={"hugepages": True})
    msg = _refused(host, conn, [vm])
    assert "needs 1024 free hugepages of 2 MiB on NUMA node 0; 0 free" in msg
    ok = VmRequest(_name(), gpus=(HEADLESS,), template="compute", memory_mib=2048, numa_node=1, numa_strict=True,
                   options={"hugepages": True}, start=False)
    assert provision(host, conn, [ok]).applied is not None


def test_pinning_to_cpus_the_host_lacks_is_refused(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("desktop")                 # CPUs 0-15
    vm = VmRequest(_name(), gpus=(VgpuRequest(mode="passthrough"),), template="gaming", memory_mib=1024, vcpus=4,
                   host_cpus="14-17")
    msg = _refused(host, conn, [vm])
    assert "CPU pinning names CPU(s) 16-17 that this host does not have online (online: 0-15)" in msg


def test_every_problem_is_reported_at_once(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("t4x2")
    vm = VmRequest(_name(), gpus=(HEADLESS,), template="gaming", memory_mib=1024, vcpus=2, host_cpus="70-71",
                   disk=ClonedDisk("nopool", "/g.qcow2"),
                   options={"virtio_nics": [{"kind": "network", "source": "nonet"}]})
    with pytest.raises(PreflightFailed) as ei:
        provision(host, conn, [vm], dry_run=True)
    assert len(ei.value.problems) == 5 and all(p.startswith(f"sim:t4x2: {vm.name}: ") for p in ei.value.problems)
