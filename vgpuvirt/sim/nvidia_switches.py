"""The simulated NVIDIA GPU-wide switches: heterogeneous mode, MIG mode and GPU instances."""

from __future__ import annotations

import errno

from vgpuvirt.sim.devices import Gpu, ModelCore
from vgpuvirt.sim.kstrto import oserror


class NvidiaSwitches:
    """What ``nvidia-smi`` changes on one physical GPU (a :class:`SimModel` mixin)."""

    def set_heterogeneous(self: ModelCore, gpu: Gpu, on: bool) -> None:
        if on and not gpu.table.heterogeneous:
            raise oserror(errno.EOPNOTSUPP)
        if self.gpu_has_vgpus(gpu) or gpu.mig_enabled:
            raise oserror(errno.EBUSY)
        gpu.heterogeneous = on
        self.bump()

    def set_mig(self: ModelCore, gpu: Gpu, on: bool) -> None:
        if not gpu.table.mig_profiles:
            raise oserror(errno.EOPNOTSUPP)
        if self.gpu_has_vgpus(gpu):
            raise oserror(errno.EBUSY)
        gpu.mig_enabled = on
        if not on:
            gpu.gpu_instances.clear()
        self.bump()

    def create_gi(self: ModelCore, gpu: Gpu, profile_id: int) -> int:
        prof = next((p for p in gpu.table.mig_profiles if p.id == profile_id), None)
        if prof is None:
            raise oserror(errno.EINVAL)
        if not gpu.mig_enabled:
            raise oserror(errno.EOPNOTSUPP)
        slices = {p.name: p.slices for p in gpu.table.mig_profiles}
        used = sum(slices[p] for p in gpu.gpu_instances.values())
        same = sum(1 for p in gpu.gpu_instances.values() if p == prof.name)
        if used + prof.slices > gpu.table.compute_slices or same >= prof.max:
            raise oserror(errno.ENOSPC)
        gi = 1
        while gi in gpu.gpu_instances:
            gi += 1
        gpu.gpu_instances[gi] = prof.name
        self.bump()
        return gi

    def destroy_gi(self: ModelCore, gpu: Gpu, gi: int) -> None:
        if gi not in gpu.gpu_instances:
            raise oserror(errno.ENOENT)
        if any(g == gi for _, g in self._gpu_vgpus(gpu)):
            raise oserror(errno.EBUSY)
        del gpu.gpu_instances[gi]
        self.bump()
