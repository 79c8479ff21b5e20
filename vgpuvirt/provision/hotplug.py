"""Hot-plug: give an existing VM one more GPU (:func:`attach_gpu`) or take one away (:func:`detach_gpu`).

``attach`` reads the host once (inventory, with libvirt's domains), places the request with the same
placement as provisioning (:func:`~vgpuvirt.provision.by_need.place_one`), makes the device (an mdev
with a UUID derived from the VM's name and its next free index, or a vGPU type on a vGPU 17+ VF; a
plain VF or a whole GPU needs nothing made: libvirt binds it to vfio-pci, ``managed='yes'``), attaches
it and records it in the VM's provenance metadata: the placed GPU's attachment
(:meth:`~vgpuvirt.provision.placement.Assignment.attachment`, as provisioning uses it) gives the step, the
hostdevs and the record. They run as steps on the one runner (:mod:`vgpuvirt.change.runner`): any failure
undoes what ran, in reverse (the record put back, devices detached, a vGPU created removed).

``detach`` detaches the device and then removes what vgpuvirt made for the VM, under the rules of
:mod:`.ownership`: an mdev only when its UUID is derived from this VM's name, a VF's vGPU type only when
the VM's metadata lists it and the VM held it, and never a device another domain (or the VM's other
definition, after a live-only or config-only detach) still uses. Detaching, removing and updating the
record are steps on the same runner: if one fails, what ran is undone (vGPUs made again, devices attached
again, the record put back), so the VM is as it was.

A domain vgpuvirt did not make gets no metadata (metadata is what makes teardown treat a domain as
vgpuvirt's): its mdevs are still recognised by their name-derived UUIDs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.device_removal import RemoveDevice
from vgpuvirt.change.domain import AttachDevice, DetachDevice, SetProvenance
from vgpuvirt.change.identity import MAX_GPUS_PER_VM, made_for, mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.runner import Runner, run_host
from vgpuvirt.change.step import DeviceStep, Step, step_from_meta
from vgpuvirt.errors import DeviceNotFound, InvalidSpec, NoCapacity
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress
from vgpuvirt.provision.by_need import place_one
from vgpuvirt.provision.ownership import domain_refs, judge
from vgpuvirt.provision.request import VgpuRequest
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.vgpu.mdev_state import active_from_snapshot
from vgpuvirt.usage import GpuUse
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.hostdev import GpuDevice, HostdevInterface, MdevHostdev
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.refs import domain_device_refs


@dataclass
class HotplugResult:
    vm: str
    host: str
    action: str                                          # attach | detach
    devices: list[str] = field(default_factory=list)     # what was attached / detached
    type: str | None = None
    type_name: str | None = None
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)        # devices left on the host, and why
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "host": self.host, "action": self.action, "devices": self.devices,
                "type": self.type, "type_name": self.type_name, "created": self.created, "removed": self.removed,
                "left": self.left, "notes": self.notes}


def _label(d: GpuDevice) -> str:
    return d.label()


def _next_index(host: str, vm: str, taken: set[MdevUuid]) -> int:
    for i in range(MAX_GPUS_PER_VM):
        if mdev_uuid_for(vm, i) not in taken:
            return i
    raise NoCapacity(host, vm, f"the VM already has the {MAX_GPUS_PER_VM} vGPUs vgpuvirt can name for it")


def _can_hotplug(conn: LibvirtConnection) -> None:
    if not conn.supports_hotplug:
        # not "libvirt URI" (the CLI says "--connect" for that): the URI may be the host's default, not given
        raise InvalidSpec("libvirt driver for hot-plug", conn.uri, "a driver that can attach and detach devices "
                                                                   "(libvirt's test driver cannot; --connect one "
                                                                   "that can): nothing was changed")


def attach_gpu(host: Host, conn: LibvirtConnection, vm: str, req: VgpuRequest, *, live: bool | None = None,
               config: bool = True, wait_timeout: float = 10.0, dry_run: bool = False) -> HotplugResult:
    """Place, make and attach one GPU for ``req`` to the existing domain ``vm``; undo it all on failure.
    ``dry_run``: place it and say what would be made and attached; change nothing."""
    from vgpuvirt.services.inventory.read import inventory

    if not conn.exists(vm):
        raise DeviceNotFound(host.name, vm, f"no domain {vm} on {conn.uri}")
    _can_hotplug(conn)
    pairs = list(conn.domain_xml_pairs())
    inv = inventory(host, domains=pairs)
    a = place_one(inv, req, vm=vm, domains=pairs)
    own = dict(pairs)[vm]
    uuid = None
    if a.kind is GpuUse.MDEV:
        taken = set(domain_device_refs(own).mdevs) | {m.uuid for m in inv.mdevs}
        uuid = mdev_uuid_for(vm, _next_index(host.name, vm, taken))
    att = a.attachment(uuid, with_audio=req.with_audio)
    result = HotplugResult(vm, host.name, "attach", [_label(d) for d in att.devices], a.type.id, a.type.name)
    result.created = [att.step.describe()] if att.step is not None else []
    # the device, then libvirt's attach of each of its hostdevs, then its record: undone in reverse by the runner
    steps: list[Step] = [att.step] if att.step is not None else []
    steps += [AttachDevice(host.name, vm, d, live, config) for d in att.devices]
    prov = Provenance.read(own)
    if prov is not None:
        steps.append(SetProvenance(host.name, vm, Provenance.of(prov.host or host.name, [*prov.gpus, att.entry]),
                                   prov, live, config))
    elif att.use is GpuUse.VENDOR_VF:
        result.notes.append(f"{vm} was not made by vgpuvirt, so the vGPU type on VF {a.slot} is not recorded "
                            "in it: detach leaves the type set (vgpuvirt gc finds it once no domain uses it)")
    if dry_run:
        result.notes.append("dry run: nothing was made or attached")
        return result
    run_host(host, steps, conn, what=f"attaching {req.describe()} to {vm}", wait_timeout=wait_timeout)
    return result


def _parse_device(spec: str) -> MdevUuid | PciAddress:
    try:
        return MdevUuid.parse(spec)
    except InvalidSpec:
        pass
    try:
        return PciAddress.parse(spec)
    except InvalidSpec:
        raise InvalidSpec("DEVICE", spec, "an mdev UUID or a PCI address of the VM's GPU") from None


def _key(d: GpuDevice) -> str:
    """Devices that go together: an mdev alone, a PCI card's functions (same slot) together."""
    if isinstance(d, MdevHostdev):
        return str(d.uuid)
    return str(d.address.device_slot)


