"""Simulated GPU hosts with the kernel's semantics (a test double users can use too).

``SimHost.from_profile("t4x2")`` gives an in-process Host; :func:`materialize` writes a static
tree for ``--sysfs-root``; :mod:`vgpuvirt.sim.fuse` mounts a live one. Profiles are YAML files
(docs/sim.md).
"""

# The submodule is imported first so that the package attribute ``materialize`` ends up being the
# function below, not the module (a later ``import vgpuvirt.sim.materialize`` does not rebind it).
from vgpuvirt.sim import materialize as _materialize_module
from vgpuvirt.sim.host import SimHost
from vgpuvirt.sim.profiles import Profile, ProfileError, list_profiles, load_profile

materialize = _materialize_module.materialize

__all__ = ["Profile", "ProfileError", "SimHost", "list_profiles", "load_profile", "materialize"]
