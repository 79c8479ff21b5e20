"""vgpuvirt: GPU-backed virtual machines on KVM/libvirt hosts.

The top-level names are the public API. They are imported lazily so that a user who only builds XML
(or an Ansible target with a minimal install) does not pay for paramiko, libvirt or the simulator.
"""

from __future__ import annotations

import importlib
from typing import Any

from vgpuvirt.errors import InvalidSpec, VgpuvirtError
from vgpuvirt.host import Host, LocalHost, Op, Snapshot
from vgpuvirt.model import DomainName, MacAddress, MdevTypeId, MdevUuid, PciAddress, VfCount, VgpuTypeId

__version__ = "0.1.0"

_LAZY = {
    "SSHHost": "vgpuvirt.host.ssh",
    "open_host": "vgpuvirt.hosts",
    "SimHost": "vgpuvirt.sim",
    "inventory": "vgpuvirt.services.inventory",
    "Inventory": "vgpuvirt.services.inventory",
    "MdevService": "vgpuvirt.services.mdev",
    "VendorVgpuService": "vgpuvirt.services.vendor_vgpu",
    "SriovService": "vgpuvirt.services.sriov",
    "check_assignable": "vgpuvirt.services.iommu",
    "prepare": "vgpuvirt.services.iommu",
    "release": "vgpuvirt.services.iommu",
    "build_domain": "vgpuvirt.xml",
    "Domain": "vgpuvirt.xml",
    "LibvirtConnection": "vgpuvirt.libvirt_conn",
    "plan": "vgpuvirt.provision",
    "apply": "vgpuvirt.provision",
    "teardown": "vgpuvirt.provision",
    "VmRequest": "vgpuvirt.provision",
    "VgpuRequest": "vgpuvirt.provision",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vgpuvirt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["DomainName", "Host", "InvalidSpec", "LocalHost", "MacAddress", "MdevTypeId", "MdevUuid", "Op",
           "PciAddress", "Snapshot", "VfCount", "VgpuTypeId", "VgpuvirtError", "__version__", *_LAZY]