def select_devices(dom: Domain, device: str | None) -> list[GpuDevice]:
    """The devices ``detach`` acts on: the one named (a whole GPU with its other functions), or the VM's only
    GPU when none is named."""
    devs = [d for d in dom.hostdevs() if not isinstance(d, HostdevInterface) or device is not None]
    groups: dict[str, list[GpuDevice]] = {}
    for d in devs:
        groups.setdefault(_key(d), []).append(d)
    if device is None:
        if len(groups) != 1:
            have = ", ".join(_label(g[0]) for g in groups.values()) or "none"
            raise InvalidSpec("DEVICE", None, f"one of the VM's GPU devices ({have})")
        return next(iter(groups.values()))
    want = _parse_device(device)
    for d in devs:
        if (isinstance(d, MdevHostdev) and d.uuid == want) or (not isinstance(d, MdevHostdev) and d.address == want):
            if isinstance(d, MdevHostdev) or d.address.function != 0:
                return [d]
            return groups[_key(d)]
    raise InvalidSpec("DEVICE", device, f"a GPU device of domain {dom.name} (mdev UUID or PCI address)")


def _source(d: GpuDevice) -> str:
    return str(d.uuid) if isinstance(d, MdevHostdev) else str(d.address)


def _entry_target(e: Any) -> str:
    return str(e.get("uuid") or e.get("vf") or e.get("address") or "")


