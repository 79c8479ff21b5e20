"""The mobility part of :class:`vgpuvirt.libvirt_conn.LibvirtConnection` (a mixin): versions and host UUID
for the migration pre-checks, a peer-to-peer live migration with its job's progress, managed save.

A migration is never retried (``_once``): libvirt either finished it or resumed the domain on the source.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from vgpuvirt.audit import audited
from vgpuvirt.errors import InvalidSpec, LibvirtError
from vgpuvirt.xml.domain import parse_xml

log = logging.getLogger("vgpuvirt.libvirt")
audit = logging.getLogger("vgpuvirt.audit")
T = TypeVar("T")


class MigrationCalls:
    """Migration and managed save; mixed into LibvirtConnection."""

    uri: str
    if TYPE_CHECKING:  # provided by LibvirtConnection
        raw: Any

        def _call(self, domain: str | None, what: str, fn: Callable[[], T]) -> T: ...

        def _lookup(self, name: str) -> Any: ...

        def _translate(self, exc: Any, domain: str | None, what: str) -> LibvirtError: ...

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
