"""VDI disks: storage XML against libvirt's schemas, {name} templating, the vdi template's own disk, and linked
clones made, kept, adopted, rolled back and removed through libvirt's storage API (test driver)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from provision_fixtures import drop_test_domains

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.change.storage import CreateVolume
from vgpuvirt.errors import InvalidSpec, LibvirtError, ProvisioningError
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan, provision, teardown
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.provision.run import gather
from vgpuvirt.sim import SimHost
from vgpuvirt.xml import Domain, build_domain
from vgpuvirt.xml.parts import Disk
from vgpuvirt.xml.schema import validate
from vgpuvirt.xml.storage import StoragePool, Volume, backing_chains

pytest.importorskip("libvirt")
POOL = "default-pool"               # the test driver's own pool, at /default-pool
Q2 = VgpuRequest(type="nvidia-231")


def _tag() -> str:
    return "vd" + uuid.uuid4().hex[:6]


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    c = LibvirtConnection("test:///default")
    before = set(c.facts().pools[POOL].volumes)
    yield c
    for name in set(c.facts().pools[POOL].volumes) - before:
        c.delete_volume(POOL, name)
    drop_test_domains(c)


@pytest.fixture
def golden(conn: LibvirtConnection) -> str:
    return conn.create_volume(POOL, Volume(f"{_tag()}-golden.qcow2", capacity_bytes=1 << 30))


# -- XML -------------------------------------------------------------------------------------------------------

def test_pool_and_volume_xml_pass_libvirts_schemas_and_round_trip() -> None:
    pool = StoragePool("vdi", target="/var/lib/vgpuvirt/vdi")
    vol = Volume("desk-001.qcow2", backing="/var/lib/vgpuvirt/vdi/golden.qcow2")
    validate(pool.to_element(), "storagepool.rng")
    validate(vol.to_element(), "storagevol.rng")
    assert StoragePool.from_xml(pool.to_xml()) == pool
    back = Volume.from_xml(vol.to_xml())
    assert (back.backing, back.format, back.backing_format) == (vol.backing, "qcow2", "qcow2")


@pytest.mark.parametrize("bad", [dict(name="../etc"), dict(name="a/b"), dict(name=".hidden"),
                                 dict(backing="relative.qcow2"), dict(format="raw"), dict(backing=None)])
def test_bad_volume_values_are_refused(bad: dict[str, object]) -> None:
    kw: dict[str, object] = {"name": "v.qcow2", "backing": "/g.qcow2", **bad}
    with pytest.raises(InvalidSpec):
        Volume(**kw)  # type: ignore[arg-type]


def test_backing_chains_read_a_live_disk_chain() -> None:
    xml = ("<domain><devices><disk type='file' device='disk'><source file='/p/d.qcow2'/>"
           "<backingStore type='file'><format type='qcow2'/><source file='/p/g.qcow2'/><backingStore/>"
           "</backingStore><target dev='vda'/></disk></devices></domain>")
    assert backing_chains(xml) == {"vda": ["/p/d.qcow2", "/p/g.qcow2"]}


# -- {name} and the vdi template's disk ------------------------------------------------------------------------

def test_vdi_template_gives_each_desktop_its_own_disk() -> None:
    a, b = (build_domain("vdi", name=n, memory_mib=1024, vcpus=1) for n in ("desk-a", "desk-b"))
    assert backing_chains(a.to_xml()) == {"vda": ["/var/lib/libvirt/images/desk-a.qcow2"]}
    assert backing_chains(b.to_xml()) == {"vda": ["/var/lib/libvirt/images/desk-b.qcow2"]}
    given = build_domain("vdi", name="desk-a", memory_mib=1024, vcpus=1, disk=Disk("/srv/a.qcow2"))
    assert backing_chains(given.to_xml()) == {"vda": ["/srv/a.qcow2"]}     # replaced, not a second vda
    validate(given)


def test_disk_path_is_templated_per_vm() -> None:
    host = SimHost.from_profile("t4x2")
    from vgpuvirt.services.inventory.read import inventory
    vms = VmRequest.pool("tpl", 3, gpu=Q2, disk="/srv/vdi/{name}.qcow2")
    p = plan([inventory(host)], vms)
    paths = [backing_chains(s.xml)["vda"][0] for s in p.steps if isinstance(s, DefineDomain)]
    assert paths == ["/srv/vdi/tpl-001.qcow2", "/srv/vdi/tpl-002.qcow2", "/srv/vdi/tpl-003.qcow2"]


def test_one_disk_path_for_several_vms_is_refused() -> None:
    from vgpuvirt.services.inventory.read import inventory
    inv = inventory(SimHost.from_profile("t4x2"))
    with pytest.raises(InvalidSpec, match=r"one disk per VM .*tpl-001 and tpl-002 would share /srv/same\.qcow2"):
        plan([inv], VmRequest.pool("tpl", 2, gpu=Q2, disk="/srv/same.qcow2"))
    with pytest.raises(InvalidSpec, match="only placeholder"):
        VmRequest("x", disk="/srv/{nmae}.qcow2")
    with pytest.raises(InvalidSpec, match="every VM gets its own volume"):
        ClonedDisk(POOL, "/default-pool/g.qcow2", name="shared.qcow2")


# -- linked clones through libvirt's storage API ---------------------------------------------------------------

def test_cloned_disks_are_made_kept_and_removed_on_request(conn: LibvirtConnection, golden: str) -> None:
    host = SimHost.from_profile("t4x2")
    vms = VmRequest.pool(_tag(), 2, gpu=Q2, disk=ClonedDisk(POOL, golden))
    r = provision(host, conn, vms)
    made = [s for s in r.plan.steps if isinstance(s, CreateVolume)]
    assert [s.target for s in made] == [f"{POOL}/{v.name}.qcow2" for v in vms]
    for v in vms:
        path = f"/default-pool/{v.name}.qcow2"
        assert backing_chains(conn.xml(v.name))["vda"] == [path]
        vol = conn.volume(path)
        assert (vol.format, vol.backing, vol.capacity_bytes) == ("qcow2", golden, 1 << 30)
    again = provision(host, conn, vms, dry_run=True)
    assert again.plan.empty
    # teardown names the volumes --remove-storage deletes (issue 28 item 11): in the dry run, and kept ones
    paths = [f"/default-pool/{v.name}.qcow2" for v in vms]
    dry = teardown(host, conn, [vms[1].name], remove_storage=True, dry_run=True)
    assert f"sim:t4x2: would destroy and undefine {vms[1].name} and delete its volume(s) {paths[1]}" in dry.removed
    kept = teardown(host, conn, [vms[0].name])                 # the default: disks kept
    assert kept.ok and kept.disks_removed == [] and f"{vms[0].name}.qcow2" in conn.facts().pools[POOL].volumes
    assert (f"sim:t4x2: kept {vms[0].name}'s volume(s) {paths[0]} (remove_storage=True deletes them)"
            in kept.skipped)
    gone = teardown(host, conn, [vms[1].name], remove_storage=True)
    assert gone.disks_removed == [paths[1]]
    assert f"sim:t4x2: undefined {vms[1].name}; deleted volume(s) {paths[1]}" in gone.removed
    left = conn.facts().pools[POOL].volumes
    assert f"{vms[1].name}.qcow2" not in left and golden in left.values()   # the golden image stays


def test_a_volume_left_by_a_cut_run_is_adopted(conn: LibvirtConnection, golden: str) -> None:
    host = SimHost.from_profile("t4x2")
    vm = VmRequest(_tag(), gpus=(Q2,), disk=ClonedDisk(POOL, golden))
    conn.create_volume(POOL, vm.disk.volume(vm.name))  # type: ignore[union-attr]
    r = provision(host, conn, [vm])
    assert not any(isinstance(s, CreateVolume) for s in r.plan.steps)
    assert any(f"disk {POOL}/{vm.name}.qcow2 (adopted)" in k.what for k in r.plan.kept)


def test_failed_provisioning_deletes_the_clones_it_made(conn: LibvirtConnection, golden: str) -> None:
    host = SimHost.from_profile("t4x2")
    vms = VmRequest.pool(_tag(), 3, gpu=Q2, disk=ClonedDisk(POOL, golden))
    facts: dict[str, object] = {}
    invs, doms = gather({host.name: host}, {host.name: conn}, facts)  # type: ignore[arg-type]
    p = plan(invs, vms, domains=doms, libvirt=facts)  # type: ignore[arg-type]
    # Another client takes the third name between plan and apply: its define fails after two clones exist.
    conn.define(f"<domain type='test'><name>{vms[2].name}</name><uuid>{uuid.uuid4()}</uuid>"
                "<memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>")
    before = set(conn.facts().pools[POOL].volumes)
    with pytest.raises(ProvisioningError) as ei:
        apply(p, host, conn)
    assert sum("deleted disk" in line for line in ei.value.rollback) == 3
    assert set(conn.facts().pools[POOL].volumes) == before
    assert Domain.from_xml(conn.xml(vms[2].name)).name == vms[2].name     # the other client's domain stays


def test_cli_clone_and_pool_flags(conn: LibvirtConnection, golden: str, capsys: pytest.CaptureFixture[str]) -> None:
    from vgpuvirt.cli import main
    tag = _tag()
    base = ["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--prefix", tag, "--count", "2",
            "--gpu", "T4-2Q"]
    assert main(["--json", *base, "--clone", golden, "--pool", POOL]) == 0
    steps = json.loads(capsys.readouterr().out)["plan"]["steps"]
    made = [(s["target"], s["backing"]) for s in steps if s["action"] == "create-volume"]
    assert made == [(f"{POOL}/{tag}-001.qcow2", golden), (f"{POOL}/{tag}-002.qcow2", golden)]
    assert main([*base, "--clone", "/default-pool/missing.qcow2", "--pool", POOL]) != 0
    err = capsys.readouterr().err
    assert "pre-flight refused the plan" in err and "golden image /default-pool/missing.qcow2" in err
    assert len(err.strip().splitlines()) == 1
    assert main([*base, "--clone", golden]) != 0
    assert "--clone GOLDEN and --pool POOL together" in capsys.readouterr().err


class _DeletesFirstVolume:
    """A storage pool whose listing races with another caller's delete: the first volume listed is gone before
    its path is read (seen when parallel provisioning runs shared one libvirtd)."""

    def __init__(self, pool: object) -> None:
        self._pool = pool
        self.deleted: str | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)

    def listAllVolumes(self, flags: int) -> list[object]:
        vols = self._pool.listAllVolumes(flags)  # type: ignore[attr-defined]
        self.deleted = str(vols[0].name())
        vols[0].delete(0)
        return vols


def test_a_volume_deleted_while_the_pool_is_read_is_left_out_not_an_error() -> None:
    c = LibvirtConnection("test:///default")
    pool = c.raw.storagePoolLookupByName("default-pool")
    names = [f"race-{uuid.uuid4().hex[:8]}-{i}.qcow2" for i in range(2)]
    for n in names:
        pool.createXML(Volume(n, capacity_bytes=1 << 20).to_xml(), 0)
    try:
        racing = _DeletesFirstVolume(pool)
        facts = c._pool_facts(racing, refresh=False)
        assert racing.deleted in names
        assert set(facts.volumes) & set(names) == set(names) - {racing.deleted}
    finally:
        for n in names:
            try:
                pool.storageVolLookupByName(n).delete(0)
            except Exception:  # the first one is gone already
                pass
        c.close()


class _StoppedWhileRead:
    """A storage pool another caller stops between its isActive and its volume listing (seen on the suite's
    shared libvirtd: the listing failed with "storage pool ... is not active" and so did the whole plan)."""

    def __init__(self, pool: object) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)

    def listAllVolumes(self, flags: int) -> list[object]:
        self._pool.destroy()  # type: ignore[attr-defined]
        return self._pool.listAllVolumes(flags)  # type: ignore[attr-defined,no-any-return]


def test_a_pool_stopped_while_it_is_read_is_an_inactive_pool_not_an_error(tmp_path: Path) -> None:
    c = LibvirtConnection("test:///default")
    name = f"race-{uuid.uuid4().hex[:8]}"
    c.define_pool(StoragePool(name, target=str(tmp_path / "p")))
    pool = c.raw.storagePoolLookupByName(name)
    try:
        assert c._pool_facts(pool, refresh=False).active
        facts = c._pool_facts(_StoppedWhileRead(pool), refresh=False)
        assert (facts.name, facts.active, facts.volumes, facts.available_bytes) == (name, False, {}, None)
        with pytest.raises(LibvirtError, match="not active"):    # the same error on a pool still running is raised
            c._pool_facts(_ListsBadly(c.raw.storagePoolLookupByName("default-pool")), refresh=False)
    finally:
        c.remove_pool(name)


class _ListsBadly:
    """An active pool whose listing fails with "operation invalid" although it still runs: not hidden."""

    def __init__(self, pool: object) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)

    def listAllVolumes(self, flags: int) -> list[object]:
        import libvirt
        err = libvirt.libvirtError("storage pool is not active")
        err.err = (55, 0, "Requested operation is not valid: storage pool is not active", 2, "", None, None, 0, 0)
        raise err
