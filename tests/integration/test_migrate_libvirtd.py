"""Live migration for real: a tiny TCG QEMU VM moves between two testbed libvirtds (scripts/testbed.sh mig-up),
each in its own mount namespace, reached over qemu+ssh; the source's libvirtd talks to the destination's
(peer-to-peer). The GPU side runs on simulated hosts: a real QEMU cannot hold a simulated vGPU, so the VM's
vGPU is an ownership record in its provenance metadata (what teardown reads), which the migration moves with it.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.errors import ProvisioningError
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.provision.mobility import MigrationRefused, Side, migrate
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.sim import SimHost
from vgpuvirt.xml.provenance import Provenance

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
T4 = PciAddress.parse("0000:3b:00.0")
T4_2Q = MdevTypeId.parse("nvidia-231")


def tiny_vm(name: str, memory_mib: int, mdev: MdevUuid | None, sim_host: str) -> str:
    """A VM with no disk (SeaBIOS idles), TCG. ``memory_mib`` sizes how long a migration takes: zero pages
    travel as headers, so at 1 MiB/s 2 GiB take several seconds, time to kill the destination."""
    meta = ""
    if mdev is not None:
        prov = Provenance.of(sim_host, [{"kind": "mdev", "uuid": str(mdev), "parent": str(T4), "type": str(T4_2Q)}])
        meta = f"<metadata>{etree.tostring(prov.to_element(), encoding='unicode')}</metadata>"
    return (f"<domain type='qemu'><name>{name}</name><uuid>{uuid.uuid4()}</uuid>{meta}"
            f"<memory unit='MiB'>{memory_mib}</memory><vcpu>1</vcpu>"
            "<os><type arch='x86_64' machine='pc'>hvm</type></os><on_crash>destroy</on_crash>"
            "<devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>")


@pytest.fixture
def pair(testbed: Any) -> Iterator[tuple[Any, Any, LibvirtConnection, LibvirtConnection]]:
    m1, m2 = testbed.migration_hosts(2)
    c1, c2 = LibvirtConnection(m1.libvirt_uri), LibvirtConnection(m2.libvirt_uri)
    yield m1, m2, c1, c2
    c1.close()
    c2.close()


def _cleanup(name: str, *conns: LibvirtConnection) -> None:
    for c in conns:
        try:
            c.close()
            if c.exists(name):
                c.destroy(name)
                if c.exists(name):
                    c.undefine(name)
        except Exception:
            pass


def _reserve(host: SimHost, vm: str) -> MdevUuid:
    u = mdev_uuid_for(vm, 0)
    outcomes = apply_items(host, [CreateMdev(host.name, vm, u, T4, T4_2Q).item(5.0)])
    assert all(o.ok for o in outcomes)
    return u


def test_live_migration_there_and_back_moves_the_vgpu_record(pair: Any) -> None:
    _m1, _m2, c1, c2 = pair
    name = f"w24-mig-{uuid.uuid4().hex[:8]}"
    a, b = SimHost.from_profile("t4x2", name="sim-a"), SimHost.from_profile("t4x2", name="sim-b")
    u = _reserve(a, name)
    try:
        c1.raw.createXML(tiny_vm(name, 256, u, a.name), 0)
        jobs: list[dict[str, Any]] = []
        res = migrate(name, Side(a, c1), Side(b, c2), on_job=jobs.append, bandwidth_mib=8)
        # the VM runs on m2, persistent there, gone from m1 (undefined on the source)
        assert c2.is_active(name) and not c1.exists(name)
        assert c2.raw.lookupByName(name).isPersistent()
        # its vGPU: reserved on b under the same UUID, released on a; the record names b's device
        assert str(u) in {str(m.uuid) for m in b.model.mdevs.values()} or str(u) in b.model.mdevs
        assert str(u) not in a.model.mdevs
        prov = Provenance.read(c2.xml(name, inactive=True))
        assert prov is not None and prov.host == b.name and prov.gpus[0]["uuid"] == str(u)
        assert res.released == [f"{a.name}: removed vGPU {u}"]
        assert res.plan.max_downtime_ms == 5000          # a vGPU VM gets seconds of downtime, not 300 ms
        # and back, through the same call the other way round
        migrate(name, Side(b, c2), Side(a, c1))
        assert c1.is_active(name) and not c2.exists(name)
        assert str(u) in a.model.mdevs and str(u) not in b.model.mdevs
    finally:
        _cleanup(name, c1, c2)


def test_destination_killed_mid_migration_leaves_vm_on_source_and_nothing_reserved(testbed: Any) -> None:
    # hosts m3 and m4 of their own: killing a libvirtd must not cut another test's migration (parallel workers)
    m3, m4 = testbed.migration_hosts(4)[2:]
    c1, c2 = LibvirtConnection(m3.libvirt_uri), LibvirtConnection(m4.libvirt_uri)
    name = f"w24-kill-{uuid.uuid4().hex[:8]}"
    a, b = SimHost.from_profile("t4x2", name="sim-a"), SimHost.from_profile("t4x2", name="sim-b")
    u = _reserve(a, name)
    seen: list[dict[str, Any]] = []

    def kill_once(stats: dict[str, Any]) -> None:
        # The destination's libvirtd dies while QEMU streams the RAM (some sent, some left).
        if not seen and stats.get("memory_processed", 0) > 0 and stats.get("memory_remaining", 0) > 0:
            m4.kill_libvirtd()
            seen.append(stats)

    try:
        c1.raw.createXML(tiny_vm(name, 2048, u, a.name), 0)
        with pytest.raises(ProvisioningError) as err:
            migrate(name, Side(a, c1), Side(b, c2), on_job=kill_once, bandwidth_mib=1)
        assert seen, "the migration job never reported RAM in flight before it ended"
        assert "Lost connection to destination host" in str(err.value) or "closed" in str(err.value)
        # the rollback removed the reservation on the destination; the VM still runs on the source
        assert f"{b.name}: removed vGPU {u}" in err.value.rollback
        assert str(u) not in b.model.mdevs and str(u) in a.model.mdevs
        c1.close()
        assert c1.is_active(name)
        # the destination, back up, holds no trace of the VM
        testbed.migration_hosts(4)
        c2.close()
        assert not c2.exists(name)
    finally:
        testbed.migration_hosts(4)
        _cleanup(name, c1, c2)


def test_cli_migrate_live_and_refusal(pair: Any) -> None:
    m1, m2, c1, c2 = pair
    name = f"w24-cli-{uuid.uuid4().hex[:8]}"
    try:
        c1.raw.createXML(tiny_vm(name, 128, None, "none"), 0)
        base = [sys.executable, "-m", "vgpuvirt", "--host", "sim:t4x2@a", "--host", "sim:t4x2@b"]
        conns = ["--connect", m1.libvirt_uri, "--connect", m2.libvirt_uri]
        dry = subprocess.run([*base, "migrate", name, "--to", "sim:t4x2@b", "--dry-run", *conns],
                             capture_output=True, text=True, check=False, cwd=REPO)
        assert dry.returncode == 0, dry.stderr
        assert f"live-migrate domain {name} to sim:t4x2@b" in dry.stdout and c1.is_active(name)
        off = subprocess.run([*base, "migrate", name, "--to", "sim:t4x2@b", "--offline", *conns],
                             capture_output=True, text=True, check=False, cwd=REPO)
        assert off.returncode != 0 and "is running" in off.stderr and c1.is_active(name)
        run = subprocess.run([*base, "--json", "migrate", name, "--to", "sim:t4x2@b", *conns],
                             capture_output=True, text=True, check=False, cwd=REPO)
        assert run.returncode == 0, run.stderr
        c2.close()
        assert c2.is_active(name) and not c1.exists(name)
    finally:
        _cleanup(name, c1, c2)


def test_refusals_come_all_at_once_from_real_hosts(pair: Any) -> None:
    _m1, _m2, c1, c2 = pair
    a = SimHost.from_profile("t4x2", name="sim-a")
    b = SimHost.from_profile("l40s-vgpu17", name="sim-b")
    b.model.driver_version = "535.54.06"        # older than a's: refused (a newer one would be allowed)
    name = f"w24-ref-{uuid.uuid4().hex[:8]}"
    u = _reserve(a, name)
    try:
        c1.raw.createXML(tiny_vm(name, 128, u, a.name), 0)
        with pytest.raises(MigrationRefused) as err:
            migrate(name, Side(a, c1), Side(b, c2), live=False)
        text = " | ".join(err.value.reasons)
        assert "is running" in text and "vGPU manager versions differ" in text and "no such board" in text
        assert c1.is_active(name) and not c2.exists(name) and str(u) in a.model.mdevs
    finally:
        _cleanup(name, c1, c2)


@pytest.mark.waits
def test_host_drain_moves_the_vms_and_they_come_back(testbed: Any) -> None:
    from vgpuvirt.provision.mobility.drain import drain
    from vgpuvirt.services.cordon import read_cordon, set_cordon

    # hosts m8 and m9 of their own: a drain moves every VM vgpuvirt owns on the host, so another test's VM on a
    # shared host (a parallel worker's suspend test) would be moved too
    m8, m9 = testbed.migration_hosts(9)[7:]
    c1, c2 = LibvirtConnection(m8.libvirt_uri), LibvirtConnection(m9.libvirt_uri)
    a, b = SimHost.from_profile("t4x2", name="sim-a"), SimHost.from_profile("t4x2", name="sim-b")
    names = [f"w24-drain{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    try:
        for n in names:
            c1.raw.createXML(tiny_vm(n, 128, _reserve(a, n), a.name), 0)
        res = drain(Side(a, c1), [Side(b, c2)], parallel=2, reason="kernel update")
        assert [f.fate for f in res.fates] == ["migrated", "migrated"], res.to_dict()
        c1.close()
        c2.close()
        assert all(c2.is_active(n) and not c1.exists(n) for n in names)
        left = read_cordon(a)
        assert left is not None and left.reason == "kernel update"         # the drained host stays cordoned
        assert not a.model.mdevs and len(b.model.mdevs) == 2
        # nothing lands on a cordoned host: draining b back is refused until a is uncordoned
        refused = drain(Side(b, c2), [Side(a, c1)], dry_run=True)
        assert all(m.dest is None and "sim-a is cordoned" in m.refusals["sim-a"][0] for m in refused.plan.moves)
        set_cordon(a, None)
        back = drain(Side(b, c2), [Side(a, c1)], parallel=1)
        assert back.ok, back.to_dict()
        c1.close()
        assert all(c1.is_active(n) for n in names) and len(a.model.mdevs) == 2 and not b.model.mdevs
    finally:
        for n in names:
            _cleanup(n, c1, c2)
        c1.close()
        c2.close()


def test_offline_move_of_a_shut_off_vm(pair: Any) -> None:
    _m1, _m2, c1, c2 = pair
    name = f"w24-off-{uuid.uuid4().hex[:8]}"
    a, b = SimHost.from_profile("t4x2", name="sim-a"), SimHost.from_profile("t4x2", name="sim-b")
    u = _reserve(a, name)
    try:
        c1.define(tiny_vm(name, 128, u, a.name))
        res = migrate(name, Side(a, c1), Side(b, c2), live=False)
        assert [s.kind for s in res.plan.steps] == ["create-mdev", "define"]
        c1.close()
        c2.close()
        assert c2.exists(name) and not c2.is_active(name) and not c1.exists(name)
        assert str(u) in b.model.mdevs and str(u) not in a.model.mdevs
        prov = Provenance.read(c2.xml(name, inactive=True))
        assert prov is not None and prov.host == b.name
    finally:
        _cleanup(name, c1, c2)


def test_suspend_and_resume_on_a_real_libvirtd_keep_the_vgpu(pair: Any) -> None:
    from vgpuvirt.provision.mobility.suspend import resume, suspend

    _m1, _m2, c1, _c2 = pair
    name = f"w24-sus-{uuid.uuid4().hex[:8]}"
    a = SimHost.from_profile("t4x2", name="sim-a")
    u = _reserve(a, name)
    try:
        c1.define(tiny_vm(name, 128, u, a.name))
        c1.start(name)
        suspend(Side(a, c1), name)
        assert not c1.is_active(name) and c1.has_managed_save(name) and str(u) in a.model.mdevs
        a.reboot()                                   # the host lost its (unpersisted) vGPU meanwhile
        back = resume(Side(a, c1), name)
        assert back.recreated == [str(u)] and c1.is_active(name) and not c1.has_managed_save(name)
    finally:
        _cleanup(name, c1)
