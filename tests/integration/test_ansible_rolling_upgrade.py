"""The rolling vGPU manager upgrade (examples/ansible/rolling_upgrade.yml) run by real ansible-playbook over the
testbed's sshd against three simulated GPU hosts, each with a libvirtd of its own, and VMs that live-migrate for
real (issue 24 item 4).

Why these parts: a live migration needs a libvirtd per host (libvirt's test driver cannot migrate, and two "hosts"
on the one testbed libvirtd are "the same host" to libvirt), so each fleet host pairs a FUSE-mounted simulated
T4 host (its GPUs, vGPUs, cordon mark and vGPU manager version; the modules reach it as ``sysfs_root`` through the
sshd) with a migration testbed host's libvirtd (``scripts/testbed.sh mig-up``: own mount namespace, host UUID and
migration address), where tiny TCG VMs run and move peer-to-peer. A real QEMU cannot hold a simulated vGPU, so each
VM carries its vGPU as an ownership record, which each drain reserves on the destination and frees on the source.
Hosts m5..m7 are this test's own: the migration tests (m1..m4) drain their hosts, which would move our VMs too.

What it proves: check mode plans every host's drain and changes nothing; each host is drained in turn (serial: 1)
while the others take its VMs, including onto hosts already upgraded (a newer vGPU manager), upgraded (a simulated
package change and reboot), checked and uncordoned; afterwards every VM runs, none was ever stopped (libvirt's
state reason on its last host is "migrated", which a VM shut down and started again would not have), every host
reports the new driver version and is uncordoned, and each VM's vGPU is on the host it runs on, nowhere else; a
rerun changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lxml import etree
from test_ansible_fleet import REPO, Ansible, repo_python, require_fleet_parts  # type: ignore[import-not-found]

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.host.local import LocalHost
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevTypeId, PciAddress
from vgpuvirt.services.cordon import read_cordon
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.xml.provenance import Provenance

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAYBOOK = REPO / "examples" / "ansible" / "rolling_upgrade.yml"
T4 = PciAddress.parse("0000:3b:00.0")
T4_2Q = MdevTypeId.parse("nvidia-231")
NEW_DRIVER = "550.127.05"                 # newer than the t4x2 profile's 550.90.05
VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_MIGRATED = 1, 2
STALE = re.compile(r"roll[0-9a-f]{6}-h\d+-")      # this test's VM names (roll{tag}-h{i}-...), of any run


@dataclass
class RollHost:
    name: str
    mount: str
    pid_file: str
    libvirt_uri: str

    def gpu(self) -> LocalHost:
        return LocalHost(self.mount, name=self.name)


def tiny_vm(name: str, host: str, mdev: str) -> str:
    """A VM with no disk (SeaBIOS idles, TCG) whose ownership record holds a T4-2Q vGPU on ``host``."""
    prov = Provenance.of(host, [{"kind": "mdev", "uuid": mdev, "parent": str(T4), "type": str(T4_2Q)}])
    return (f"<domain type='qemu'><name>{name}</name><uuid>{uuid.uuid4()}</uuid>"
            f"<metadata>{etree.tostring(prov.to_element(), encoding='unicode')}</metadata>"
            "<memory unit='MiB'>96</memory><vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os>"
            "<on_crash>destroy</on_crash><devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>")


@pytest.fixture
def fleet(testbed: Any, tmp_path: Path) -> Iterator[list[RollHost]]:
    from vgpuvirt.sim import fuse

    require_fleet_parts()
    mig = testbed.migration_hosts(7)[4:]
    tag = uuid.uuid4().hex[:6]
    for m in mig:
        # VMs an interrupted run of this test left on its own hosts: a drain would move them too, and reserve
        # their vGPUs on the destinations (seen: two extra mdevs on h1 after a killed run had left three VMs)
        with LibvirtConnection(m.libvirt_uri) as c:
            for d in c.domains():
                if STALE.match(d.name):
                    c.destroy(d.name)
                    c.undefine(d.name)
    hosts: list[RollHost] = []
    try:
        for i, m in enumerate(mig, start=1):
            mp = Path(testbed.mnt_dir) / f"roll-{tag}-h{i}"
            mp.mkdir()
            pid_file = str(Path(testbed.mnt_dir) / f".roll-{tag}-h{i}.pid")
            fuse.start("t4x2", str(mp), pid_file=pid_file)
            hosts.append(RollHost(f"roll{tag}-h{i}", str(mp), pid_file, m.libvirt_uri))
        yield hosts
    finally:
        for h in hosts:
            with LibvirtConnection(h.libvirt_uri) as c:
                for d in c.domains():
                    if d.name.startswith(f"roll{tag}-"):
                        c.destroy(d.name)
                        if c.exists(d.name):
                            c.undefine(d.name)
            fuse.stop(h.mount, pid_file=h.pid_file)
            os.rmdir(h.mount)


def start_vm(h: RollHost, name: str) -> None:
    u = mdev_uuid_for(name, 0)
    with h.gpu() as gpu:
        assert all(o.ok for o in apply_items(gpu, [CreateMdev(h.name, name, u, T4, T4_2Q).item(5.0)]))
    with LibvirtConnection(h.libvirt_uri) as c:
        c.raw.defineXML(tiny_vm(name, h.name, str(u))).create()


def inventory_file(path: Path, hosts: list[RollHost], testbed: Any) -> None:
    inv = {"hypervisors": {
        "hosts": {h.name: {"ansible_host": testbed.ssh_host, "ansible_port": testbed.ssh_port,
                           "vgpu_sysfs_root": h.mount, "vgpu_host_name": h.name, "vgpu_sim_pid_file": h.pid_file,
                           # each host's libvirtd is a migration host's, reached (by the target and by the other
                           # hosts' libvirtds alike) through that host's sshd; its GPUs are a tree on the target
                           "vgpu_uri": h.libvirt_uri, "vgpu_peer_uri": h.libvirt_uri, "vgpu_drain_host": "local"}
                  for h in hosts},
        "vars": {"ansible_user": "root", "ansible_connection": "ssh",
                 "ansible_ssh_private_key_file": testbed.identity,
                 "ansible_ssh_common_args": f"-o UserKnownHostsFile={testbed.known_hosts} -o StrictHostKeyChecking=yes "
                                            "-o BatchMode=yes -o GlobalKnownHostsFile=/dev/null",
                 "ansible_python_interpreter": str(repo_python(path.parent))},
    }}
    path.write_text(json.dumps({"all": {"children": inv}}, indent=1))


@pytest.mark.waits
def test_rolling_upgrade_moves_every_vm_live_and_upgrades_every_host(fleet: list[RollHost], testbed: Any,
                                                                      tmp_path: Path) -> None:
    h1, h2, h3 = fleet
    vms = [f"{h1.name}-a", f"{h1.name}-b", f"{h2.name}-c"]      # names start with the test's tag (cleanup)
    for h, vm in ((h1, vms[0]), (h1, vms[1]), (h2, vms[2])):
        start_vm(h, vm)
    old = {inventory(h.gpu(), use_nvml=False).nvidia_driver_version for h in fleet}
    assert old == {"550.90.05"}
    inv = tmp_path / "inventory.json"
    inventory_file(inv, fleet, testbed)
    ans = Ansible(tmp_path, inv)
    start = placement(fleet, vms)

    # check mode: each host's drain is planned and reported, nothing is cordoned, moved or upgraded
    dry = ans.playbook(PLAYBOOK, "--check", "--diff", extra={"vgpu_driver_version": NEW_DRIVER})
    assert dry.rc == 0, dry.explain()
    assert all(r.changed >= 1 and r.failed == 0 for r in dry.recap.values()) and len(dry.recap) == 3, dry.explain()
    assert placement(fleet, vms) == start
    for h in fleet:
        with h.gpu() as gpu:
            assert read_cordon(gpu) is None and inventory(gpu, use_nvml=False).nvidia_driver_version == "550.90.05"

    run = ans.playbook(PLAYBOOK, extra={"vgpu_driver_version": NEW_DRIVER})
    assert run.rc == 0, run.explain()
    assert all(r.failed == 0 and r.unreachable == 0 for r in run.recap.values()) and len(run.recap) == 3, run.explain()

    where: dict[str, str] = {}
    for h in fleet:
        with LibvirtConnection(h.libvirt_uri) as c:
            for vm in vms:
                if c.exists(vm):
                    assert vm not in where, f"{vm} defined on {where[vm]} and {h.name}"
                    where[vm] = h.name
                    dom = c.raw.lookupByName(vm)
                    state, reason = dom.state()
                    # running, and running because it migrated here: never shut down and booted again
                    assert (state, reason) == (VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_MIGRATED), (vm, h.name)
                    assert dom.isPersistent()
    assert sorted(where) == sorted(vms), where
    # h3 was drained last: its VMs went to h1 and h2 (already upgraded), so nothing is left on it
    assert h3.name not in where.values()
    for h in fleet:
        with h.gpu() as gpu:
            inv_h = inventory(gpu, use_nvml=False)
            assert inv_h.nvidia_driver_version == NEW_DRIVER, h.name
            assert read_cordon(gpu) is None, h.name                       # back in service
            mine = {str(mdev_uuid_for(vm, 0)) for vm, on in where.items() if on == h.name}
            assert {str(m.uuid) for m in inv_h.mdevs} == mine, h.name     # each vGPU where its VM runs, only there
    # every host's turn drained it; no VM was shut down
    assert run.stdout.count("TASK [Drain - cordon the host and live-migrate its VMs to the others]") == 3
    assert "shut-down" not in run.stdout

    # a rerun: every host runs the version already, so nothing changes and no VM moves
    again = ans.playbook(PLAYBOOK, extra={"vgpu_driver_version": NEW_DRIVER})
    assert again.rc == 0, again.explain()
    assert all(r.changed == 0 and r.failed == 0 for r in again.recap.values()), again.explain()
    assert placement(fleet, vms) == where


def placement(fleet: list[RollHost], vms: list[str]) -> dict[str, str]:
    """VM -> the host whose libvirtd holds it."""
    out: dict[str, str] = {}
    for h in fleet:
        with LibvirtConnection(h.libvirt_uri) as c:
            out.update({vm: h.name for vm in vms if c.exists(vm)})
    return out
