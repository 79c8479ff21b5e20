"""IOMMU pre-flight (can these PCI devices be assigned to a VM?) and vfio-pci binding.

:func:`check_assignable` reads the host ONCE (groups, and class/driver/reset/SR-IOV facts of every
PCI function) and applies the kernel's and libvirt's rules (see hostdata/iommu_examples.txt):

* a group is viable when every endpoint in it is unbound or bound to a driver that does not use
  the kernel DMA API (vfio-pci and its variants, pci-stub); bridges and root ports (class 0x06)
  never block;
* functions of the same slot in the same group (the GPU's HDMI audio, USB-C, UCSI) must go along;
* a group member used by another domain blocks (a VFIO group lives in one VM only);
* a PF with VFs enabled is not passed whole; a VF is not passed with (or under) its PF;
* a GPU hosting mdevs is not passed whole; a vGPU 17+ VF needs its vGPU type set first and keeps
  its ``nvidia`` driver (libvirt ``managed='no'``).

:func:`plan_prepare` says which endpoints of the groups go to vfio-pci and keeps their original drivers in
a :class:`BindingRecord`; :func:`vgpuvirt.change.driver.prepare_vfio` binds them (``driver_override`` +
unbind + ``drivers_probe``, never ``new_id``, which would grab every device with that id) through the change
engine, waiting until bound, rolling back on failure; :func:`release` restores them.
The record is the caller's to keep (``vgpuvirt iommu prepare --json`` prints it).
The pre-flight lives in :mod:`.check`, binding and release in :mod:`.vfio_binding`; this module
gathers their public names.
"""

from __future__ import annotations

from vgpuvirt.services.iommu.check import (
    CLASS_NAMES,
    DMA_SAFE,
    VFIO,
    AssignabilityReport,
    DeviceCheck,
    Member,
    check_assignable,
    read_patterns,
)
from vgpuvirt.services.iommu.vfio_binding import Binding, BindingRecord, PreparePlan, plan_prepare, release

__all__ = ["CLASS_NAMES", "DMA_SAFE", "VFIO", "AssignabilityReport", "Binding", "BindingRecord", "DeviceCheck",
           "Member", "PreparePlan", "check_assignable", "plan_prepare", "read_patterns", "release"]
