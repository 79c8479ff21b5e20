"""The simulated NVIDIA GPU-wide switches: heterogeneous mode, MIG mode (with its pending state), GPU and
compute instances, GPU reset. Geometry rules are in :mod:`.mig_rules`.

MIG mode (MIG user guide "Enable MIG Mode"): refused while vGPUs exist on the GPU (or, to disable, while
GPU instances exist: INFERRED). On boards whose mode change needs a GPU reset (Ampere: A100, A30), when the
GPU cannot be reset now -- host processes hold it, or one of its VFs is bound to vfio-pci (assigned to a
VM: INFERRED) -- the new mode is *pending* and takes effect at the next GPU reset (``nvidia-smi -r``) or
reboot; otherwise, and always on Hopper (H100: "no longer requires a GPU reset"), at once.
"""

from __future__ import annotations

import errno

from vgpuvirt.sim import mig_rules as R
from vgpuvirt.sim.devices import Gpu, ModelCore
from vgpuvirt.sim.kstrto import oserror


def _busy_for_reset(core: ModelCore, gpu: Gpu) -> bool:
    vfs = [d for d in core.devices.values() if d.physfn == gpu.pf]
    return gpu.processes > 0 or any(d.driver == "vfio-pci" for d in vfs)


class NvidiaSwitches:
    """What ``nvidia-smi`` changes on one physical GPU (a :class:`SimModel` mixin)."""

    def set_heterogeneous(self: ModelCore, gpu: Gpu, on: bool) -> None:
        if on and not gpu.table.heterogeneous:
            raise oserror(errno.EOPNOTSUPP)
        if self.gpu_has_vgpus(gpu) or gpu.mig_enabled:
            raise oserror(errno.EBUSY)
        gpu.heterogeneous = on
        self.bump()

    def set_mig(self: ModelCore, gpu: Gpu, on: bool) -> bool:
        """Set MIG mode; True when it is only pending (a reset or reboot makes it current)."""
        if not gpu.table.mig_profiles:
            raise oserror(errno.EOPNOTSUPP)
        if self.gpu_has_vgpus(gpu) or (not on and gpu.gpu_instances):
            raise oserror(errno.EBUSY)
        if on == gpu.mig_enabled:
            gpu.mig_pending = None
        elif gpu.table.mig_reset and _busy_for_reset(self, gpu):
            gpu.mig_pending = on
        else:
            gpu.mig_enabled = on
            gpu.mig_pending = None
        self.bump()
        return gpu.mig_pending is not None

    def reset_gpu(self: ModelCore, gpu: Gpu) -> None:
        """``nvidia-smi -r``: refused while anything uses the GPU; a pending MIG mode becomes current."""
        if self.gpu_has_vgpus(gpu) or _busy_for_reset(self, gpu) or gpu.gpu_instances:
            raise oserror(errno.EBUSY)
        if gpu.mig_pending is not None:
            gpu.mig_enabled = gpu.mig_pending
            gpu.mig_pending = None
        self.bump()

    def create_gi(self: ModelCore, gpu: Gpu, profile_id: int, start: int | None = None) -> int:
        prof = next((p for p in gpu.table.mig_profiles if p.id == profile_id), None)
        if prof is None:
            raise oserror(errno.EINVAL)
        if not gpu.mig_enabled:
            raise oserror(errno.EOPNOTSUPP)
        gis = gpu.gi_table()
        if start is None:
            start = R.choose_start(gpu.table, gis, prof)
        elif start not in R.placements(gpu.table, prof):
            raise oserror(errno.EINVAL)
        if start is None or not R.fits_at(gpu.table, gis, prof, start):
            raise oserror(errno.ENOSPC)
        gi = R.new_gi_id(gpu.table, gis, prof, start)
        gpu.gpu_instances[gi] = prof.name
        gpu.gi_start[gi] = start
        self.bump()
        return gi

    def destroy_gi(self: ModelCore, gpu: Gpu, gi: int) -> None:
        if gi not in gpu.gpu_instances:
            raise oserror(errno.ENOENT)
        if gpu.compute_instances.get(gi) or any(g == gi for _, g in self._gpu_vgpus(gpu)):
            raise oserror(errno.EBUSY)
        del gpu.gpu_instances[gi]
        gpu.gi_start.pop(gi, None)
        gpu.compute_instances.pop(gi, None)
        self.bump()

    def create_ci(self: ModelCore, gpu: Gpu, gi: int, key: str) -> tuple[int, int, str]:
        """A compute instance in GI ``gi`` from a ``-cci`` item; (CI id, CI profile id, its name)."""
        if gi not in gpu.gpu_instances:
            raise oserror(errno.ENOENT)
        name = gpu.gpu_instances[gi]
        slices = next(p.slices for p in gpu.table.mig_profiles if p.name == name)
        k = R.ci_size_of(name, slices, key)
        if k is None:
            raise oserror(errno.EINVAL)
        cis = gpu.compute_instances.setdefault(gi, {})
        start = R.ci_choose_start(slices, cis, k)
        if start is None:
            raise oserror(errno.ENOSPC)
        ci = 0
        while ci in cis:
            ci += 1
        cis[ci] = (k, start)
        self.bump()
        return ci, R.CI_PROFILE_IDS[k], R.ci_name(name, slices, k)

    def destroy_ci(self: ModelCore, gpu: Gpu, gi: int, ci: int) -> None:
        if gi not in gpu.gpu_instances or ci not in gpu.compute_instances.get(gi, {}):
            raise oserror(errno.ENOENT)
        del gpu.compute_instances[gi][ci]
        self.bump()
