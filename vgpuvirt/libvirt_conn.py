"""A small, honest wrapper around one libvirt connection.

Works with any URI libvirt understands: ``qemu:///system``, ``qemu+ssh://root@host/system?keyfile=...``
and ``test:///default`` (libvirt's in-process test driver, which parses domain XML with the real
parser but cannot hot-plug). What it adds to libvirt-python:

* every ``libvirtError`` becomes :class:`vgpuvirt.errors.LibvirtError` carrying the domain name,
  libvirt's error code and the URI;
* each call is run by ``vgpuvirt.libvirt_bound``: transient errors ("cannot acquire state change lock")
  retried through an injectable tenacity policy, nothing else (a define or start that failed for a real
  reason fails the same way again); and a time bound, after which the connection is given up;
* lifecycle verbs that converge: ``undefine`` of a domain that is gone and ``destroy`` of a domain
  that is not running are no-ops, so teardown and rollback can be rerun.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from vgpuvirt import audit as client_audit
from vgpuvirt import libvirt_bound as bound
from vgpuvirt.audit import audited
from vgpuvirt.errors import InvalidSpec, LibvirtError, MissingDependency, XmlError
from vgpuvirt.libvirt_bound import LibvirtTimeout, RetryFactory, default_retry
from vgpuvirt.libvirt_bound import no_retry as no_retry
from vgpuvirt.libvirt_storage import LibvirtFacts, PoolFacts
from vgpuvirt.libvirt_uri import connect_failure, ssh_probe
from vgpuvirt.model import DomainName
from vgpuvirt.xml.domain import Domain, device_xml, parse_xml
from vgpuvirt.xml.hostdev import GpuDevice, HostdevInterface, MdevHostdev, PciHostdev
from vgpuvirt.xml.storage import FirmwareCaps, StoragePool, Volume, check_name, disk_files

#: What attach/detach take: device XML text, or one of the xml layer's device objects.
DeviceArg = str | GpuDevice
_DEVICE_TYPES = (MdevHostdev, PciHostdev, HostdevInterface)

log = logging.getLogger("vgpuvirt.libvirt")
audit = logging.getLogger("vgpuvirt.audit")

T = TypeVar("T")

# libvirt's virErrorNumber values. Kept as numbers so this module imports without libvirt-python (the values
# are part of libvirt's stable ABI).
VIR_ERR_NO_SUPPORT = 3
VIR_ERR_INVALID_ARG = 8
VIR_ERR_NO_DOMAIN = 42
VIR_ERR_OPERATION_INVALID = 55
VIR_ERR_OPERATION_UNSUPPORTED = 84
VIR_ERR_NO_NETWORK = 43
VIR_ERR_NO_STORAGE_POOL = 49
VIR_ERR_NO_STORAGE_VOL = 50
_GONE = (VIR_ERR_NO_NETWORK, VIR_ERR_NO_STORAGE_POOL, VIR_ERR_NO_STORAGE_VOL)


_handler_installed = False


def _import_libvirt() -> Any:
    global _handler_installed
    try:
        import libvirt
    except ImportError as exc:
        raise MissingDependency("libvirt", "libvirt", "talking to libvirt") from exc
    if not _handler_installed:
        # libvirt prints every error to stderr by default; we raise them instead.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        _handler_installed = True
    return libvirt


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


def _first_name_is(xml: str, name: str) -> bool:
    """Whether the first ``<name>`` element of domain XML reads ``name`` (a valid domain name needs no escaping).
    Used only to confirm the name a caller built the XML with, never to find one: libvirt writes a domain's own
    ``<name>`` first, and the builders here set it; where another ``<name>`` comes first, the XML is parsed."""
    at = xml.find("<name>")
    return at >= 0 and xml.startswith(name + "</name>", at + 6)


class _StaleHandle(Exception):
    """The handle :meth:`LibvirtConnection.define` kept names a domain gone since: look the name up."""


@dataclass(frozen=True)
class DomainInfo:
    name: str
    uuid: str
    active: bool
    persistent: bool
    xml: str


class LibvirtConnection:
    """One libvirt connection, opened lazily, thread-safe: domains, then storage and networks, then mobility."""

    def __init__(self, uri: str, *, retry: RetryFactory = default_retry, readonly: bool = False,
                 timeout: float | None = None) -> None:
        # not .isprintable(): a non-UTF-8 argv byte arrives surrogate-escaped and libvirt.open cannot encode it
        if not isinstance(uri, str) or not uri or not uri.isprintable():
            raise InvalidSpec("libvirt URI", uri, "a URI such as qemu:///system or test:///default")
        self.uri = uri
        self.retry = retry
        self._defined: dict[str, Any] = {}      # name -> the handle define() got, until the domain is started
        self.readonly = readonly
        self.timeout = bound.default_timeout() if timeout is None else timeout
        self._conn: Any = None
        self._lock = threading.Lock()
        self._hung: LibvirtTimeout | None = None

    # -- connection ---------------------------------------------------------------------------
    @property
    def raw(self) -> Any:
        """The libvirt.virConnect (opened on first use)."""
        with self._lock:
            if self._conn is None:
                libvirt = _import_libvirt()
                opener = libvirt.openReadOnly if self.readonly else libvirt.open
                try:
                    self._conn = self._bounded(None, "connect", lambda: opener(self.uri))
                except libvirt.libvirtError as exc:
                    code = exc.get_error_code()
                    why = connect_failure(self.uri, exc.get_error_message(), probe=ssh_probe)
                    raise LibvirtError(why + f" (libvirt error {code})",
                                       code=code, uri=self.uri) from exc
                except SystemError as exc:
                    raise self._undecodable(None, "connect") from exc
            return self._conn

    def _bounded(self, domain: str | None, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` (one or a few libvirt calls) within ``self.timeout``; given up for good after a timeout."""
        if self._hung is not None:
            raise LibvirtTimeout(str(self._hung), domain=domain, uri=self.uri)
        if self.uri.startswith("test:"):
            return fn()             # libvirt's in-process test driver has no daemon or link that could stall
        try:
            return bound.bounded_call(fn, self.timeout, self.uri, what, domain)
        except LibvirtTimeout as exc:
            self._hung = exc
            raise

    def close(self) -> None:
        self._defined.clear()           # handles of this connection: a reopened one looks domains up again
        if self._hung is not None:      # a call still blocks in libvirt on it: closing would wait for that call
            self._conn = None
            return
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # closing a broken connection must not mask the real error
                    log.debug("closing %s failed", self.uri, exc_info=True)
                self._conn = None

    def __enter__(self) -> LibvirtConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def driver(self) -> str:
        """The hypervisor driver name in lower case (``qemu``, ``test``)."""
        return str(self._call(None, "get driver type", lambda: self.raw.getType())).lower()

    @property
    def supports_hotplug(self) -> bool:
        # The test driver rejects virDomainAttachDeviceFlags (seen on libvirt 9.0).
        return self.driver != "test"

    # -- error handling (the messages: vgpuvirt.libvirt_bound) ------------------------------------
    def _translate(self, exc: Any, domain: str | None, what: str) -> LibvirtError:
        return bound.translate(exc, self.uri, domain, what)

    def _undecodable(self, domain: str | None, what: str) -> LibvirtError:
        return bound.undecodable(self.uri, domain, what)

    def _call(self, domain: str | None, what: str, fn: Callable[[], T]) -> T:
        libvirt = _import_libvirt()

        def once() -> T:
            try:
                return self._bounded(domain, what, fn)
            except libvirt.libvirtError as exc:
                raise self._translate(exc, domain, what) from exc
            except SystemError as exc:
                raise self._undecodable(domain, what) from exc

        # The first attempt outside the policy: a call that succeeds (nearly all) builds no tenacity.Retrying and
        # its state (objects for the collector, per call). A failure is handed to the policy as its own first
        # attempt's, so what is retried, how often and after which waits is the policy's alone, as before (a policy
        # that stops after a delay counts it from the end of that first attempt).
        try:
            return once()
        except BaseException as exc:
            first: BaseException | None = exc
        for attempt in self.retry():
            with attempt:
                if first is not None:
                    failed, first = first, None
                    raise failed
                return once()
        raise AssertionError("tenacity ended its attempts without an outcome")  # pragma: no cover

    def _lookup(self, name: str) -> Any:
        n = str(DomainName.parse(name))
        return self._call(n, "look up", lambda: self.raw.lookupByName(n))

    # -- queries ------------------------------------------------------------------------------
    def exists(self, name: str) -> bool:
        try:
            self._lookup(name)
        except LibvirtError as exc:
            if exc.code == VIR_ERR_NO_DOMAIN:
                return False
            raise
        return True

    def is_active(self, name: str) -> bool:
        dom = self._lookup(name)
        return bool(self._call(name, "query state", lambda: dom.isActive()))

    def xml(self, name: str, *, inactive: bool = False, migratable: bool = False) -> str:
        lv = _import_libvirt()          # migratable: the form a migration sends (a destination XML is checked
        dom = self._lookup(name)        # against it)
        flags = (lv.VIR_DOMAIN_XML_INACTIVE if inactive else 0) | (lv.VIR_DOMAIN_XML_MIGRATABLE if migratable else 0)
        return str(self._call(name, "read XML", lambda: dom.XMLDesc(flags)))

    def domains(self) -> list[DomainInfo]:
        """Every domain (running or defined) with its XML, in name order."""
        doms = self._call(None, "list domains", lambda: self.raw.listAllDomains(0))
        out: list[DomainInfo] = []
        libvirt = _import_libvirt()
        def info_of(d: Any) -> DomainInfo:
            return DomainInfo(d.name(), d.UUIDString(), bool(d.isActive()), bool(d.isPersistent()), d.XMLDesc(0))

        for d in doms:
            try:
                out.append(self._bounded(None, "read domain", functools.partial(info_of, d)))
            except libvirt.libvirtError as exc:
                # A domain undefined between list and read is simply gone.
                if exc.get_error_code() != VIR_ERR_NO_DOMAIN:
                    raise self._translate(exc, None, "read domain") from exc
        return sorted(out, key=lambda i: i.name)

    def xml_views(self) -> dict[str, tuple[str, ...]]:
        """Every domain's live XML and, for a running persistent domain, its persistent XML too: a
        device is in use when either names it (a config-only attach shows in the persistent one)."""
        libvirt = _import_libvirt()
        doms = self._call(None, "list domains", lambda: self.raw.listAllDomains(0))
        out: dict[str, tuple[str, ...]] = {}
        def views_of(d: Any) -> tuple[str, tuple[str, ...]]:
            views = [d.XMLDesc(0)]
            if d.isActive() and d.isPersistent():
                views.append(d.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
            return str(d.name()), tuple(views)

        for d in doms:
            try:
                name, views = self._bounded(None, "read domain", functools.partial(views_of, d))
                out[name] = views
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != VIR_ERR_NO_DOMAIN:
                    raise self._translate(exc, None, "read domain") from exc
        return out

    def domain_xml_pairs(self) -> Iterator[tuple[str, str]]:
        """(name, xml) pairs, the shape inventory() takes to join mdevs with domains."""
        for d in self.domains():
            yield d.name, d.xml

    # -- lifecycle ----------------------------------------------------------------------------
    def define(self, xml: str, *, name: str | None = None) -> str:
        """Define (or redefine) a persistent domain from XML; return its name.

        ``name``: the name the caller built the XML with (a plan's define step). Where the XML's first ``<name>``
        reads it, the document is not parsed to find it: a parse per VM, which also lets another thread take the
        interpreter (lxml parses without it). Otherwise, or without ``name``, the XML is parsed and its name read;
        a name that differs from the one given is refused (the caller's XML is not what it thinks)."""
        if name is None or not _first_name_is(xml, str(DomainName.parse(name))):
            try:
                found = parse_xml(xml).findtext("name")
            except XmlError as exc:
                raise InvalidSpec("domain XML", xml[:60], f"well-formed XML ({exc})") from None
            if not found:
                raise InvalidSpec("domain XML", xml[:60], "a <name> element")
            if name is not None and found != name:
                raise InvalidSpec("domain XML", xml[:60], f"the name {name} (it names {found})")
            name = found
        DomainName.parse(name)
        audit.info("%s: define domain %s", self.uri, name)
        with audited("define domain", self.uri, domain=name):
            dom = self._call(name, "define", lambda: self.raw.defineXML(xml))
        self._defined[name] = dom     # a start next asks no lookup of it (a round trip on a remote libvirt)
        return name                   # (the name the XML gives is the domain's: no call to ask it back)

    def start(self, name: str) -> None:
        """Start a defined domain; one that already runs is left as it is (converges).

        No state query first: libvirt refuses to start a running domain, and only then is the state asked, so a
        start is one call (a round trip on a remote libvirt) where it was two. A domain this connection defined
        starts through :meth:`define`'s handle, with no lookup; when that domain was undefined (or defined anew)
        since, the handle answers "no domain" and the name is looked up."""
        audit.info("%s: start domain %s", self.uri, name)
        dom = self._defined.pop(name, None)
        if dom is not None:
            try:
                self._start(name, dom, kept=True)
                return
            except _StaleHandle:
                pass
        self._start(name, self._lookup(name), kept=False)

    def _start(self, name: str, dom: Any, *, kept: bool) -> None:
        try:
            self._call(name, "start", lambda: dom.create())
        except LibvirtError as exc:
            if kept and exc.code == VIR_ERR_NO_DOMAIN:
                raise _StaleHandle from exc
            # a libvirt that stopped answering is not asked again (the question would wait out the bound too)
            if not isinstance(exc, LibvirtTimeout) and self._runs(name, dom):
                return      # nothing was started, nothing to record
            client_audit.failed("start domain", self.uri, exc, domain=name)
            raise
        except BaseException as exc:   # recorded whatever it is, as audited() does
            client_audit.failed("start domain", self.uri, exc, domain=name)
            raise
        client_audit.record("start domain", self.uri, "ok", domain=name)

    def _runs(self, name: str, dom: Any) -> bool:
        """After a refused start: does the domain run (then the start converged)? Drivers word that refusal
        differently (qemu: operation invalid, "domain is already running"; the test driver: internal error), so
        the state is asked rather than the error read; an error asking it leaves the start's own error standing."""
        try:
            return bool(self._call(name, "query state", lambda: dom.isActive()))
        except LibvirtError:
            return False

    def shutdown(self, name: str) -> None:
        """Ask the guest to shut down (ACPI); returns at once."""
        dom = self._lookup(name)
        if not self._call(name, "query state", lambda: dom.isActive()):
            return
        audit.info("%s: shutdown domain %s", self.uri, name)
        with audited("shutdown domain", self.uri, domain=name):
            self._call(name, "shutdown", lambda: dom.shutdown())

    def reboot(self, name: str) -> None:
        """Ask the guest to reboot (ACPI); returns at once. A domain that is not running is refused."""
        dom = self._lookup(name)
        if not self._call(name, "query state", lambda: dom.isActive()):
            raise LibvirtError(f"reboot failed on {self.uri}: domain {name} is not running (start it instead)",
                               domain=name, code=VIR_ERR_OPERATION_INVALID, uri=self.uri)
        audit.info("%s: reboot domain %s", self.uri, name)
        with audited("reboot domain", self.uri, domain=name):
            self._call(name, "reboot", lambda: dom.reboot(0))

    def destroy(self, name: str) -> bool:
        """Power off at once. Returns False when the domain was not running (or is gone)."""
        if not self.exists(name):
            return False
        dom = self._lookup(name)
        if not self._call(name, "query state", lambda: dom.isActive()):
            return False
        audit.info("%s: destroy domain %s", self.uri, name)
        with audited("destroy domain", self.uri, domain=name):
            self._call(name, "destroy", lambda: dom.destroy())
        return True

    def undefine(self, name: str, *, remove_storage: bool = False) -> list[str]:
        """Remove a domain's definition (NVRAM too), keeping its disks unless asked.

        Returns the disk paths removed. A domain that does not exist is a no-op.
        """
        libvirt = _import_libvirt()
        self._defined.pop(name, None)
        if not self.exists(name):
            return []
        disks = disk_files(self.xml(name, inactive=True)) if remove_storage else []
        dom = self._lookup(name)
        flags = (libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                 | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
        audit.info("%s: undefine domain %s", self.uri, name)
        with audited("undefine domain", self.uri, domain=name):
            self._undefine(name, dom, flags)
        removed: list[str] = []
        for path in disks:
            try:
                vol = self._bounded(name, f"look up volume {path}",
                                    functools.partial(self.raw.storageVolLookupByPath, path))
            except libvirt.libvirtError:
                log.warning("%s: disk %s of %s is not a libvirt volume; kept", self.uri, path, name)
                continue
            audit.info("%s: delete volume %s of %s", self.uri, path, name)
            with audited("delete volume", self.uri, domain=name, volume=path):
                self._delete_volume(name, path, vol)
            removed.append(path)
        return removed

    def _undefine(self, name: str, dom: Any, flags: int) -> None:
        try:
            self._call(name, "undefine", lambda: dom.undefineFlags(flags))
        except LibvirtError as exc:
            # Drivers without NVRAM or snapshot support reject the flags (the test driver: "unsupported
            # flags"); fall back to a plain undefine. The test driver has also failed that call with no
            # error set at all (code None, ~1 run in 6 of examples/vdi_pool.py, hosts torn down in
            # parallel threads): the plain undefine then says what is really wrong, if anything is.
            if exc.code not in (None, VIR_ERR_NO_SUPPORT, VIR_ERR_INVALID_ARG, VIR_ERR_OPERATION_UNSUPPORTED,
                                VIR_ERR_OPERATION_INVALID):
                raise
            self._call(name, "undefine", lambda: dom.undefine())

    def _delete_volume(self, name: str, path: str, vol: Any) -> None:
        self._call(name, f"delete volume {path}", lambda: vol.delete(0))

    # -- hot-plug -----------------------------------------------------------------------------
    def _device_flags(self, name: str, live: bool | None, config: bool) -> int:
        libvirt = _import_libvirt()
        flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG if config else 0
        if live is None:
            live = self.is_active(name)
        if live:
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        return int(flags)

    def _device_text(self, name: str, device: DeviceArg, *, detach: bool, live: bool) -> str:
        if isinstance(device, str):
            return device
        if not isinstance(device, _DEVICE_TYPES):
            raise InvalidSpec("device", type(device).__name__,
                              "device XML text, or an MdevHostdev, PciHostdev or HostdevInterface")
        if detach:
            # libvirt matches a detach by source, but the domain's own element (guest address, alias)
            # is what it wrote: send that back when the domain has the device.
            try:
                return Domain.from_xml(self.xml(name, inactive=not live)).detach_xml(device)
            except XmlError:
                pass
        return device_xml(device)

    def attach(self, name: str, device: DeviceArg, *, live: bool | None = None, config: bool = True) -> None:
        """Attach a device (``<hostdev>``, ``<interface>``: XML text or a device object) to a domain, live
        (default: when it runs) and/or persistently (``config``)."""
        dom = self._lookup(name)
        flags = self._device_flags(name, live, config)
        device_xml = self._device_text(name, device, detach=False, live=False)
        audit.info("%s: attach device to %s", self.uri, name)
        with audited("attach device", self.uri, domain=name, device=device_xml):
            self._call(name, "attach device", lambda: dom.attachDeviceFlags(device_xml, flags))

    def detach(self, name: str, device: DeviceArg, *, live: bool | None = None, config: bool = True) -> None:
        """Detach a device (XML text or a device object; matched by its source) live and/or persistently."""
        dom = self._lookup(name)
        flags = self._device_flags(name, live, config)
        libvirt = _import_libvirt()
        device_xml = self._device_text(name, device, detach=True, live=bool(flags & libvirt.VIR_DOMAIN_AFFECT_LIVE))
        audit.info("%s: detach device from %s", self.uri, name)
        with audited("detach device", self.uri, domain=name, device=device_xml):
            self._call(name, "detach device", lambda: dom.detachDeviceFlags(device_xml, flags))

    def set_metadata(self, name: str, element_xml: str, key: str, namespace: str, *, live: bool | None = None,
                     config: bool = True) -> None:
        """Replace the domain's ``<metadata>`` element of ``namespace`` (live and/or persistent)."""
        libvirt = _import_libvirt()
        dom = self._lookup(name)
        flags = self._device_flags(name, live, config)
        self._call(name, "set metadata", lambda: dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, element_xml,
                                                                 key, namespace, flags))

    # -- storage volumes and pools, networks, firmware (what the plan's pre-flight reads) --------------------

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
        # A network or pool deleted between the listing and its read (another caller, another test on a shared
        # libvirtd) is simply not there, as volumes and interfaces below: provisioning failed on it before.
        nets: dict[str, bool] = {}
        for n in self._call(None, "list networks", lambda: self.raw.listAllNetworks(0)):
            try:
                nets[str(n.name())] = bool(self._call(None, f"query network {n.name()}", n.isActive))
            except LibvirtError as exc:
                if exc.code not in _GONE:
                    raise
        pools: dict[str, PoolFacts] = {}
        for p in self._call(None, "list storage pools", lambda: self.raw.listAllStoragePools(0)):
            try:
                pools[str(p.name())] = self._pool_facts(p, refresh)
            except LibvirtError as exc:
                if exc.code not in _GONE:
                    raise
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
        if not active:
            return PoolFacts(name, False, target, {}, None)
        try:
            vols, available = self._pool_contents(p, name, refresh)
        except LibvirtError as exc:
            # stopped between the isActive above and this read (another caller; seen on the suite's shared
            # libvirtd: "storage pool ... is not active"): an inactive pool, as it would have been listed a
            # moment later. A pool undefined meanwhile raises its own "no storage pool", which facts() skips.
            if exc.code != VIR_ERR_OPERATION_INVALID or self._call(None, f"query storage pool {name}", p.isActive):
                raise
            return PoolFacts(name, False, target, {}, None)
        return PoolFacts(name, True, target, vols, available)

    def _pool_contents(self, p: Any, name: str, refresh: bool) -> tuple[dict[str, str], int]:
        """An active pool's volumes by name (their paths) and its free bytes."""
        if refresh:
            try:
                self._call(None, f"refresh storage pool {name}", lambda: p.refresh(0))
            except LibvirtError as exc:      # a pool busy with another job still lists what it had
                log.debug("%s: refresh of pool %s failed: %s", self.uri, name, exc)
        vols: dict[str, str] = {}
        for v in self._call(None, f"list volumes of {name}", lambda: p.listAllVolumes(0)):
            try:
                vols[str(v.name())] = str(self._call(None, f"read volume of {name}", v.path))
            except LibvirtError as exc:  # deleted between the listing and this read (another caller)
                if exc.code != VIR_ERR_NO_STORAGE_VOL:
                    raise
        # info(): [state, capacity, allocation, available], in bytes
        return vols, int(self._call(None, f"query storage pool {name}", lambda: p.info())[3])

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

    # -- mobility: versions and host UUID, live migration (never retried: ``_once``), managed save ---------

    def host_facts(self) -> dict[str, Any]:
        """libvirt's and the hypervisor's versions (as ``major * 1e6 + minor * 1e3 + micro``) and the host UUID."""
        raw = self._call(None, "get versions", lambda: (self.raw.getLibVersion(), self.raw.getVersion(),
                                                        self.raw.getCapabilities()))
        lib, hv, caps = raw
        uuid = parse_xml(caps).findtext("host/uuid")
        return {"libvirt": int(lib), "hypervisor": int(hv), "host_uuid": uuid}

    def _once(self, domain: str | None, what: str, fn: Callable[[], T]) -> T:
        """``fn`` once, libvirt errors translated: for calls that must never be repeated (a migration)."""
        import libvirt
        try:
            return fn()
        except libvirt.libvirtError as exc:
            raise self._translate(exc, domain, what) from exc

    def migrate(self, name: str, dest_uri: str, *, dest_xml: str, persist_xml: str, live: bool = True,
                bandwidth_mib: int | None = None, max_downtime_ms: int | None = None,
                on_job: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 0.25) -> None:
        """Migrate a running domain peer-to-peer to ``dest_uri`` (as this host's libvirtd reaches it), defined
        there from ``persist_xml`` and undefined here. ``on_job`` gets the job's statistics while it runs.

        On failure libvirt resumes the domain here and the destination's incoming QEMU is gone."""
        import libvirt
        if not isinstance(dest_uri, str) or not dest_uri or not dest_uri.isprintable():
            raise InvalidSpec("destination libvirt URI", dest_uri, "a URI such as qemu+ssh://host/system")
        dom = self._lookup(name)
        if max_downtime_ms is not None:
            # the vGPU's framebuffer dominates the stop-and-copy phase: the default 300 ms rarely converges
            self._call(name, "set maximum downtime", lambda: dom.migrateSetMaxDowntime(int(max_downtime_ms), 0))
        flags = (libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_PERSIST_DEST
                 | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE | (libvirt.VIR_MIGRATE_LIVE if live else 0))
        params: dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: dest_xml,
                                  libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: persist_xml}
        if bandwidth_mib is not None:
            params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = int(bandwidth_mib)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(poll_s):
                try:
                    stats = dom.jobStats()
                except libvirt.libvirtError:  # the job ended, or the domain went away: the migrate call will say
                    log.debug("job statistics of %s not available", name, exc_info=True)
                    continue
                if stats and on_job is not None and stats.get("type", 0) != 0:
                    on_job(dict(stats))

        watcher = threading.Thread(target=watch, name=f"vgpuvirt-migrate-{name}", daemon=True)
        audit.info("%s: migrate domain %s to %s", self.uri, name, dest_uri)
        try:
            with audited("migrate domain", self.uri, domain=name):
                watcher.start()
                self._once(name, f"migrate to {dest_uri}", lambda: dom.migrateToURI3(dest_uri, params, flags))
        finally:
            done.set()
            watcher.join()

    def managed_save(self, name: str) -> None:
        """Save a running domain's state to disk and stop it (libvirt's managed save); a start restores it."""
        dom = self._lookup(name)
        audit.info("%s: managed save of domain %s", self.uri, name)
        with audited("managed save domain", self.uri, domain=name):
            self._once(name, "managed save", lambda: dom.managedSave(0))

    def has_managed_save(self, name: str) -> bool:
        dom = self._lookup(name)
        return bool(self._call(name, "query managed save", lambda: dom.hasManagedSaveImage(0)))
