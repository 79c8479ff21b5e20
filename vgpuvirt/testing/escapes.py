"""A sysfs tree with symlinks planted to lead out of it: what the agent's confinement is tested against.

:func:`plant_escapes` builds, below ``base``, a tree ``root`` (one GPU with an mdev type, linked the way
real sysfs links it: ``/sys/bus/pci/devices/X -> ../../../devices/pci0000:00/X``) and a directory
``outside`` standing for the rest of the host (``/etc``). Links leading out of ``root`` are planted at every
level: a type's ``create``, a type directory, a device directory, ``/sys/class`` itself. Every file under
``outside`` holds :data:`MARK` so that a test can tell a read that escaped, and is compared before and
after to tell a write that escaped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MARK = "outside-the-root\n"
GPU = "0000:3b:00.0"
DEV = f"/sys/bus/pci/devices/{GPU}"
#: the type whose ``create`` is a link to a file outside the root
LEAF_TYPE = f"{DEV}/mdev_supported_types/nvidia-1"
#: a type directory that is a link to a directory outside the root
DIR_TYPE = f"{DEV}/mdev_supported_types/nvidia-2"
#: a device directory (as /sys/bus/pci/devices/X is) that is a link out of the root
OUT_DEV = "/sys/bus/pci/devices/0000:af:00.0"
#: a link out of the root high up: /sys/class
OUT_CLASS = "/sys/class/mdev_bus"


@dataclass(frozen=True)
class Planted:
    root: Path       # the sysfs root to hand to a Host
    outside: Path    # what must stay unread and unchanged

    def outside_files(self) -> dict[str, str]:
        return {str(p.relative_to(self.outside)): p.read_text() for p in sorted(self.outside.rglob("*"))
                if p.is_file()}


def plant_escapes(base: Path) -> Planted:
    root, outside = base / "root", base / "outside"
    real_dev = root / "sys/devices/pci0000:00" / GPU
    types = real_dev / "mdev_supported_types"
    for t in ("nvidia-0", "nvidia-1"):
        (types / t).mkdir(parents=True)
        (types / t / "available_instances").write_text("4\n")
        (types / t / "name").write_text(f"GRID {t}\n")
    (types / "nvidia-0" / "create").write_text("")
    (real_dev / "vendor").write_text("0x10de\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(f"../../../devices/pci0000:00/{GPU}", root / DEV.lstrip("/"))   # as sysfs links it: inside
    # the outside world: a passwd-like file, a type directory, a device directory, a class directory
    (outside / "etc").mkdir(parents=True)
    (outside / "etc/passwd").write_text(MARK)
    for d in ("type", "dev", "class/0000:3b:00.0"):
        (outside / d).mkdir(parents=True)
    for f in ("type/create", "type/available_instances", "type/name", "dev/vendor", "dev/remove",
              "class/0000:3b:00.0/vendor"):
        (outside / f).write_text(MARK)
    os.symlink(outside / "etc/passwd", types / "nvidia-1" / "create")        # the final component
    os.symlink(outside / "type", types / "nvidia-2")                          # a directory component
    os.symlink(os.path.relpath(outside / "dev", root / "sys/bus/pci/devices"), root / OUT_DEV.lstrip("/"))
    (root / "sys/class").mkdir()
    os.symlink(outside / "class", root / OUT_CLASS.lstrip("/"))               # high up, absolute
    return Planted(root, outside)
