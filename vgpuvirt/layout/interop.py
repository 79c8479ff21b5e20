"""Other tools' formats: NVIDIA mig-parted and vGPU Device Manager config files in, and out; KubeVirt's
``permittedHostDevices`` and ``mediatedDevicesConfiguration`` out.

Import is pure (text in, :class:`Layout` out, errors at FILE:LINE: KEY). Both NVIDIA tools count
``devices: [N]`` as nvidia-smi does (NVIDIA GPUs in PCI order), so the entries they become carry
``vendor: nvidia``; ``device-filter`` (``0x20B010DE``, device then vendor) is kept. A mig-parted entry
becomes mode ``mig`` with exactly its ``mig-devices`` (``{}``: none), or, with ``mig-enabled: false``,
mode ``off`` (the whole GPU on its vendor driver, as the GPU Operator's containers use it); a vGPU Device
Manager entry becomes mode ``vgpu`` with its ``vgpu-devices`` counts (``{}``: none).

Export takes the host as read (:class:`~vgpuvirt.layout.observe.GpuNow`): its NVIDIA GPUs by nvidia-smi
index in mig-parted's and the vGPU Device Manager's form, and KubeVirt's ``spec.configuration`` parts for
the devices it offers (whole GPUs on vfio-pci by PCI id; mdev types by name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout.model import VFIO, GpuEntry, GpuLayout, Layout, LayoutConfig, Selector, VgpuCount, pci_id
from vgpuvirt.layout.observe import GpuNow
from vgpuvirt.layout.schema import NodeReader

FORMATS = ("vgpuvirt", "mig-parted", "vgpu-device-manager", "kubevirt")
_KINDS = {"mig-configs": "mig-parted", "vgpu-configs": "vgpu-device-manager"}


def detect(text: str) -> str:
    """Which format a config file is in: ``vgpuvirt`` (``configs``), ``mig-parted`` (``mig-configs``) or
    ``vgpu-device-manager`` (``vgpu-configs``); ``vgpuvirt`` when it cannot tell (its parser then says why)."""
    try:
        top = yaml.safe_load(text)
    except yaml.YAMLError:
        return "vgpuvirt"
    if isinstance(top, dict):
        for key, kind in _KINDS.items():
            if key in top and "configs" not in top:
                return kind
    return "vgpuvirt"


def import_config(text: str, source: str = "<config>") -> Layout:
    """A mig-parted or vGPU Device Manager config file (``version: v1``) as a layout."""
    r = NodeReader(text, source)
    root = r.root("version: v1 and mig-configs or vgpu-configs")
    top = r.mapping(root, "", ("version", "mig-configs", "vgpu-configs"))
    if "version" not in top or r.scalar(top["version"], "version") != "v1":
        raise r.fail(top.get("version", root), "version", "expected version: v1")
    kinds = [k for k in _KINDS if k in top]
    if len(kinds) != 1:
        raise r.fail(root, "", "expected one of mig-configs (mig-parted) or vgpu-configs (vGPU Device Manager)")
    kind = kinds[0]
    configs = []
    cnode = top[kind]
    r.mapping(cnode, kind)
    for knode, node in cnode.value:
        name = str(r.scalar(knode, kind))
        key = f"{kind}.{name}"
        entries = tuple(_entry(r, kind, e, f"{key}[{i}]") for i, e in enumerate(r.sequence(node, key)))
        try:
            configs.append(LayoutConfig(name, entries))
        except InvalidSpec as exc:
            raise r.fail(knode, key, str(exc)) from None
    if not configs:
        raise r.fail(cnode, kind, "no configs")
    return Layout(tuple(configs), source)


def _entry(r: NodeReader, kind: str, node: yaml.Node, key: str) -> GpuEntry:
    mig = kind == "mig-configs"
    keys = ("device-filter", "devices", "mig-enabled", "mig-devices") if mig else \
        ("device-filter", "devices", "vgpu-devices")
    f = r.mapping(node, key, keys)
    if "devices" not in f:
        raise r.fail(node, f"{key}.devices", "missing; expected all or a list of GPU indexes")
    dnode = f["devices"]
    if isinstance(dnode, yaml.ScalarNode) and r.scalar(dnode, f"{key}.devices") == "all":
        devices: tuple[Selector, ...] = (Selector("all"),)
    else:
        items = [r.scalar(n, f"{key}.devices") for n in r.sequence(dnode, f"{key}.devices")]
        if not items or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise r.fail(dnode, f"{key}.devices", f"{items!r}: expected all or a list of GPU indexes")
        devices = tuple(r.checked(dnode, f"{key}.devices", Selector.parse, i) for i in items)
    filters: tuple[str, ...] = ()
    if "device-filter" in f:
        fn = f["device-filter"]
        raw = [r.scalar(fn, key)] if isinstance(fn, yaml.ScalarNode) else \
            [r.scalar(n, key) for n in r.sequence(fn, f"{key}.device-filter")]
        filters = tuple(r.checked(fn, f"{key}.device-filter", pci_id, v) for v in raw)
    if mig:
        on = r.scalar(f["mig-enabled"], f"{key}.mig-enabled") if "mig-enabled" in f else False
        if not isinstance(on, bool):
            raise r.fail(f["mig-enabled"], f"{key}.mig-enabled", f"{on!r}: expected true or false")
        counts = _counts(r, f.get("mig-devices"), f"{key}.mig-devices")
        if counts and not on:
            raise r.fail(f["mig-devices"], f"{key}.mig-devices", "MIG devices with mig-enabled: false")
        layout = r.checked(node, key, lambda: GpuLayout(mode="mig", mig_devices=tuple(counts.items()), mig_exact=True)
                           if on else GpuLayout(mode="off"))
    else:
        counts = _counts(r, f.get("vgpu-devices"), f"{key}.vgpu-devices")
        layout = r.checked(node, key, lambda: GpuLayout(mode="vgpu", vgpu_devices=tuple(
            VgpuCount(t, n) for t, n in counts.items())))
    return GpuEntry(devices, layout, node.start_mark.line + 1, "nvidia", filters)


def _counts(r: NodeReader, node: yaml.Node | None, key: str) -> dict[str, int]:
    if node is None or (isinstance(node, yaml.ScalarNode) and r.scalar(node, key) is None):
        return {}
    out: dict[str, int] = {}
    for name, v in r.mapping(node, key).items():
        n = r.scalar(v, f"{key}.{name}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise r.fail(v, f"{key}.{name}", f"{n!r}: expected a count")
        out[name] = n
    return out


# -- out -----------------------------------------------------------------------------------------------------

def _nvidia(gpus: Sequence[GpuNow]) -> list[GpuNow]:
    return [g for g in gpus if (g.pci_id or "").startswith("0x10de:")]


def to_mig_parted(gpus: Sequence[GpuNow], name: str = "current") -> dict[str, Any]:
    entries = []
    for i, g in enumerate(_nvidia(gpus)):
        e: dict[str, Any] = {"devices": [i], "mig-enabled": g.mig_enabled}
        if g.mig_enabled:
            e["mig-devices"] = dict(sorted((g.budget.gpu_instances or {}).items()))
        entries.append(e)
    return {"version": "v1", "mig-configs": {name: entries}}


def to_vgpu_device_manager(gpus: Sequence[GpuNow], name: str = "current") -> dict[str, Any]:
    entries = []
    for i, g in enumerate(_nvidia(gpus)):
        counts = g.counts()
        entries.append({"devices": [i], "vgpu-devices": {g.short_name(t): counts[t] for t in sorted(counts)}})
    return {"version": "v1", "vgpu-configs": {name: entries}}


def _resource(name: str) -> str:
    """KubeVirt resource names: ``nvidia.com/GRID_T4-2Q`` (spaces and other odd characters become ``_``)."""
    return "nvidia.com/" + re.sub(r"[^A-Za-z0-9_.-]", "_", name.strip())


def to_kubevirt(hosts: Mapping[str, Sequence[GpuNow]]) -> dict[str, Any]:
    """``spec.configuration.permittedHostDevices`` and ``mediatedDevicesConfiguration`` for what the hosts
    offer: whole GPUs bound to vfio-pci (``pciHostDevices`` by vendor:device id) and their mdev types
    (``mediatedDevices`` by type name, the types per node). vGPU 17+ types on VFs have no mdev: KubeVirt
    sees those VFs as PCI devices, not listed here."""
    pci: dict[str, dict[str, Any]] = {}
    mdevs: dict[str, dict[str, Any]] = {}
    per_node: dict[str, set[str]] = {}
    for host, gpus in hosts.items():
        for g in gpus:
            if g.driver == VFIO and g.pci_id:
                v, d = (x.removeprefix("0x").upper() for x in g.pci_id.split(":"))
                pci.setdefault(f"{v}:{d}", {"pciVendorSelector": f"{v}:{d}",
                                            "resourceName": _resource(g.product or f"{v}_{d}")})
            for v_ in g.vgpus:
                if v_.uuid is None:
                    continue
                tname = g.type_names.get(v_.type_id) or v_.type_id
                mdevs.setdefault(tname, {"mdevNameSelector": tname, "resourceName": _resource(tname)})
                per_node.setdefault(host, set()).add(v_.type_id)
    conf: dict[str, Any] = {}
    types = sorted({t for ts in per_node.values() for t in ts})
    if len(hosts) == 1:
        conf["mediatedDeviceTypes"] = types
    elif per_node:
        conf["nodeMediatedDeviceTypes"] = [{"nodeSelector": {"kubernetes.io/hostname": h},
                                            "mediatedDeviceTypes": sorted(ts)} for h, ts in sorted(per_node.items())]
    return {"permittedHostDevices": {"pciHostDevices": [pci[k] for k in sorted(pci)],
                                     "mediatedDevices": [mdevs[k] for k in sorted(mdevs)]},
            "mediatedDevicesConfiguration": conf}


def dump(data: Mapping[str, Any]) -> str:
    return str(yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False, width=120))


def read_any(text: str, source: str) -> Layout:
    """A layout file in vgpuvirt's, mig-parted's or the vGPU Device Manager's format."""
    from vgpuvirt.layout.schema import parse_layout

    return parse_layout(text, source) if detect(text) == "vgpuvirt" else import_config(text, source)
