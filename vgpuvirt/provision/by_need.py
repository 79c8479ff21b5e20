"""Placement for one vGPU on one host, for callers that manage one device at a time (the Ansible
``vgpu_mdev`` module, scripts): the same ranking and capacity model as :func:`~.placement.place`,
limited to one kind of place and, optionally, one GPU or one parent/VF. Pure: the inventory is read,
nothing is changed (not even the caller's objects).
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpuvirt.errors import NoCapacity
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.placement import Assignment, place
from vgpuvirt.provision.request import TypeProfile, VgpuRequest, VmRequest, fit, smallest_key
from vgpuvirt.provision.state import host_state
from vgpuvirt.services.inventory.read import Inventory
from vgpuvirt.usage import GpuUse


def place_one(inv: Inventory, req: VgpuRequest, *, kind: GpuUse | None = None, where: PciAddress | None = None,
              vm: str = "vm", domains: Iterable[tuple[str, str]] = ()) -> Assignment:
    """Where one vGPU for ``req`` goes on the inventoried host: only places of ``kind`` (``mdev``,
    ``vendor-vf``, ...), and only at ``where`` (a GPU, or one parent/VF) when given. Raises NoCapacity
    with every GPU's reason when nothing fits."""
    hs = host_state(inv, domains)
    for g in hs.gpus:
        g.slots = [s for s in g.slots if (kind is None or s.kind == kind)
                   and (where is None or where in (s.address, g.address))]
    assignments = place([VmRequest(name=vm, gpus=(req,), start=False)], {hs.name: hs}).assignments
    if not assignments:
        raise NoCapacity(inv.host, vm, f"no place for {req.describe()}")
    return assignments[0]


def profile_at(inv: Inventory, address: PciAddress, type_id: str) -> TypeProfile | None:
    """The type profile placement uses for ``type_id`` at a parent or VF (to match an existing vGPU
    against a request), or None."""
    for g in host_state(inv).gpus:
        for s in g.slots:
            if s.address == address and type_id in s.profiles:
                return s.profiles[type_id]
    return None


def smallest_fitting_type(inv: Inventory, req: VgpuRequest, address: PciAddress) -> str | None:
    """The id of the smallest type offered at ``address`` that satisfies ``req``, or None."""
    profiles = [p for g in host_state(inv).gpus for s in g.slots if s.address == address
                for p in s.profiles.values() if fit(req, p) is None]
    return min(profiles, key=smallest_key).id if profiles else None
