"""Open any Host from one string: ``local``, ``ssh://[user@]host[:port]``, ``sim:PROFILE[@NAME]``, ``capture:FILE``.

``sim:t4x2@a`` and ``sim:t4x2@b`` are two simulated hosts of one profile, each with its own state, told apart
by name (a fleet of identical simulated hosts).

This factory sits above vgpuvirt.host and vgpuvirt.sim (it knows every implementation), so neither layer
imports the other.
"""

from __future__ import annotations

import re

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import BaseHost

_SIM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")
_SSH_RE = re.compile(r"^ssh://(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9a-fA-F:]+\])"
                     r"(?::(?P<port>\d{1,5}))?/?$")


def open_host(spec: str = "local", *, sysfs_root: str | None = None, identity: str | None = None,
              known_hosts: str | None = None, sudo: bool = False, allow_unknown_hosts: bool = False) -> BaseHost:
    if spec == "local":
        from vgpuvirt.host.local import LocalHost
        return LocalHost(sysfs_root or "/")
    if spec.startswith("sim:"):
        if sysfs_root:
            raise InvalidSpec("--sysfs-root", sysfs_root, "no --sysfs-root with a sim: host (the profile is the tree)")
        from vgpuvirt.sim import SimHost
        profile, at, name = spec[4:].partition("@")
        if at and not _SIM_NAME.match(name):
            raise InvalidSpec("host", spec, "sim:PROFILE@NAME with a NAME of letters, digits, '.', '_', '-'")
        return SimHost.from_profile(profile, name=spec if at else None)
    if spec.startswith("capture:"):
        if sysfs_root:
            raise InvalidSpec("--sysfs-root", sysfs_root, "no --sysfs-root with a capture: host (it holds the tree)")
        if not spec[8:]:
            raise InvalidSpec("host", spec, "capture:FILE, a file written by `vgpuvirt capture -o FILE`")
        from vgpuvirt.host.replay import ReplayHost
        return ReplayHost(spec[8:])
    m = _SSH_RE.match(spec)
    if m:
        from vgpuvirt.host.ssh import SSHHost
        return SSHHost(m["host"].strip("[]"), port=int(m["port"] or 22), username=m["user"],
                       key_filename=identity, known_hosts=known_hosts, sudo=sudo,
                       sysfs_root=sysfs_root or "/", allow_unknown_hosts=allow_unknown_hosts)
    raise InvalidSpec("host", spec, "local, ssh://[user@]host[:port], sim:PROFILE, sim:PROFILE@NAME or capture:FILE")
