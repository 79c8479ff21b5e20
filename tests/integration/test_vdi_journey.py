"""The VDI admin's journey (issue 28), on two testbed hosts (sshd on 127.0.2.1 and 127.0.2.2, each over its own
FUSE-mounted simulated 2 x T4) and the real libvirtd, reached the default way: qemu+ssh:// through each
host's sshd. 20 desktops as linked clones of a golden image, grown to 30, a reboot of one host in the middle,
shrunk to 20: every desktop comes back with its own vGPU and no vGPU is left that no desktop names.

The reboot: the layout exported while the pool is up, applied after the reboot (the documented tool), used to
make its own UUIDs (orphans filled the T4s, the desktops' vGPUs stayed missing) while `layout assert` said ok.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]
from conftest import Testbed, require_part  # type: ignore[import-not-found]

from vgpuvirt.errors import LibvirtError
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.libvirt_uri import default_uri
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import fuse
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.storage import StoragePool

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("libvirt")
REPO = Path(__file__).resolve().parents[2]
RUN = "w28j" + uuid.uuid4().hex[:5]
# the testbed's libvirtd has no network, and starting needs VFIO: desktops without a NIC, defined, not started
NO_NIC: dict[str, object] = {"virtio_nics": [], "hyperv": False, "disable_arch_capabilities": True}


@pytest.fixture
def two_hosts(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[dict[str, SSHHost], dict[str, LibvirtConnection],
                                                                 dict[str, str], str]]:
    """Two hosts with their mounts, their libvirt over qemu+ssh://, and a pool holding a golden image."""
    require_part("qemu-img", shutil.which("qemu-img") is not None, "apt-get install qemu-utils")
    ends = testbed.extra_hosts(2)
    local = LibvirtConnection(testbed.libvirt_uri)
    try:
        local.domains()
    except LibvirtError as exc:
        require_part("libvirtd", False, str(exc))
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(pool_dir / "golden.qcow2"), "16M"], check=True)
    local.define_pool(StoragePool(RUN, target=str(pool_dir)))
    with sim_mount(ends[0].mnt_dir, "t4x2") as m1, sim_mount(ends[1].mnt_dir, "t4x2") as m2:
        hosts = {}
        mounts = {}
        for e, m in zip(ends, (m1, m2), strict=True):
            h = e.ssh(sysfs_root=m)
            hosts[h.name] = h
            mounts[h.name] = m
        conns = {n: LibvirtConnection(default_uri(h)) for n, h in hosts.items()}
        try:
            yield hosts, conns, mounts, str(pool_dir / "golden.qcow2")
        finally:
            teardown(hosts, conns, patterns=[RUN + "-*"], remove_storage=True)
            for c in conns.values():
                c.close()
            local.remove_pool(RUN)
            local.close()


def _desktops(n: int, golden: str) -> list[VmRequest]:
    return VmRequest.pool(RUN, n, gpu=VgpuRequest(type="nvidia-231"), start=False, memory_mib=128, vcpus=1,
                          disk=ClonedDisk(RUN, golden), options=NO_NIC)


def _state(hosts: dict[str, SSHHost], conns: dict[str, LibvirtConnection]) -> tuple[dict[str, set[str]],
                                                                                   dict[str, set[str]]]:
    """Per host: the mdevs it holds, and the mdevs its desktops' vgpuvirt metadata names."""
    held = {n: {str(m.uuid) for m in inventory(h).mdevs} for n, h in hosts.items()}
    named: dict[str, set[str]] = {n: set() for n in hosts}
    for n, c in conns.items():
        for name, xml in c.domain_xml_pairs():
            prov = Provenance.read(xml) if name.startswith(RUN) else None
            if prov is not None and prov.host == n:
                named[n] |= {g["uuid"] for g in prov.gpus if g.get("kind") == "mdev"}
    return held, named


def _cli(testbed: Testbed, host: SSHHost, mount: str, *argv: str) -> subprocess.CompletedProcess[str]:
    spec = f"ssh://{testbed.ssh_user}@{host.hostname}:{host.port}"
    return subprocess.run([sys.executable, "-m", "vgpuvirt", "--host", spec, "--sysfs-root", mount, "--identity",
                           testbed.identity, "--known-hosts", testbed.known_hosts, *argv], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def test_twenty_thirty_reboot_twenty_every_desktop_keeps_its_own_vgpu(testbed: Testbed, two_hosts: Any,
                                                                      tmp_path: Path) -> None:
    hosts, conns, mounts, golden = two_hosts
    first = next(iter(hosts))

    provision(hosts, conns, _desktops(20, golden), policy="spread")
    held, named = _state(hosts, conns)
    assert sum(len(v) for v in named.values()) == 20 and held == named

    provision(hosts, conns, _desktops(30, golden), policy="spread")
    held, named = _state(hosts, conns)
    assert sum(len(v) for v in named.values()) == 30 and held == named
    assert all(len(v) == 15 for v in named.values())

    # the admin keeps the host's layout, as the docs say, then the host reboots
    exported = _cli(testbed, hosts[first], mounts[first], "layout", "export")
    assert exported.returncode == 0, exported.stderr
    layout = tmp_path / "pool.yaml"
    layout.write_text(exported.stdout)
    fuse.reboot(mounts[first], pid_file=mounts[first] + ".pid")
    held, named = _state(hosts, conns)
    assert held[first] == set() and len(named[first]) == 15

    # assert names every desktop whose vGPU is missing; apply makes each one again with its UUID
    check = _cli(testbed, hosts[first], mounts[first], "layout", "assert", str(layout))
    assert check.returncode == 1, check
    assert check.stdout.count("which is not on the host") == 15, check.stdout
    applied = _cli(testbed, hosts[first], mounts[first], "layout", "apply", str(layout))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    held, named = _state(hosts, conns)
    assert held == named                                 # each desktop's own vGPU, and no orphan
    check = _cli(testbed, hosts[first], mounts[first], "layout", "assert", str(layout))
    assert check.returncode == 0, check.stdout + check.stderr
    rerun = provision(hosts, conns, _desktops(30, golden), policy="spread")
    assert rerun.plan.steps == []                        # nothing left to do

    # back to 20: the last 10 desktops go, with their clones and vGPUs
    gone = [vm.name for vm in _desktops(30, golden)[20:]]
    teardown(hosts, conns, gone, remove_storage=True)
    held, named = _state(hosts, conns)
    assert sum(len(v) for v in named.values()) == 20 and held == named
    vols = sorted(p.name for p in Path(golden).parent.iterdir())
    assert vols == sorted(["golden.qcow2", *(f"{vm.name}.qcow2" for vm in _desktops(20, golden))])
    for n in hosts:
        orphans = _cli(testbed, hosts[n], mounts[n], "gc", "--connect", conns[n].uri, "--json")
        assert orphans.returncode == 0, orphans.stderr
        assert json.loads(orphans.stdout)["orphans"] == [], orphans.stdout
