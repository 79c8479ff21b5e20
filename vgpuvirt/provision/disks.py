"""A VM's disk as asked: a path (``{name}`` templated, so each desktop gets its own) or a linked clone.

A :class:`ClonedDisk` is a qcow2 overlay of a golden image, created as a volume in a libvirt storage pool
(``virStorageVolCreateXML`` with a ``<backingStore>``), so a VDI pool of 40 desktops is 40 small files
that each hold only what that desktop wrote. Everything here is pure: the plan turns it into a
:class:`~vgpuvirt.provision.steps_storage.CreateVolume` step and a ``<disk>`` of the domain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.xml.parts import Disk
from vgpuvirt.xml.storage import VOLUME_FORMATS, Volume, check_name

PLACEHOLDER = "{name}"
_BRACES = re.compile(r"[{}]")


def expand(template: str, vm: str, what: str = "disk path") -> str:
    """``template`` with ``{name}`` replaced by the VM's name; any other brace is refused (a typo such
    as ``{nmae}`` must not become one path shared by every desktop)."""
    if not isinstance(template, str):
        raise InvalidSpec(what, template, f"a string, with {PLACEHOLDER} for the VM's name")
    out = template.replace(PLACEHOLDER, vm)
    if _BRACES.search(template.replace(PLACEHOLDER, "")):
        raise InvalidSpec(what, template, f"{PLACEHOLDER} as the only placeholder")
    return out


@dataclass(frozen=True)
class ClonedDisk:
    """A per-VM qcow2 linked clone of ``golden`` in libvirt storage pool ``pool``.

    ``name``: the volume name, ``{name}`` is the VM's (default ``{name}.qcow2``); ``golden``: the path of the
    golden image, a volume libvirt knows (put it in a pool's directory); ``capacity_gib``: the guest disk
    size, None for the golden image's own size; ``reserve_gib``: the free pool space each clone must find
    when planned (a clone starts at a few hundred KiB, then holds everything its desktop writes).
    """

    pool: str
    golden: str
    name: str = "{name}.qcow2"
    golden_format: str = "qcow2"
    capacity_gib: int | None = None
    reserve_gib: int = 1

    def __post_init__(self) -> None:
        check_name("storage pool name", self.pool)
        Volume("probe", backing=self.golden)                     # the golden path: absolute, printable
        if PLACEHOLDER not in self.name:
            raise InvalidSpec("cloned disk volume name", self.name,
                              f"a name with {PLACEHOLDER} in it, so that every VM gets its own volume")
        check_name("cloned disk volume name", expand(self.name, "vm", "cloned disk volume name"))
        if self.golden_format not in VOLUME_FORMATS:
            raise InvalidSpec("golden image format", self.golden_format, " | ".join(VOLUME_FORMATS))
        if self.capacity_gib is not None and (not isinstance(self.capacity_gib, int)
                                              or isinstance(self.capacity_gib, bool) or not 1 <= self.capacity_gib
                                              <= 65536):
            raise InvalidSpec("cloned disk capacity (GiB)", self.capacity_gib, "an integer 1..65536")
        if not isinstance(self.reserve_gib, int) or isinstance(self.reserve_gib, bool) \
                or not 0 <= self.reserve_gib <= 65536:
            raise InvalidSpec("cloned disk reserve (GiB)", self.reserve_gib, "an integer 0..65536")

    def volume_name(self, vm: str) -> str:
        return check_name("volume name", expand(self.name, vm, "cloned disk volume name"))

    def volume(self, vm: str) -> Volume:
        cap = self.capacity_gib * 1024**3 if self.capacity_gib is not None else None
        return Volume(self.volume_name(vm), "qcow2", self.golden, self.golden_format, cap)


DiskSpec = str | ClonedDisk


def check_disk(disk: object) -> None:
    """Refuse a bad disk request at construction (before any plan)."""
    if disk is None or isinstance(disk, ClonedDisk):
        return
    if not isinstance(disk, str):
        raise InvalidSpec("disk", disk, "a path (with {name} for the VM's name) or a ClonedDisk")
    Disk(expand(disk, "vm"))


def disk_for(disk: DiskSpec | None, vm: str, pool_dir: str | None = None) -> Disk | None:
    """The domain's ``<disk>``: the templated path, or the clone's path in its pool's directory."""
    if disk is None:
        return None
    if isinstance(disk, ClonedDisk):
        if pool_dir is None:
            raise InvalidSpec("cloned disk", disk.pool, "a storage pool whose directory libvirt reports "
                                                        "(plan with the host's libvirt facts)")
        return Disk(f"{pool_dir.rstrip('/')}/{disk.volume_name(vm)}", format="qcow2")
    return Disk(expand(disk, vm))
