"""Interop that needs the host's GPUs (read once): a config resolved per GPU and regrouped by GPU index
(what mig-parted and the vGPU Device Manager select by), and KubeVirt's ``spec.configuration`` fragment
(``permittedHostDevices`` + ``mediatedDevicesConfiguration``) for a layout (docs/layouts.md, "Interop").

Pure over :class:`~vgpuvirt.layout.observe.GpuNow` lists (reading them is one round trip per host).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import yaml

from vgpuvirt.layout.interop import MIG_PARTED, NotExpressible, export_config, mig_profile_of
from vgpuvirt.layout.model import GpuEntry, GpuLayout, Layout, LayoutConfig, Selector, VgpuCount
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.layout.planner import want_vfs
from vgpuvirt.usage import GpuUse

KUBEVIRT = "kubevirt"
#: KubeVirt resource names: a vendor domain and the device's name with anything else than these as ``_``.
_RESOURCE_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
_VENDOR_DOMAINS = {"0x10de": "nvidia.com", "0x1002": "amd.com", "0x8086": "intel.com"}


def governed(config: LayoutConfig, gpus: Sequence[GpuNow]) -> list[tuple[GpuNow, GpuLayout]]:
    """Each GPU the config selects, with its layout, in index (PCI address) order."""
    chosen = config.resolve([(g.address, g.product, g.pci_id) for g in gpus])
    return [(g, chosen[g.address].layout) for g in sorted(gpus, key=lambda g: g.address) if g.address in chosen]


def _plain(g: GpuNow, lay: GpuLayout) -> GpuLayout:
    """Fields that only say what the mode already does on this GPU left out (a host's export spells them)."""
    if lay.sriov_vfs is not None and lay.sriov_vfs == want_vfs(g, replace(lay, sriov_vfs=None)):
        lay = replace(lay, sriov_vfs=None)
    if lay.sizing == "equal":       # the driver's default; the NVIDIA tools never change it
        lay = replace(lay, sizing=None)
    return lay


def as_is(gpus: Sequence[GpuNow], name: str = "current") -> LayoutConfig:
    """The host as it is, as a config selecting each GPU by its PCI address (what ``layout export`` says)."""
    return LayoutConfig(name, tuple(GpuEntry((Selector("address", str(g.address)),), g.layout()) for g in gpus))


def project(fmt: str, g: GpuNow) -> GpuLayout:
    """What the NVIDIA tool's own ``export`` says of a GPU as it is: mig-parted its MIG mode and GPU instances
    only; the vGPU Device Manager its vGPU counts by type name (the GPU instances they imply, nothing else)."""
    if fmt == MIG_PARTED:
        gis = tuple(sorted((g.budget.gpu_instances or {}).items()))
        return GpuLayout(mode="mig", mig_devices=gis, mig_exact=True) if g.mig_enabled else GpuLayout(mode="off")
    counts = g.counts()
    types = tuple(VgpuCount(g.short_name(t), counts[t]) for t in sorted(counts))
    implied: dict[str, int] = {}
    for v in types:
        if (gi := mig_profile_of(v.type)) is not None:
            implied[gi] = implied.get(gi, 0) + (v.count or 0)
    return GpuLayout(mode="mig-vgpu" if implied else "vgpu", mig_devices=tuple(implied.items()),
                     mig_exact=bool(implied), vgpu_devices=types)


def host_export(gpus: Sequence[GpuNow], fmt: str, name: str = "current") -> dict[str, Any]:
    """The host in ``fmt`` as that tool's ``export`` would print it (:func:`project`), its NVIDIA GPUs grouped
    by layout and selected by index (``all`` when they share one)."""
    nv = sorted((g for g in gpus if (g.pci_id or "").startswith("0x10de:")), key=lambda g: g.address)
    groups: dict[GpuLayout, list[int]] = {}
    for i, g in enumerate(nv):
        groups.setdefault(project(fmt, g), []).append(i)
    entries = tuple(GpuEntry((Selector("all"),) if len(idx) == len(nv) else tuple(Selector("index", i) for i in idx),
                             lay, vendor="nvidia") for lay, idx in groups.items())
    if not entries:
        return {"version": "v1", {"mig-parted": "mig-configs"}.get(fmt, "vgpu-configs"): {name: []}}
    return dict(yaml.safe_load(export_config(Layout((LayoutConfig(name, entries),)), fmt)))


def to_kubevirt(hosts: Mapping[str, Sequence[GpuNow]]) -> dict[str, Any]:
    """KubeVirt's fragment for the hosts as they are (:func:`kubevirt_configuration` of their exports; GPUs
    KubeVirt cannot take are left out)."""
    return kubevirt_configuration({h: governed(as_is(gpus), gpus) for h, gpus in hosts.items()}, strict=False)


def by_index(config: LayoutConfig, gpus: Sequence[GpuNow]) -> LayoutConfig:
    """``config`` as this host resolves it on its NVIDIA GPUs (what mig-parted and the vGPU Device Manager
    see), one entry per distinct layout selecting them by index among the NVIDIA GPUs (``all`` when every
    one shares one layout)."""
    ordered = sorted((g for g in gpus if (g.pci_id or "").startswith("0x10de:")), key=lambda g: g.address)
    index = {g.address: i for i, g in enumerate(ordered)}
    groups: dict[GpuLayout, list[int]] = {}
    for g, lay in governed(config, ordered):
        groups.setdefault(_plain(g, lay), []).append(index[g.address])
    entries = []
    for lay, idx in groups.items():
        sel = (Selector("all"),) if len(idx) == len(ordered) else tuple(Selector("index", i) for i in idx)
        entries.append(GpuEntry(sel, lay, vendor="nvidia"))
    return LayoutConfig(config.name, tuple(entries))


def resource_name(vendor: str | None, name: str) -> str:
    """``nvidia.com/GRID_T4-2Q``: KubeVirt's (and the device plugins') resource name for a device name."""
    return f"{_VENDOR_DOMAINS.get(vendor or '', 'devices.kubevirt.io')}/{_RESOURCE_CHARS.sub('_', name.strip())}"


def kubevirt_configuration(hosts: Mapping[str, Sequence[tuple[GpuNow, GpuLayout]]],
                           strict: bool = True) -> dict[str, Any]:
    """KubeVirt's ``spec.configuration`` fragment for these hosts' layouts: the PCI ids of passed-through
    GPUs and the mdev types of vGPUs as permitted host devices (KubeVirt's own plugins, not an external
    provider), and the mdev types KubeVirt should create, cluster-wide and per node (by hostname). ``strict``:
    refuse (:class:`NotExpressible`) a GPU KubeVirt cannot take, else leave it out."""
    pci: dict[str, dict[str, Any]] = {}
    mdev: dict[str, dict[str, Any]] = {}
    everywhere: list[str] = []
    per_node: list[dict[str, Any]] = []
    for host, pairs in hosts.items():
        types: list[str] = []
        for g, lay in pairs:
            where = f"{host} {g.address} ({g.product or 'GPU'})"
            vendor = (g.pci_id or "").split(":")[0] or None
            if lay.mode == "passthrough":
                if not g.pci_id:
                    raise NotExpressible(KUBEVIRT, where, "a GPU without a PCI id")
                sel = g.pci_id.replace("0x", "").upper()
                pci.setdefault(sel, {"pciVendorSelector": sel,
                                     "resourceName": resource_name(vendor, g.product or sel),
                                     "externalResourceProvider": False})
            elif lay.mode == "mig" and not strict:
                continue
            elif lay.mode == "mig":
                raise NotExpressible(KUBEVIRT, where, "mode mig (GPU instances are for containers; a VM takes a "
                                                      "MIG-backed vGPU: mode mig-vgpu)")
            elif lay.mode in ("vgpu", "mig-vgpu"):
                if any(p.kind is GpuUse.VENDOR_VF for p in g.budget.places) and not strict:
                    continue
                if any(p.kind is GpuUse.VENDOR_VF for p in g.budget.places):
                    raise NotExpressible(KUBEVIRT, where, "vGPU 17+ VF types (they are PCI VFs, not mediated "
                                                          "devices KubeVirt can select by name)")
                for v in lay.vgpu_devices:
                    tid = g.type_id(v.type)
                    if tid is None:
                        raise NotExpressible(KUBEVIRT, where, f"vGPU type {v.type!r} (the GPU does not offer it)")
                    name = g.type_names.get(tid) or tid
                    mdev.setdefault(name, {"mdevNameSelector": name, "resourceName": resource_name(vendor, name),
                                           "externalResourceProvider": False})
                    if tid not in types:
                        types.append(tid)
        everywhere += [t for t in types if t not in everywhere]
        if types:
            per_node.append({"nodeSelector": {"kubernetes.io/hostname": host}, "mediatedDeviceTypes": types})
    permitted: dict[str, Any] = {}
    if pci:
        permitted["pciHostDevices"] = list(pci.values())
    if mdev:
        permitted["mediatedDevices"] = list(mdev.values())
    out: dict[str, Any] = {"permittedHostDevices": permitted}
    if everywhere:
        out["mediatedDevicesConfiguration"] = {"mediatedDeviceTypes": everywhere, "nodeMediatedDeviceTypes": per_node}
    return out
