"""The storage, network and firmware part of :class:`vgpuvirt.libvirt_conn.LibvirtConnection` (a mixin).

Per-VM disks are libvirt storage volumes: a linked clone is created in a pool with a ``<backingStore>`` of
the golden image (``virStorageVolCreateXML``; libvirt runs ``qemu-img create -b``) and deleted through the
pool again, so a remote host needs nothing but libvirt. :meth:`StorageCalls.facts` reads in one pass what
the plan's pre-flight checks: networks, pools and their volumes, and the firmware libvirt can give a VM.
The XML is built and read in :mod:`vgpuvirt.xml.storage`; errors are translated like every other call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from vgpuvirt.audit import audited
from vgpuvirt.errors import LibvirtError, XmlError
from vgpuvirt.xml.document import parse_xml
from vgpuvirt.xml.storage import FirmwareCaps, StoragePool, Volume, check_name, disk_files

log = logging.getLogger("vgpuvirt.libvirt")
audit = logging.getLogger("vgpuvirt.audit")
T = TypeVar("T")

VIR_ERR_NO_SUPPORT = 3
VIR_ERR_NO_NETWORK = 43
VIR_ERR_NO_STORAGE_POOL = 49
VIR_ERR_NO_STORAGE_VOL = 50
_GONE = (VIR_ERR_NO_NETWORK, VIR_ERR_NO_STORAGE_POOL, VIR_ERR_NO_STORAGE_VOL)


@dataclass(frozen=True)
class PoolFacts:
    name: str
    active: bool
    target: str | None
    volumes: dict[str, str] = field(default_factory=dict)    # volume name -> path (active pools only)
    available_bytes: int | None = None                        # free space libvirt reports (active pools)


@dataclass(frozen=True)
class LibvirtFacts:
    """What one libvirt connection offers a domain, as read when planning."""

    networks: dict[str, bool] = field(default_factory=dict)   # name -> active
    pools: dict[str, PoolFacts] = field(default_factory=dict)
    firmware: FirmwareCaps | None = None                      # None: the driver does not say (test driver)
    #: host interfaces libvirt sees, name -> type ("bridge", "ethernet", ...); None: it cannot list them
    interfaces: dict[str, str] | None = None

    def volume_paths(self) -> dict[str, str]:
        """Every volume path of every active pool -> its pool's name."""
        return {path: p.name for p in self.pools.values() for path in p.volumes.values()}


def _upload(raw: Any, vol: Any, data: bytes) -> None:
    stream = raw.newStream(0)
    vol.upload(stream, 0, len(data), 0)
    view = memoryview(data)
    try:
        while view:
            sent = stream.send(bytes(view[:256 * 1024]))
            if sent < 0:        # -2: would block, only on non-blocking streams (ours blocks)
                raise OSError(f"libvirt stream send returned {sent}")
            view = view[sent:]
        stream.finish()
    except BaseException:
        stream.abort()
        raise


