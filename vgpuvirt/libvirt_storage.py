"""What one libvirt connection offers a domain (networks, pools and their volumes, firmware), as
:meth:`vgpuvirt.libvirt_conn.LibvirtConnection.facts` reads it in one pass for the plan's pre-flight.

Per-VM disks are libvirt storage volumes: a linked clone is created in a pool with a ``<backingStore>`` of
the golden image (``virStorageVolCreateXML``; libvirt runs ``qemu-img create -b``) and deleted through the
pool again, so a remote host needs nothing but libvirt. Those calls are the connection's; the XML is built
and read in :mod:`vgpuvirt.xml.storage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpuvirt.xml.storage import FirmwareCaps


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
