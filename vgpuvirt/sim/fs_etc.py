"""Where the simulated host keeps its files outside sysfs (``/etc/modprobe.d``, vgpuvirt's own state, the
simulated package database), and the check of a vGPU manager version; :class:`~vgpuvirt.sim.fs.SimFs` shows
them, the FUSE mount and the emulated tools write them."""

from __future__ import annotations

import re

MODPROBE_DIR = "/etc/modprobe.d"
STATE_DIR = "/var/lib/vgpuvirt"
#: The simulated package database: ``driver_version`` there is the vGPU manager installed on disk.
PACKAGE_DIR = "/var/lib/vgpuvirt-sim"
DRIVER_FILE = f"{PACKAGE_DIR}/driver_version"
_DRIVER_VERSION = re.compile(r"^[0-9]{1,4}(\.[0-9]{1,4}){1,3}\Z")


def check_driver_version(text: str) -> str:
    """A vGPU manager version as nvidia-smi prints it (``580.95.05``); anything else is refused."""
    v = text.strip()
    if not _DRIVER_VERSION.match(v):
        raise ValueError(f"not a driver version: {text!r} (expected digits and dots, e.g. 580.95.05)")
    return v
