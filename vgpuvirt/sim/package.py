"""The simulated vGPU manager package, on a live FUSE mount: ``vgpuvirt sim install-driver``.

A real upgrade installs the new package, and the host reports the new version once the old kernel module is gone
(a reboot). The simulated host keeps the installed version in its package database
(:data:`~vgpuvirt.sim.fs_etc.DRIVER_FILE`); its next reboot loads it (:meth:`SimModel.reboot`).
"""

from __future__ import annotations

import os

from vgpuvirt.errors import HostError, InvalidSpec
from vgpuvirt.sim.fs_etc import DRIVER_FILE, check_driver_version
from vgpuvirt.sim.fuse import FSTYPE, SOURCE_PREFIX, mount_of


def install_driver(mountpoint: str, version: str) -> str:
    """Install vGPU manager ``version`` on the simulated host mounted on ``mountpoint``: a new file renamed over
    the package database's, as a package manager writes it. Returns the version written; the host reports it
    once rebooted (``sim reboot``)."""
    try:
        v = check_driver_version(version)
    except ValueError:
        raise InvalidSpec("driver version", version, "digits and dots, e.g. 580.95.05") from None
    m = mount_of(mountpoint)
    if m is None or m[0] != FSTYPE or not m[1].startswith(SOURCE_PREFIX):
        raise HostError("local", f"no simulated host mounted on {mountpoint}")
    path = os.path.join(mountpoint, DRIVER_FILE.lstrip("/"))
    tmp = f"{path}.new"
    try:
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(v + "\n")
        os.rename(tmp, path)
    except OSError as exc:
        raise HostError("local", f"cannot install driver {v} on {mountpoint}: {exc.strerror}") from exc
    return v