class StorageCalls:
    """Storage volumes, pools, networks and domain capabilities; mixed into LibvirtConnection."""

    uri: str
    if TYPE_CHECKING:  # provided by LibvirtConnection
        raw: Any

        def _call(self, domain: str | None, what: str, fn: Callable[[], T]) -> T: ...

        def exists(self, name: str) -> bool: ...

        def xml(self, name: str, *, inactive: bool = False) -> str: ...

    def _pool(self, name: str) -> Any:
        n = check_name("storage pool name", name)
        return self._call(None, f"look up storage pool {n}", lambda: self.raw.storagePoolLookupByName(n))

    def pool_exists(self, name: str) -> bool:
        try:
            self._pool(name)
        except LibvirtError as exc:
            if exc.code in _GONE:
                return False
            raise
        return True

    def define_pool(self, pool: StoragePool, *, start: bool = True) -> str:
        """Define a directory pool (its directory made by libvirt's build) and start it; returns its name."""
        xml = pool.to_xml()
        audit.info("%s: define storage pool %s at %s", self.uri, pool.name, pool.target)
        with audited("define storage pool", self.uri, pool=pool.name):
            p = self._call(None, f"define storage pool {pool.name}", lambda: self.raw.storagePoolDefineXML(xml, 0))
            if start:
                self._call(None, f"build storage pool {pool.name}", lambda: p.build(0))
                self._call(None, f"start storage pool {pool.name}", lambda: p.create(0))
        return str(p.name())

    def remove_pool(self, name: str) -> bool:
        """Stop and undefine a pool (its files stay). False when there is no such pool."""
        if not self.pool_exists(name):
            return False
        p = self._pool(name)
        audit.info("%s: remove storage pool %s", self.uri, name)
        with audited("remove storage pool", self.uri, pool=name):
            if self._call(None, f"query storage pool {name}", lambda: p.isActive()):
                self._call(None, f"stop storage pool {name}", lambda: p.destroy())
            self._call(None, f"undefine storage pool {name}", lambda: p.undefine())
        return True

    def refresh_pool(self, name: str) -> None:
        """Rescan a pool's directory (files made outside libvirt, e.g. a golden image, show up)."""
        p = self._pool(name)
        self._call(None, f"refresh storage pool {name}", lambda: p.refresh(0))

    def create_volume(self, pool: str, volume: Volume) -> str:
        """Create ``volume`` in ``pool`` (a linked clone when it has a backing image); returns its path."""
        p = self._pool(pool)
        if volume.capacity_bytes is None and volume.backing is not None:
            # libvirt 9.0 still wants <capacity> next to a <backingStore>: the golden image's own size.
            cap = self.volume(volume.backing).capacity_bytes
            volume = replace(volume, capacity_bytes=cap)
        xml = volume.to_xml()
        audit.info("%s: create volume %s in pool %s (backing %s)", self.uri, volume.name, pool, volume.backing)
        with audited("create volume", self.uri, pool=pool, volume=volume.name):
            vol = self._call(None, f"create volume {volume.name} in pool {pool}",
                             lambda: p.createXML(xml, 0))
        return str(vol.path())

    def upload_volume(self, pool: str, volume: Volume, data: bytes, *, what: str = "volume",
                      **record: str) -> str:
        """Create ``volume`` in ``pool`` holding ``data`` (a raw image, e.g. an ISO), uploaded through libvirt's
        stream API so a remote host needs nothing but libvirt; returns its path. A failed upload deletes the
        volume again. ``record`` goes into the log and the audit record instead of the data (its digest)."""
        p = self._pool(pool)
        volume = replace(volume, capacity_bytes=len(data))
        xml = volume.to_xml()
        audit.info("%s: create %s %s in pool %s (%d bytes, %s)", self.uri, what, volume.name, pool, len(data),
                   ", ".join(f"{k} {v}" for k, v in record.items()))
        with audited(f"create {what}", self.uri, pool=pool, volume=volume.name, **record):
            vol = self._call(None, f"create {what} {volume.name} in pool {pool}", lambda: p.createXML(xml, 0))
            try:
                # one call: a retried upload starts again from offset 0 (and so rewrites the whole volume)
                self._call(None, f"upload {what} {volume.name}", lambda: _upload(self.raw, vol, data))
            except BaseException:
                # half a volume is worse than none: a rerun creates it again
                self._call(None, f"delete {what} {volume.name} in pool {pool}", lambda: vol.delete(0))
                raise
        return str(vol.path())

    def delete_volume(self, pool: str, name: str) -> bool:
        """Delete a volume of ``pool``; False when it is not there (rollback and teardown can rerun)."""
        n = check_name("volume name", name)
        p = self._pool(pool)
        try:
            vol = self._call(None, f"look up volume {n} in pool {pool}", lambda: p.storageVolLookupByName(n))
        except LibvirtError as exc:
            if exc.code in _GONE:
                return False
            raise
        audit.info("%s: delete volume %s of pool %s", self.uri, n, pool)
        with audited("delete volume", self.uri, pool=pool, volume=n):
            self._call(None, f"delete volume {n} in pool {pool}", lambda: vol.delete(0))
        return True

    def volume(self, path: str) -> Volume:
        """The volume at ``path`` as libvirt reports it (format, backing image, capacity, path)."""
        vol = self._call(None, f"look up volume {path}", lambda: self.raw.storageVolLookupByPath(path))
        return Volume.from_xml(str(self._call(None, f"read volume {path}", lambda: vol.XMLDesc(0))))

    def storage_volumes(self, name: str) -> list[str]:
        """The disk paths of domain ``name`` that are libvirt storage volumes: what ``undefine(...,
        remove_storage=True)`` deletes (a disk outside every pool is kept). [] when there is no such domain."""
        if not self.exists(name):
            return []
        out: list[str] = []
        for path in disk_files(self.xml(name, inactive=True)):
            def lookup(p: str = path) -> Any:
                return self.raw.storageVolLookupByPath(p)
            try:
                self._call(name, f"look up volume {path}", lookup)
            except LibvirtError:
                continue
            out.append(path)
        return out

    def facts(self, *, refresh: bool = True) -> LibvirtFacts:
        """Networks, pools with their volumes (active pools rescanned first), firmware: the pre-flight's input."""
        nets = {str(n.name()): bool(n.isActive())
                for n in self._call(None, "list networks", lambda: self.raw.listAllNetworks(0))}
        pools: dict[str, PoolFacts] = {}
        for p in self._call(None, "list storage pools", lambda: self.raw.listAllStoragePools(0)):
            pools[str(p.name())] = self._pool_facts(p, refresh)
        return LibvirtFacts(nets, pools, self._firmware(), self._interfaces())

    def _interfaces(self) -> dict[str, str] | None:
        """The host's interfaces by type, so a ``<interface type='bridge'>`` is checked where libvirt runs."""
        try:
            ifaces = self._call(None, "list host interfaces", lambda: self.raw.listAllInterfaces(0))
        except LibvirtError as exc:     # no interface driver in this daemon: not checked
            log.debug("%s: no host interfaces: %s", self.uri, exc)
            return None
        out: dict[str, str] = {}
        for i in ifaces:
            def read(i: Any = i) -> Any:
                return i.XMLDesc(0)
            try:
                xml = self._call(None, "read host interface", read)
                out[str(i.name())] = parse_xml(str(xml)).get("type", "")
            except (LibvirtError, XmlError):    # one that vanished while listed is simply not there
                continue
        return out

    def _pool_facts(self, p: Any, refresh: bool) -> PoolFacts:
        name = str(p.name())
        active = bool(self._call(None, f"query storage pool {name}", lambda: p.isActive()))
        try:
            xml = str(self._call(None, f"read storage pool {name}", lambda: p.XMLDesc(0)))
            target = StoragePool.from_xml(xml).target
        except XmlError:
            target = None
        vols: dict[str, str] = {}
        available: int | None = None
        if active:
            if refresh:
                try:
                    self._call(None, f"refresh storage pool {name}", lambda: p.refresh(0))
                except LibvirtError as exc:      # a pool busy with another job still lists what it had
                    log.debug("%s: refresh of pool %s failed: %s", self.uri, name, exc)
            for v in self._call(None, f"list volumes of {name}", lambda: p.listAllVolumes(0)):
                try:
                    vols[str(v.name())] = str(self._call(None, f"read volume of {name}", v.path))
                except LibvirtError as exc:  # deleted between the listing and this read (another caller)
                    if exc.code != VIR_ERR_NO_STORAGE_VOL:
                        raise
            # info(): [state, capacity, allocation, available], in bytes
            available = int(self._call(None, f"query storage pool {name}", lambda: p.info())[3])
        return PoolFacts(name, active, target, vols, available)

    def _firmware(self) -> FirmwareCaps | None:
        try:
            xml = self._call(None, "read domain capabilities",
                             lambda: self.raw.getDomainCapabilities(None, "x86_64", "q35", "kvm", 0))
        except LibvirtError as exc:
            # The test driver has no domain capabilities; a host without KVM answers for no virt type.
            log.debug("%s: no domain capabilities: %s", self.uri, exc)
            return None
        try:
            return FirmwareCaps.from_xml(str(xml))
        except XmlError:
            return None
