"""The simulated SR-IOV: ``sriov_numvfs`` and the VFs it creates and removes."""

from __future__ import annotations

import errno
from dataclasses import replace

from vgpuvirt.sim import kstrto
from vgpuvirt.sim.devices import Dev, ModelCore
from vgpuvirt.sim.kstrto import oserror
from vgpuvirt.sim.profiles import vf_address


class SriovVfs:
    """VF enable/disable in the kernel's order of checks (a :class:`SimModel` mixin)."""

    def set_numvfs(self: ModelCore, pf: Dev, raw: str) -> None:
        """sriov_numvfs_store (drivers/pci/iov.c), in the kernel's order of checks."""
        n = kstrto.kstrtou16(raw, 0)
        assert pf.spec.sriov is not None
        if n > pf.spec.sriov.totalvfs:
            raise oserror(errno.ERANGE)
        if n == pf.numvfs:
            return
        if pf.driver is None:
            raise oserror(errno.ENOENT)        # "no driver bound to device; cannot configure SR-IOV"
        if pf.driver not in (pf.spec.driver, "vfio-pci"):
            raise oserror(errno.ENOENT)        # "driver does not support SR-IOV configuration via sysfs"
        if n == 0:
            if pf.gpu is not None and pf.gpu.table.driver == "nvidia" and self.gpu_has_vgpus(pf.gpu):
                raise oserror(errno.EBUSY)     # INFERRED: the NVIDIA driver refuses while vGPUs exist
            self._disable_vfs(pf)
            return
        if pf.numvfs:
            raise oserror(errno.EBUSY)         # "%d VFs already enabled. Disable before enabling %d VFs"
        self._enable_vfs(pf, n)

    def _enable_vfs(self: ModelCore, pf: Dev, n: int) -> None:
        sriov = pf.spec.sriov
        assert sriov is not None
        parent_dir = pf.sysfs_dir.rsplit("/", 1)[0]
        for i in range(n):
            a = vf_address(pf.spec.address, sriov, i)
            vspec = replace(pf.spec, address=a, device=sriov.vf_device,
                            pci_class=sriov.vf_class if sriov.vf_class is not None else pf.spec.pci_class,
                            sriov=sriov, vgpu=None, iommu_group=None, boot_vga=False,
                            reset_method="flr" if pf.spec.reset_method else "")
            vf = Dev(addr=str(a), spec=vspec, sysfs_dir=f"{parent_dir}/{a}", driver=None, numa_node=pf.numa_node,
                     group=None, reset_method=vspec.reset_method, physfn=pf.addr, vf_index=i, gpu=pf.gpu)
            if self.iommu:
                vf.group = self._alloc_group()
            self.devices[vf.addr] = vf
            if pf.autoprobe and sriov.vf_driver and sriov.vf_driver in self.drivers:
                vf.driver = sriov.vf_driver
        pf.numvfs = n
        self.devices = dict(sorted(self.devices.items()))
        self.bump()

    def _disable_vfs(self: ModelCore, pf: Dev) -> None:
        for vf in self.vfs(pf):
            for m in self.mdevs_of(vf.addr):
                del self.mdevs[m.uuid]
            del self.devices[vf.addr]
        pf.numvfs = 0
        self.bump()
