"""How a GPU is used: the one vocabulary (model level: imports nothing of vgpuvirt).

:class:`GpuUse` names what a GPU, or a device made from it, is used as. Inventory, capacity, placement,
provenance and the simulator's referee compare these members, never strings. Its members are strings whose values
are the words the JSON contracts already print (plan ``kind``, provenance ``kind``), so output is unchanged.

Two contracts spell some uses with older words, kept at their edge:

* the capacity ``mode`` of ``inventory --json`` / metrics (``mdev-vgpu``, ``vf-vgpu``): :attr:`GpuUse.capacity_word`
  and :meth:`GpuUse.from_capacity_word`;
* the inventory ``backend`` of a GPU (what it *offers*, finer than a use: mdev on the PF or on its SR-IOV VFs):
  :class:`Backend`, whose members say which use they serve (:attr:`Backend.use`).

User-facing config words (a request's ``mode``, a layout's ``mode``) stay the user's; they map to these where
they are read.
"""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    """A ``StrEnum`` on Python 3.10: a member is its word (``==``, ``str()``, f-strings, JSON)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class GpuUse(_Word):
    FREE = "free"                # nothing uses it
    WHOLE = "whole"              # full-GPU passthrough (with its other functions)
    MDEV = "mdev"                # an mdev vGPU (NVIDIA up to 16, on the PF or on a VF)
    VENDOR_VF = "vendor-vf"      # NVIDIA vGPU 17+: a vGPU type on an SR-IOV VF (current_vgpu_type)
    MIG = "mig"                  # MIG instances (compute, no vGPU)
    MIG_VGPU = "mig-vgpu"        # MIG-backed vGPUs
    GVTG = "gvtg"                # Intel GVT-g (mdev on a shared pool)
    VF = "vf"                    # a plain SR-IOV VF passed through (AMD MxGPU, Intel SR-IOV)
    NIC_VF = "nic-vf"            # a NIC's SR-IOV VF given to a VM

    #: A vGPU: a device made for the VM from a shared GPU (its type is sized). A plain attribute of each member,
    #: set below: placement asks it in its inner loops, where a property (or a lookup of ``GpuUse.X``, ~70 ns on
    #: Python 3.11) would cost more than the comparison.
    is_vgpu: bool

    @property
    def capacity_word(self) -> str:
        """The word of the capacity ``mode`` in JSON, metrics and tables."""
        return _CAPACITY_WORDS.get(self, str(self.value))

    @classmethod
    def from_capacity_word(cls, word: str) -> GpuUse:
        for use, w in _CAPACITY_WORDS.items():
            if w == word:
                return use
        return cls(word)


_CAPACITY_WORDS = {GpuUse.MDEV: "mdev-vgpu", GpuUse.VENDOR_VF: "vf-vgpu"}
for _u in GpuUse:
    _u.is_vgpu = _u in (GpuUse.MDEV, GpuUse.VENDOR_VF, GpuUse.MIG_VGPU, GpuUse.GVTG)
del _u


class Backend(_Word):
    """How a GPU can be shared, as inventory reports it (``backend``)."""

    MDEV = "mdev"                # mdev types on the PF
    MDEV_SRIOV = "mdev-sriov"    # mdev types on each SR-IOV VF (Ampere, vGPU <= 16)
    VENDOR_VFIO = "vendor-vfio"  # vGPU 17+: a type per VF, no mdev
    PASSTHROUGH = "passthrough"  # nothing to share: the whole GPU
    GVTG = "gvtg"                # Intel GVT-g
    SRIOV_VF = "sriov-vf"        # plain VFs (AMD MxGPU, Intel SR-IOV)

    @property
    def use(self) -> GpuUse:
        """The use of a device made on this backend."""
        return _BACKEND_USE[self]


_BACKEND_USE = {Backend.MDEV: GpuUse.MDEV, Backend.MDEV_SRIOV: GpuUse.MDEV, Backend.VENDOR_VFIO: GpuUse.VENDOR_VF,
                Backend.PASSTHROUGH: GpuUse.WHOLE, Backend.GVTG: GpuUse.GVTG, Backend.SRIOV_VF: GpuUse.VF}
