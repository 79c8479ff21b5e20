"""The inventory's sysfs part reused across collections (SysfsCache): equal results, and a rebuild whenever
anything read differs (a vGPU created, the driver's version, the domains)."""

from __future__ import annotations

import uuid

from vgpuvirt.host.base import Op
from vgpuvirt.host.snapshot import Entry, Snapshot
from vgpuvirt.observe.collect import Collector
from vgpuvirt.services.inventory.build import SysfsCache
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS, build_inventory
from vgpuvirt.services.pci.sysfs import NVIDIA_VERSION
from vgpuvirt.sim import SimHost

T4A = "0000:3b:00.0"


def _mdev(h: SimHost, type_id: str = "nvidia-231") -> str:
    u = str(uuid.uuid4())
    assert h.apply([Op.write(f"/sys/class/mdev_bus/{T4A}/mdev_supported_types/{type_id}/create", u)]).ok
    return u


def _domain(name: str, mdev: str) -> str:
    return (f"<domain type='kvm'><name>{name}</name><memory>1048576</memory><os><type arch='x86_64'>hvm</type>"
            f"</os><devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
            f"<address uuid='{mdev}'/></source></hostdev></devices></domain>")


def test_a_cached_build_equals_a_fresh_one_and_reuses_the_sysfs_part() -> None:
    h = SimHost.from_profile("t4x2")
    _mdev(h)
    cache = SysfsCache()
    first = build_inventory(h.read(INVENTORY_GLOBS), host="h", cache=cache)
    again = build_inventory(h.read(INVENTORY_GLOBS), host="h", cache=cache)   # another read, same content
    assert (cache.misses, cache.hits) == (1, 1)
    assert again.to_dict() == first.to_dict() == build_inventory(h.read(INVENTORY_GLOBS), host="h").to_dict()


def test_any_change_in_what_was_read_or_in_the_domains_rebuilds() -> None:
    h = SimHost.from_profile("t4x2")
    cache = SysfsCache()
    snap = h.read(INVENTORY_GLOBS)
    assert build_inventory(snap, cache=cache).mdevs == []
    u = _mdev(h)                                        # a vGPU created: available_instances and mdevs change
    inv = build_inventory(h.read(INVENTORY_GLOBS), cache=cache)
    assert [str(m.uuid) for m in inv.mdevs] == [u] and cache.misses == 2
    # the driver reloaded at another version (the version file is in the key, like every path read)
    snap = h.read(INVENTORY_GLOBS)
    entries = dict(snap.items())
    entries[NVIDIA_VERSION] = Entry("file", "999.1\n")
    assert build_inventory(Snapshot(entries), cache=cache).nvidia_driver_version == "999.1"
    assert build_inventory(snap, cache=cache).nvidia_driver_version != "999.1"
    assert cache.misses == 4
    # the same files with domains, then with other domains: each rebuilds (ownership is part of the sysfs part)
    owned = build_inventory(snap, domains=[("vm-a", _domain("vm-a", u))], cache=cache)
    assert owned.mdevs[0].domain == "vm-a" and owned.mdevs[0].orphan is False
    other = build_inventory(snap, domains=[("vm-b", _domain("vm-b", u))], cache=cache)
    assert other.mdevs[0].domain == "vm-b"
    assert build_inventory(snap, domains=[], cache=cache).mdevs[0].orphan is True
    assert (cache.misses, cache.hits) == (7, 0)


def test_changing_a_returned_inventory_does_not_change_the_next_one() -> None:
    h = SimHost.from_profile("t4x2")
    _mdev(h)
    cache = SysfsCache()
    snap = h.read(INVENTORY_GLOBS)
    inv = build_inventory(snap, cache=cache)
    want = build_inventory(snap).to_dict()
    inv.mdevs.clear()
    inv.mdev_parents.pop()
    inv.warnings.append("x")
    next(iter(inv.iommu_groups.values())).clear()
    inv.iommu_units.append("dmar9")
    assert build_inventory(snap, cache=cache).to_dict() == want
    assert cache.hits == 1


def test_a_collector_reuses_its_hosts_sysfs_part_and_sees_changes() -> None:
    a = SimHost.from_profile("t4x2")
    c = Collector()
    c.collect(a)
    c.collect(a)
    assert (c._sysfs[a.name].misses, c._sysfs[a.name].hits) == (1, 1)
    u = _mdev(a)
    (g, _) = c.collect(a).gpus
    assert [v.id for v in g.vgpus] == [u] and c._sysfs[a.name].misses == 2
    # two hosts under one name share the cache, and each still gets its own files' answer (content is the key)
    b = SimHost.from_profile("t4x2")
    assert b.name == a.name
    for _ in range(2):
        assert [v.id for v in c.collect(a).gpus[0].vgpus] == [u]
        assert c.collect(b).gpus[0].vgpus == ()
