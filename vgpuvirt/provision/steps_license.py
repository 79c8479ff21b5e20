"""The license seed step kind: a licensed desktop's seed CD-ROM (:mod:`.license`), created as a libvirt storage
volume before the domain that mounts it is defined, and deleted by a rollback or a teardown.

The seed holds the client configuration token. The step keeps the image out of its ``repr`` and its
comparisons; its description, JSON, journal line, log line and audit record show the token's SHA-256 only.
Its provenance entry (``kind="license-seed"``, pool and volume) tells teardown which volume to delete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from vgpuvirt.change.step import DomainStep, HostFacts, Phase
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.provision.license import License, seed_iso, seed_volume_name
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.parts import CdRom
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.storage import Volume, check_name

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision.state import HostState

META_KIND = "license-seed"


@dataclass(frozen=True)
class CreateLicenseSeed(DomainStep):
    """Create the VM's license seed volume (an ISO image uploaded through libvirt) in a storage pool."""

    kind: ClassVar[str] = "create-license-seed"
    phase: ClassVar[Phase] = Phase.DOMAINS
    rank: ClassVar[int] = 1                 # with the defines, and before its own (plan order)
    host: str
    vm: str
    pool: str
    volume: str
    token_sha256: str
    guest: str
    image: bytes = field(repr=False, compare=False)

    @property
    def target(self) -> str:
        return f"{self.pool}/{self.volume}"

    def describe(self) -> str:
        return (f"create license seed {self.target} ({self.guest} guest, token sha256 {self.token_sha256}) "
                f"for {self.vm}")

    def kept(self) -> str:
        return f"license seed {self.target}"

    def details(self) -> dict[str, str]:
        return {"pool": self.pool, "volume": self.volume, "token_sha256": self.token_sha256, "guest": self.guest}

    def done_in(self, facts: HostFacts) -> bool:
        # The name is derived from the VM's: a volume of that name was made for this VM (by a cut run).
        return self.volume in (facts.volumes(self.pool) or ())

    def run(self, conn: LibvirtConnection) -> None:
        conn.upload_volume(self.pool, Volume(self.volume, "raw", capacity_bytes=len(self.image)), self.image,
                           what="license seed", token_sha256=self.token_sha256, vm=self.vm)

    def undo(self, conn: LibvirtConnection) -> str:
        gone = conn.delete_volume(self.pool, self.volume)
        return f"deleted license seed {self.target}" if gone else f"license seed {self.target} was already gone"


def _pool_dir(state: HostState, pool: str) -> str:
    facts = state.libvirt
    found = facts.pools.get(pool) if facts is not None else None
    # A missing pool is the pre-flight's to report (seed_problems); the XML still needs a path meanwhile.
    return found.target if found is not None and found.target else f"/nonexistent-pool/{pool}"


def seed_step(lic: License, host: str, vm: str, instance_id: str, disk_pool: str | None) -> CreateLicenseSeed:
    pool = lic.seed_pool(disk_pool)
    return CreateLicenseSeed(host, vm, pool, seed_volume_name(vm), lic.sha256, lic.guest,
                             seed_iso(lic, vm, instance_id))


def attach_seed(dom: Domain, step: CreateLicenseSeed, state: HostState) -> dict[str, str]:
    """Mount the seed read-only in ``dom`` (SATA on q35, IDE otherwise, on the first free target); returns
    the provenance entry that lets teardown find the volume again."""
    q35 = "q35" in (dom.machine or "")
    prefix, bus = ("sd", "sata") if q35 else ("hd", "ide")
    used = {t.get("dev") for t in dom.root.iterfind("devices/disk/target")}
    target = next(f"{prefix}{c}" for c in "bcdefghijklmnopqrstuvwxyz" if f"{prefix}{c}" not in used)
    path = f"{_pool_dir(state, step.pool).rstrip('/')}/{step.volume}"
    dom.add_element(CdRom(path, target=target, bus=bus).to_element())
    return {"kind": META_KIND, "pool": step.pool, "volume": step.volume, "token_sha256": step.token_sha256}


def add_seed(lic: License, host: str, vm: str, instance_id: str, state: HostState, dom: Domain,
             disk: object) -> CreateLicenseSeed:
    """The seed step for ``vm``, its CD-ROM mounted in ``dom`` and recorded in ``dom``'s provenance (the seed
    goes to the pool of the VM's linked clone ``disk`` unless the license names one)."""
    step = seed_step(lic, host, vm, instance_id, disk.pool if isinstance(disk, ClonedDisk) else None)
    entry = attach_seed(dom, step, state)
    prov = Provenance.of_domain(dom)
    Provenance.of(prov.host if prov is not None and prov.host else host,
                  [*(prov.gpus if prov is not None else ()), entry]).attach(dom)
    return step


def seed_problems(state: HostState, vm: str, step: CreateLicenseSeed) -> list[tuple[str, str, str]]:
    """What would make the seed fail to be created on ``state``'s libvirt (the plan's pre-flight), as the
    (host, VM, problem) triples :meth:`PreflightFailed.of` takes."""
    facts = state.libvirt
    if facts is None:
        return []
    pool = facts.pools.get(step.pool)
    if pool is None:
        return [(state.name, vm, f"storage pool '{step.pool}' for the license seed does not exist (pools: "
                                 f"{', '.join(sorted(facts.pools)) or 'none'}; --license-pool POOL)")]
    if not pool.active:
        return [(state.name, vm, f"storage pool '{step.pool}' for the license seed is not active (virsh "
                                 f"pool-start {step.pool})")]
    return []


def seed_volumes(entries: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    """(pool, volume) of each license seed recorded in a domain's provenance entries."""
    out = []
    for e in entries:
        if e.get("kind") == META_KIND:
            out.append((check_name("storage pool name", e.get("pool", "")),
                        check_name("volume name", e.get("volume", ""))))
    return out
