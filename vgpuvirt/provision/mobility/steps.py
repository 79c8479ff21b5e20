"""The migration's own step kind, on the one engine (:mod:`vgpuvirt.change.runner`): the destination's
vGPUs are the usual CreateMdev / SetVfType steps, then this step moves the domain; the journal undoes the
reservation when it fails."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vgpuvirt.change.step import DomainStep, HostFacts, Phase
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.libvirt_conn import LibvirtConnection

JobProgress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class MigrateDomain(DomainStep):
    """Live-migrate the VM from the source's libvirtd to this step's host (peer-to-peer, persistent there,
    undefined on the source). Run on the destination's connection, after the host's reservation batch."""

    kind: ClassVar[str] = "migrate"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 1
    host: str
    vm: str
    xml: str = field(repr=False, compare=False)
    source_uri: str = ""
    peer_uri: str = ""                    # the destination as the source's libvirtd reaches it
    bandwidth_mib: int | None = None
    max_downtime_ms: int | None = None
    source: LibvirtConnection | None = field(default=None, repr=False, compare=False)
    on_job: JobProgress | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        extra = f", at most {self.bandwidth_mib} MiB/s" if self.bandwidth_mib else ""
        return f"live-migrate domain {self.vm} to {self.host}{extra}"

    def details(self) -> dict[str, str]:
        return {"peer_uri": self.peer_uri}

    def done_in(self, facts: HostFacts) -> bool:
        return False

    def run(self, conn: LibvirtConnection) -> None:
        if self.source is None:
            raise InvalidSpec("migration source", None, "the source host's libvirt connection")
        self.source.migrate(self.vm, self.peer_uri or conn.uri, dest_xml=self.xml, persist_xml=self.xml,
                            bandwidth_mib=self.bandwidth_mib, max_downtime_ms=self.max_downtime_ms,
                            on_job=self.on_job)

    def undo(self, conn: LibvirtConnection) -> str:
        # Only reached when a later step fails after the VM arrived: send it back where it came from.
        if self.source is None or not conn.exists(self.vm):
            return f"domain {self.vm} is not on {self.host}; nothing to move back"
        conn.migrate(self.vm, self.source_uri or self.source.uri, dest_xml=conn.xml(self.vm),
                     persist_xml=conn.xml(self.vm, inactive=True))
        return f"migrated domain {self.vm} back to its source"