def detach_gpu(host: Host, conn: LibvirtConnection, vm: str, device: str | None = None, *,
               live: bool | None = None, config: bool = True, wait_timeout: float = 10.0,
               dry_run: bool = False) -> HotplugResult:
    """Detach a GPU device from ``vm`` and remove what vgpuvirt made for it (see the module docstring).
    ``dry_run``: say which devices would be detached; change nothing."""
    if not conn.exists(vm):
        raise DeviceNotFound(host.name, vm, f"no domain {vm} on {conn.uri}")
    _can_hotplug(conn)
    active = conn.is_active(vm)
    views_before = conn.xml_views().get(vm, (conn.xml(vm),))
    dom = Domain.from_xml(conn.xml(vm, inactive=not (active and live is not False)))
    chosen = select_devices(dom, device)
    sources = {_source(d) for d in chosen}
    prov = Provenance.read(views_before[0])
    steps: list[DeviceStep] = []
    guessed: set[str] = set()      # mdevs whose parent and type are unknown: a rollback cannot make them again
    for e in (prov.gpus if prov is not None else ()):
        made = step_from_meta(host.name, vm, e)
        if made is not None and made.target in sources:
            steps.append(made)
    unrecorded = [d.uuid for d in chosen if isinstance(d, MdevHostdev) and made_for(d.uuid, vm)
                  and not any(s.target == str(d.uuid) for s in steps)]
    found: dict[MdevUuid, tuple[str, str]] = {}
    if unrecorded and not dry_run:
        # A domain without metadata (not made by vgpuvirt): the name-derived UUID is the creation record. The
        # VM's XML cannot tell parent and type, which a rollback needs to make the vGPU again: the host can.
        found = active_from_snapshot(host.read([p for u in unrecorded
                                                 for p in (sysfs.mdev(u), sysfs.mdev(u, "mdev_type"))]))
    for u in unrecorded:
        parent, type_id = found.get(u, ("", ""))
        if parent and type_id:
            steps.append(CreateMdev(host.name, vm, u, PciAddress.parse(parent), MdevTypeId.parse(type_id)))
        else:          # gone already, or a dry run: removal needs the UUID only
            steps.append(CreateMdev(host.name, vm, u, PciAddress(0, 0, 0, 0), MdevTypeId.parse("vfio-unknown")))
            guessed.add(str(u))
    result = HotplugResult(vm, host.name, "detach", [_label(d) for d in chosen])
    mine = {s.target for s in steps}
    result.left += [f"vGPU {d.uuid}: not made by vgpuvirt for {vm} (no record, UUID not derived from the name): "
                    "left on the host" for d in chosen if isinstance(d, MdevHostdev) and str(d.uuid) not in mine]
    if dry_run:
        result.notes.append("dry run: nothing was detached or removed (vGPUs made for the VM are removed once "
                            "no other domain uses them)")
        return result
    runner = Runner(host, conn, wait_timeout=wait_timeout)
    try:
        # A whole GPU leaves with all its functions or not at all: a refused function puts the others back.
        runner.run([DetachDevice(host.name, vm, d, live, config) for d in chosen], "detach")
        views = conn.xml_views()
        refs = domain_refs(views)
        still = refs.get(vm)
        refs[vm] = domain_refs({vm: views_before})[vm]
        removals: list[RemoveDevice] = []
        due: set[str] = set()          # still this VM's to remove (held elsewhere): keep its record
        for v in judge(vm, steps, refs):
            if v.refusal is not None:
                result.left.append(v.refusal)
                if v.blocks:
                    due.add(v.step.target)
            elif still is not None and v.step.used_by(still):
                result.left.append(f"{v.step.target}: still in {vm}'s other definition (live or persistent; "
                                   "detached from one only): left in place")
            else:
                removals.append(RemoveDevice(host.name, vm, v.step, remake=v.step.target not in guessed))
        after: list[Step] = list(removals)
        if prov is not None:
            in_use = {str(x) for x in (*still.mdevs, *still.pci)} if still is not None else set(sources)
            # Drop the records of devices the VM no longer has, unless removing them is still due.
            keep = [e for e in prov.gpus if _entry_target(e) not in sources or _entry_target(e) in in_use
                    or _entry_target(e) in due]
            if len(keep) != len(prov.gpus):
                after.append(SetProvenance(host.name, vm, Provenance.of(prov.host or host.name, keep), prov, live,
                                           config))
        # the removals and the record, or (any failing) none of it and the devices attached again
        runner.run(after, "remove")
    except Exception as exc:  # every failure, even a bug, must trigger the rollback
        raise runner.fail(exc, f"detaching from {vm}") from exc
    result.removed = [r.removed() for r in removals]
    return result
