"""vgpuvirt: GPU-backed virtual machines on KVM/libvirt hosts.

The top-level names are the public API. They are imported lazily so that a user who only builds XML
(or an Ansible target with a minimal install) does not pay for paramiko, libvirt or the simulator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vgpuvirt.errors import InvalidSpec, VgpuvirtError

if TYPE_CHECKING:
    from vgpuvirt.host import Host as Host
    from vgpuvirt.host import LocalHost as LocalHost
    from vgpuvirt.host import Op as Op
    from vgpuvirt.host import Snapshot as Snapshot
    from vgpuvirt.model import DomainName as DomainName
    from vgpuvirt.model import MacAddress as MacAddress
    from vgpuvirt.model import MdevTypeId as MdevTypeId
    from vgpuvirt.model import MdevUuid as MdevUuid
    from vgpuvirt.model import PciAddress as PciAddress
    from vgpuvirt.model import VfCount as VfCount
    from vgpuvirt.model import VgpuTypeId as VgpuTypeId

__version__ = "0.1.0"

# Even the host and model names wait for first use: `import vgpuvirt` runs before every CLI call, and the
# host package (with the agent's source) alone took 40 ms of a `vgpuvirt --help` that must take < 100 ms.
_LAZY = {
    "Host": "vgpuvirt.host",
    "LocalHost": "vgpuvirt.host",
    "Op": "vgpuvirt.host",
    "Snapshot": "vgpuvirt.host",
    "DomainName": "vgpuvirt.model",
    "MacAddress": "vgpuvirt.model",
    "MdevTypeId": "vgpuvirt.model",
    "MdevUuid": "vgpuvirt.model",
    "PciAddress": "vgpuvirt.model",
    "VfCount": "vgpuvirt.model",
    "VgpuTypeId": "vgpuvirt.model",
    "SSHHost": "vgpuvirt.host.ssh",
    "open_host": "vgpuvirt.hosts",
    "SimHost": "vgpuvirt.sim",
    "inventory": "vgpuvirt.services.inventory.read",
    "Inventory": "vgpuvirt.services.inventory.read",
    "MdevService": "vgpuvirt.change.mdev_service",
    "VendorVgpuService": "vgpuvirt.services.vgpu.vendor",
    "SriovService": "vgpuvirt.services.pci.sriov",
    "check_assignable": "vgpuvirt.services.iommu.api",
    "prepare_vfio": "vgpuvirt.change.driver",
    "set_vf_count": "vgpuvirt.change.sriov",
    "release": "vgpuvirt.services.iommu.api",
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


__all__ = ["InvalidSpec", "VgpuvirtError", "__version__", *_LAZY]
