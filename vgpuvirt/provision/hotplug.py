"""Hot-plug: give an existing VM one more GPU (:func:`attach_gpu`) or take one away (:func:`detach_gpu`).

``attach`` reads the host once (inventory, with libvirt's domains), places the request with the same
placement as provisioning (:func:`~vgpuvirt.provision.by_need.place_one`), makes the device (an mdev
with a UUID derived from the VM's name and its next free index, or a vGPU type on a vGPU 17+ VF; a
plain VF or a whole GPU needs nothing made: libvirt binds it to vfio-pci, ``managed='yes'``), attaches
it and records it in the VM's provenance metadata. Any failure undoes what the call did, in reverse:
devices attached are detached, a vGPU created is removed.

``detach`` detaches the device and then removes what vgpuvirt made for the VM, under the rules of
:mod:`.ownership`: an mdev only when its UUID is derived from this VM's name, a VF's vGPU type only when
the VM's metadata lists it and the VM held it, and never a device another domain (or the VM's other
definition, after a live-only or config-only detach) still uses.

A domain vgpuvirt did not make gets no metadata (metadata is what makes teardown treat a domain as
vgpuvirt's): its mdevs are still recognised by their name-derived UUIDs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.identity import MAX_GPUS_PER_VM, made_for, mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.step import DeviceStep, step_from_meta
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import DeviceNotFound, InvalidSpec, NoCapacity, ProvisioningError, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.provision.by_need import place_one
from vgpuvirt.provision.ownership import domain_refs, judge
from vgpuvirt.provision.request import VgpuRequest
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.hostdev import GpuDevice, HostdevInterface, MdevHostdev, PciHostdev
from vgpuvirt.xml.provenance import NAMESPACE, Provenance
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


def _write_provenance(conn: LibvirtConnection, vm: str, prov: Provenance, live: bool | None, config: bool) -> None:
    conn.set_metadata(vm, prov.metadata_xml(), "vgpuvirt", NAMESPACE, live=live, config=config)


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
    from vgpuvirt.services.inventory import inventory

    if not conn.exists(vm):
        raise DeviceNotFound(host.name, vm, f"no domain {vm} on {conn.uri}")
    _can_hotplug(conn)
    pairs = list(conn.domain_xml_pairs())
    inv = inventory(host, domains=pairs)
    a = place_one(inv, req, vm=vm, domains=pairs)
    own = dict(pairs)[vm]
    step: DeviceStep | None = None
    devices: list[GpuDevice]
    if a.kind == "mdev":
        taken = set(domain_device_refs(own).mdevs) | {m.uuid for m in inv.mdevs}
        uuid = mdev_uuid_for(vm, _next_index(host.name, vm, taken))
        step = CreateMdev(host.name, vm, uuid, a.slot, MdevTypeId.parse(a.type.id))
        devices = [MdevHostdev(step.uuid)]
        meta = step.meta()
    elif a.kind == "vendor-vf":
        step = SetVfType(host.name, vm, a.slot, VgpuTypeId.parse(a.type.id))
        devices = [PciHostdev.vgpu_vf(a.slot)]
        meta = step.meta()
    elif a.kind == "vf":
        devices, meta = [PciHostdev(a.slot)], {"kind": "vf", "address": str(a.slot)}
    else:
        funcs = a.functions if req.with_audio and a.functions else (a.slot,)
        devices, meta = [PciHostdev(f) for f in funcs], {"kind": "whole", "address": str(a.slot)}
    result = HotplugResult(vm, host.name, "attach", [_label(d) for d in devices], a.type.id, a.type.name)
    if dry_run:
        result.created = [step.describe()] if step is not None else []
        result.notes.append("dry run: nothing was made or attached")
        return result
    made: list[DeviceStep] = []
    attached: list[GpuDevice] = []
    try:
        if step is not None:
            out = apply_items(host, [step.item(wait_timeout)])[0]
            if not out.ok:
                raise out.error or DeviceNotFound(host.name, step.target, "the device was not made")
            made.append(step)
            result.created.append(step.describe())
        for d in devices:
            conn.attach(vm, d, live=live, config=config)
            attached.append(d)
        prov = Provenance.read(own)
        if prov is not None:
            _write_provenance(conn, vm, Provenance.of(prov.host or host.name, [*prov.gpus, meta]), live, config)
        elif isinstance(step, SetVfType):
            result.notes.append(f"{vm} was not made by vgpuvirt, so the vGPU type on VF {step.vf} is not recorded "
                                "in it: detach leaves the type set (vgpuvirt gc finds it once no domain uses it)")
    except BaseException as exc:
        rollback = _undo_attach(host, conn, vm, made, attached, live, config, wait_timeout)
        if isinstance(exc, VgpuvirtError):
            done = result.created + [f"attached {_label(d)} to {vm}" for d in attached]
            raise ProvisioningError(f"{host.name}: attaching {req.describe()} to {vm}: {exc}", completed=done,
                                    rollback=rollback, cause=exc) from exc
        raise
    return result


def _undo_attach(host: Host, conn: LibvirtConnection, vm: str, made: list[DeviceStep], attached: list[GpuDevice],
                 live: bool | None, config: bool, wait_timeout: float) -> list[str]:
    out: list[str] = []
    for d in reversed(attached):
        try:
            conn.detach(vm, d, live=live, config=config)
            out.append(f"detached {_label(d)} from {vm}")
        except VgpuvirtError as err:
            out.append(f"FAILED to detach {_label(d)} from {vm}: {err}")
    for s in reversed(made):
        try:
            res = apply_items(host, [s.undo_item(wait_timeout)])[0]
            out.append(s.undone() if res.ok else f"FAILED to undo {s.describe()}: {res.error}")
        except VgpuvirtError as err:
            out.append(f"FAILED to undo {s.describe()}: {err}")
    return out


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
    for e in (prov.gpus if prov is not None else ()):
        made = step_from_meta(host.name, vm, e)
        if made is not None and made.target in sources:
            steps.append(made)
    for d in chosen:
        if isinstance(d, MdevHostdev) and made_for(d.uuid, vm) and not any(s.target == str(d.uuid) for s in steps):
            # A domain without metadata (not made by vgpuvirt): the name-derived UUID is the creation record.
            # Removal needs the UUID only; parent and type are what the VM's XML cannot tell.
            steps.append(CreateMdev(host.name, vm, d.uuid, PciAddress(0, 0, 0, 0), MdevTypeId.parse("vfio-unknown")))
    result = HotplugResult(vm, host.name, "detach", [_label(d) for d in chosen])
    mine = {s.target for s in steps}
    result.left += [f"vGPU {d.uuid}: not made by vgpuvirt for {vm} (no record, UUID not derived from the name): "
                    "left on the host" for d in chosen if isinstance(d, MdevHostdev) and str(d.uuid) not in mine]
    if dry_run:
        result.notes.append("dry run: nothing was detached or removed (vGPUs made for the VM are removed once "
                            "no other domain uses them)")
        return result
    gone: list[GpuDevice] = []
    try:
        for d in chosen:
            conn.detach(vm, d, live=live, config=config)
            gone.append(d)
    except VgpuvirtError as exc:
        # A whole GPU leaves with all its functions or not at all: put back what did leave.
        back = []
        for d in reversed(gone):
            try:
                conn.attach(vm, d, live=live, config=config)
                back.append(f"attached {_label(d)} to {vm} again")
            except VgpuvirtError as err:
                back.append(f"FAILED to attach {_label(d)} to {vm} again: {err}")
        raise ProvisioningError(f"{host.name}: detaching from {vm}: {exc}",
                                completed=[f"detached {_label(d)}" for d in gone], rollback=back, cause=exc) from exc
    views = conn.xml_views()
    refs = domain_refs(views)
    still = refs.get(vm)
    refs[vm] = domain_refs({vm: views_before})[vm]
    todo: list[DeviceStep] = []
    due: set[str] = set()          # still this VM's to remove (held elsewhere, or removal failed): keep its record
    for v in judge(vm, steps, refs):
        if v.refusal is not None:
            result.left.append(v.refusal)
            if v.blocks:
                due.add(v.step.target)
        elif still is not None and v.step.used_by(still):
            result.left.append(f"{v.step.target}: still in {vm}'s other definition (live or persistent; detached "
                               "from one only): left in place")
        else:
            todo.append(v.step)
    for s, out in zip(todo, apply_items(host, [s.undo_item(wait_timeout) for s in todo], on_error="continue"),
                      strict=True):
        if out.ok:
            result.removed.append(s.undone())
        else:
            due.add(s.target)
            result.left.append(f"{s.target}: removal failed: {out.error}; still recorded in {vm}'s metadata")
    if prov is not None:
        in_use = {str(x) for x in (*still.mdevs, *still.pci)} if still is not None else set(sources)
        # Drop the records of devices the VM no longer has, unless removing them is still due.
        keep = [e for e in prov.gpus if _entry_target(e) not in sources or _entry_target(e) in in_use
                or _entry_target(e) in due]
        if len(keep) != len(prov.gpus):
            _write_provenance(conn, vm, Provenance.of(prov.host or host.name, keep), live, config)
    return result
