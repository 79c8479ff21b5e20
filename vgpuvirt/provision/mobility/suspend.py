"""Suspend and resume a VM with its vGPUs (libvirt managed save).

Suspend saves the running VM's state to disk and stops it; its vGPUs stay where they are, reserved for it:
its domain still names them (so ``gc`` keeps them and placement counts them as used). Resume finds them: an
mdev the host lost meanwhile (a reboot without mdevctl persistence) is created again, under the same UUID
and type, from the VM's ownership record, before libvirt restores the VM; a failure undoes what the resume
created (the engine's journal and rollback), and the VM stays saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.domain import StartDomain
from vgpuvirt.change.step import Step, step_from_meta
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import DomainName
from vgpuvirt.provision.mobility.checks import Side
from vgpuvirt.provision.plan import Plan
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.domain import Domain, parse_xml
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.refs import domain_device_refs


@dataclass
class SuspendResult:
    vm: str
    action: str                          # suspended | resumed
    kept: list[str] = field(default_factory=list)       # vGPUs left reserved (suspend) or found (resume)
    recreated: list[str] = field(default_factory=list)  # vGPUs a resume had to create again

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "action": self.action, "kept": self.kept, "recreated": self.recreated}


def suspend(side: Side, vm: str) -> SuspendResult:
    """Managed-save a running VM; its vGPUs stay reserved for it."""
    DomainName.parse(vm)
    conn = side.conn
    if not conn.exists(vm):
        raise InvalidSpec("VM", vm, f"a domain on {side.name}")
    if not conn.is_active(vm):
        raise InvalidSpec("VM", vm, "a running VM (it is not running: nothing to suspend)")
    if not conn.raw.lookupByName(vm).isPersistent():
        raise InvalidSpec("VM", vm, "a defined (persistent) VM: libvirt keeps a managed save only for those")
    xml = conn.xml(vm)
    refs = domain_device_refs(xml)
    conn.managed_save(vm)
    return SuspendResult(vm, "suspended", sorted({*_owned_mdevs(xml), *map(str, refs.pci)}))


def _owned_mdevs(xml: str) -> set[str]:
    """The VM's mdev vGPUs: those its domain names, and those its ownership record lists (as migrate counts)."""
    prov = Provenance.of_domain(Domain(parse_xml(xml)))
    return {str(u) for u in domain_device_refs(xml).mdevs} | {
        g["uuid"] for g in (prov.gpus if prov else ()) if g.get("kind") == GpuUse.MDEV and g.get("uuid")}


def resume(side: Side, vm: str) -> SuspendResult:
    """Restore a suspended VM, first creating again any of its vGPUs the host lost."""
    from vgpuvirt.provision.apply import apply

    DomainName.parse(vm)
    conn = side.conn
    if not conn.exists(vm) or not conn.has_managed_save(vm):
        raise InvalidSpec("VM", vm, f"a suspended VM on {side.name} (use `vm start` for one that is shut off)")
    xml = conn.xml(vm, inactive=True)
    owned = _owned_mdevs(xml)
    inv = inventory(side.host)
    present = {str(m.uuid) for m in inv.mdevs}
    prov = Provenance.of_domain(Domain(parse_xml(xml)))
    missing = sorted(u for u in owned if u not in present)
    steps: list[Step] = []
    for u in missing:
        entry = next((g for g in (prov.gpus if prov else ()) if g.get("kind") == GpuUse.MDEV and g.get("uuid") == u),
                     None)
        made = step_from_meta(side.name, vm, entry) if entry is not None else None
        if made is None:
            raise InvalidSpec("VM", vm, f"its vGPU {u} to exist on {side.name}, or an ownership record to "
                                        "create it again from (vgpuvirt did not make this VM)")
        steps.append(made)
    steps.append(StartDomain(side.name, vm))
    plan = Plan(steps=steps, kept=[], assignments=[], explain=[], vms=[], hosts=[side.name],
                absent_before={side.name: frozenset(missing)})
    apply(plan, {side.name: side.host}, {side.name: conn})
    kept = sorted(u for u in owned if u in present)
    return SuspendResult(vm, "resumed", kept, missing)


__all__ = ["SuspendResult", "resume", "suspend"]
