"""Simulated GPU hosts with the kernel's semantics (a test double users can use too).

``SimHost.from_profile("t4x2")`` gives an in-process Host; :func:`materialize` writes a static
tree for ``--sysfs-root``; :mod:`vgpuvirt.sim.fuse` mounts a live one. Profiles are YAML files
(docs/sim.md).
"""

from vgpuvirt.sim.host import SimHost
from vgpuvirt.sim.profiles import Profile, ProfileError, list_profiles, load_profile


def materialize(profile: "Profile | str", dest_dir: str) -> int:
    """Write the profile's sysfs as plain files and relative symlinks below ``dest_dir``; return the count."""
    from vgpuvirt.sim.materialize import materialize as _materialize
    return _materialize(profile, dest_dir)


__all__ = ["Profile", "ProfileError", "SimHost", "list_profiles", "load_profile", "materialize"]
