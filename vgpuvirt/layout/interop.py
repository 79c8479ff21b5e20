"""NVIDIA's declarative formats and the layout model: nvidia-mig-parted (``mig-configs``) and the vGPU
Device Manager (``vgpu-configs``), read into a :class:`Layout` and written back from one (docs/layouts.md,
"Interop"). Pure: text in, text out; errors name the file, the line and the key.

Their schemas (both ``version: v1``): a config is a list of entries; an entry selects GPUs with ``devices``
(``all`` or indices) and optionally ``device-filter`` (PCI ids ``0x20B010DE``: device, then vendor), and
says ``mig-enabled`` + ``mig-devices`` (mig-parted) or ``vgpu-devices`` (type name -> count; a MIG-backed
type ``A100D-1-10C`` implies MIG on and one ``1g.10gb`` GPU instance per vGPU). What a layout says that a
format cannot (passthrough, fill, SR-IOV counts, sizing, a device list AND a filter, ...) is refused with
:class:`NotExpressible`, one line naming what.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout.model import (
    VENDOR,
    GpuEntry,
    GpuLayout,
    Layout,
    LayoutConfig,
    Selector,
    VgpuCount,
    config_name,
    pci_id,
)
from vgpuvirt.layout.schema import DepthBoundedLoader, NodeReader, parse_layout

MIG_PARTED, VGPU_DM = "mig-parted", "vgpu-device-manager"
FORMATS = (MIG_PARTED, VGPU_DM)
CONFIGS_KEY = {MIG_PARTED: "mig-configs", VGPU_DM: "vgpu-configs"}
ENTRY_KEYS = {MIG_PARTED: ("device-filter", "devices", "mig-enabled", "mig-devices"),
              VGPU_DM: ("device-filter", "devices", "vgpu-devices")}
_REQUIRED = {MIG_PARTED: ("devices", "mig-enabled"), VGPU_DM: ("devices", "vgpu-devices")}
# The vGPU Device Manager's type names: time-sliced <gpu>-<GB><series>, MIG-backed <gpu>-<G>-<GB><series>[attr]
_TIME_SLICED = re.compile(r"^[A-Z0-9]+(?:-[a-zA-Z]+)*-(?:0|[1-9][0-9]*)[ABCQ]\Z")
_MIG_BACKED = re.compile(r"^[A-Z0-9]+-(?P<g>[1-9])-(?P<gb>0|[1-9][0-9]*)[ABCQ](?P<attr>ME|NOME|MEALL|GFX)?\Z")
_ATTR = {"ME": "+me", "NOME": "-me", "MEALL": "+me.all", "GFX": "+gfx"}
_FILTER = re.compile(r"^0[xX][0-9a-fA-F]{8}\Z")


class NotExpressible(InvalidSpec):
    """A layout that the target format cannot say; the message names the config, the entry and what."""

    def __init__(self, fmt: str, where: str, what: str) -> None:
        Exception.__init__(self, f"{where}: {what}: not expressible in {fmt}")
        self.what, self.value, self.expected = where, what, f"something {fmt} can express"


def mig_profile_of(type_name: str) -> str | None:
    """The GPU-instance profile a MIG-backed vGPU type implies (``A100D-1-10C`` -> ``1g.10gb``), else None."""
    m = _MIG_BACKED.fullmatch(type_name)
    if m is None:
        return None
    return f"{m['g']}g.{m['gb']}gb" + (_ATTR[m["attr"]] if m["attr"] else "")


# ------------------------------------------------------------------------------------------ import


def detect(text: str) -> str:
    """Which format a file is in: ``vgpuvirt`` (``configs``), ``mig-parted`` (``mig-configs``) or
    ``vgpu-device-manager`` (``vgpu-configs``); ``vgpuvirt`` when it cannot tell (its parser then says why)."""
    try:   # the top-level keys only: composed, never constructed (the parser then checks the whole file)
        root = yaml.compose(text, Loader=DepthBoundedLoader) if "\0" not in text else None
    except yaml.YAMLError:
        return "vgpuvirt"
    if isinstance(root, yaml.MappingNode):
        keys = {k.value for k, _ in root.value if isinstance(k, yaml.ScalarNode)}
        if "configs" not in keys:
            for fmt, key in CONFIGS_KEY.items():
                if key in keys:
                    return fmt
    return "vgpuvirt"


def read_any(text: str, source: str, fmt: str | None = None) -> Layout:
    """A layout file in vgpuvirt's, mig-parted's or the vGPU Device Manager's format (``fmt``, else detected)."""
    fmt = fmt or detect(text)
    return parse_layout(text, source) if fmt == "vgpuvirt" else import_config(text, source, fmt)


def import_config(text: str, source: str = "<config>", fmt: str | None = None, name: str | None = None) -> Layout:
    """A mig-parted or vGPU Device Manager file (``fmt``, else detected) as a layout (every config, or ``name``)."""
    fmt = fmt or detect(text)
    if fmt not in FORMATS:
        fmt = MIG_PARTED if "mig-configs" in text else VGPU_DM     # the reader says what is wrong with it
    r = NodeReader(text, source)
    key = CONFIGS_KEY[fmt]
    root = r.root(f"version: v1 and {key}")
    top = r.mapping(root, "", ("version", key))
    version = r.scalar(top["version"], "version") if "version" in top else None
    if version != "v1":
        raise r.fail(top.get("version", root), "version", f"{version!r}: expected v1 ({fmt}'s schema version)")
    if key not in top:
        raise r.fail(root, key, f"missing; a {fmt} file names its configs under {key}")
    r.mapping(top[key], key)
    configs = []
    for knode, node in top[key].value:
        cname = str(r.scalar(knode, key))
        if name is not None and cname != name:
            continue
        ck = f"{key}.{cname}"
        r.checked(knode, ck, config_name, cname)
        items = r.sequence(node, ck)
        if not items:
            raise r.fail(node, ck, "empty; expected at least one entry")
        configs.append(LayoutConfig(cname, tuple(_entry(r, fmt, e, f"{ck}[{i}]") for i, e in enumerate(items))))
    if not configs:
        names = [str(r.scalar(k, key)) for k, _ in top[key].value]
        raise r.fail(top[key], key, f"no config {name!r}; the file has " + ", ".join(names) if name else "empty")
    return Layout(tuple(configs), source)


def _entry(r: NodeReader, fmt: str, node: yaml.Node, key: str) -> GpuEntry:
    f = r.mapping(node, key, ENTRY_KEYS[fmt])
    for req in _REQUIRED[fmt]:
        if req not in f:
            raise r.fail(node, f"{key}.{req}", f"missing (required in {fmt})")
    selectors, filters = _selectors(r, f, key)

    def entry(layout: GpuLayout) -> GpuEntry:
        # their indices count the NVIDIA GPUs (NVML's order), and they touch nothing else
        return GpuEntry(selectors, layout, node.start_mark.line + 1, vendor="nvidia", device_filter=filters)

    if fmt == MIG_PARTED:
        enabled = r.scalar(f["mig-enabled"], f"{key}.mig-enabled")
        if not isinstance(enabled, bool):
            raise r.fail(f["mig-enabled"], f"{key}.mig-enabled", f"{enabled!r}: expected true or false")
        migs = _counts(r, f, "mig-devices", key) if "mig-devices" in f else None
        if enabled and migs is None:
            raise r.fail(node, f"{key}.mig-devices", "missing; required when mig-enabled is true ({} for none)")
        if not enabled and migs:
            raise r.fail(f["mig-devices"], f"{key}.mig-devices", "MIG devices given while mig-enabled is false")
        for prof, _ in migs or ():
            if re.match(r"^\d+c\.", prof):
                raise r.fail(f["mig-devices"], f"{key}.mig-devices.{prof}",
                             "compute-instance profiles are not expressible in a layout (each GPU instance "
                             "gets its default compute instance)")
        if not enabled:
            return entry(GpuLayout(mode="off"))
        return entry(r.checked(node, key, GpuLayout, "mig", None, None, None, tuple(migs or ()), True))
    types = _counts(r, f, "vgpu-devices", key)
    implied: dict[str, int] = {}
    sliced = []
    for t, n in types:
        if _TIME_SLICED.fullmatch(t):
            sliced.append(t)
        elif (gi := mig_profile_of(t)) is not None:
            implied[gi] = implied.get(gi, 0) + n
        else:
            raise r.fail(f["vgpu-devices"], f"{key}.vgpu-devices.{t}",
                         "not a vGPU type name (A10-4Q, T4-2Q, A100D-1-10C)")
    if implied and sliced:
        raise r.fail(f["vgpu-devices"], f"{key}.vgpu-devices",
                     f"mixes MIG-backed and time-sliced types ({sliced[0]}): a GPU in MIG mode offers only MIG-backed")
    counts = tuple(VgpuCount(t, n) for t, n in types)
    return entry(r.checked(f["vgpu-devices"], f"{key}.vgpu-devices", GpuLayout, "mig-vgpu" if implied else "vgpu",
                           None, None, None, tuple(implied.items()), bool(implied), counts))


def _counts(r: NodeReader, f: dict[str, yaml.Node], name: str, key: str) -> list[tuple[str, int]]:
    out = []
    for k, v in r.mapping(f[name], f"{key}.{name}").items():
        n = r.scalar(v, f"{key}.{name}.{k}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise r.fail(v, f"{key}.{name}.{k}", f"{n!r}: expected a count (0 or more)")
        out.append((k, n))
    return out


def _selectors(r: NodeReader, f: dict[str, yaml.Node], key: str) -> tuple[tuple[Selector, ...], tuple[str, ...]]:
    dnode = f["devices"]
    if isinstance(dnode, yaml.ScalarNode):
        if r.scalar(dnode, f"{key}.devices") != "all":
            raise r.fail(dnode, f"{key}.devices", "expected all or a list of GPU indices")
        devices: list[int] | None = None
    else:
        devices = []
        for i, n in enumerate(r.sequence(dnode, f"{key}.devices")):
            v = r.scalar(n, f"{key}.devices[{i}]")
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise r.fail(n, f"{key}.devices[{i}]", f"{v!r}: expected a GPU index (0, 1, ...)")
            devices.append(v)
        if not devices:
            raise r.fail(dnode, f"{key}.devices", "empty list; expected all or GPU indices")
    sel = (Selector("all"),) if devices is None else tuple(Selector("index", i) for i in devices)
    if "device-filter" not in f:
        return sel, ()
    fnode = f["device-filter"]
    raw = [r.scalar(fnode, f"{key}.device-filter")] if isinstance(fnode, yaml.ScalarNode) else \
        [r.scalar(n, f"{key}.device-filter") for n in r.sequence(fnode, f"{key}.device-filter")]
    ids = []
    for v in raw:
        if not isinstance(v, str) or not _FILTER.fullmatch(v):
            raise r.fail(fnode, f"{key}.device-filter", f"{v!r}: expected a PCI id such as 0x20B010DE (device, "
                                                        "vendor); subsystem ids are not expressible in a layout")
        ids.append(pci_id(v))
    if devices is not None:
        raise r.fail(fnode, f"{key}.device-filter", "a device-filter together with a device list is not expressible "
                                                    "in a layout (their indices count every NVIDIA GPU, a layout's "
                                                    "those the filter admits); use devices: all with the filter, or "
                                                    "indices alone")
    return sel, tuple(ids)


# ------------------------------------------------------------------------------------------ export


def export_config(layout: Layout, fmt: str) -> str:
    """The layout in ``fmt`` (YAML text). Entries must select ``all`` or NVIDIA indices (``vendor: nvidia``),
    optionally with a device-filter (a host's export by address goes through
    :func:`vgpuvirt.layout.interop_host.by_index` first)."""
    if fmt not in FORMATS:
        raise InvalidSpec("format", fmt, " | ".join(FORMATS))
    out: dict[str, Any] = {}
    for c in layout.configs:
        out[c.name] = [_export_entry(fmt, e, f"{c.name}[{i}]") for i, e in enumerate(c.entries)]
    return dump({"version": "v1", CONFIGS_KEY[fmt]: out})


def dump(data: Mapping[str, Any]) -> str:
    return str(yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=None, width=120))


def _export_selectors(fmt: str, e: GpuEntry, where: str) -> dict[str, Any]:
    kinds = {s.kind for s in e.devices}
    if e.vendor not in (None, "nvidia"):
        raise NotExpressible(fmt, where, f"vendor {e.vendor} ({fmt} manages NVIDIA GPUs)")
    out: dict[str, Any] = {}
    if e.device_filter:
        out["device-filter"] = [f"0x{d[2:].upper()}{v[2:].upper()}" for v, d in (x.split(":") for x in e.device_filter)]
        if kinds != {"all"}:
            raise NotExpressible(fmt, where, "a device-filter with a device list (its indices count every NVIDIA "
                                             "GPU, a layout's those the filter admits)")
    if "all" in kinds:
        return {**out, "devices": "all"}
    if kinds == {"index"}:
        if e.vendor is None:
            raise NotExpressible(fmt, where, "indices without vendor: nvidia (a layout's count every GPU, "
                                             f"{fmt}'s the NVIDIA GPUs)")
        return {**out, "devices": [s.value for s in e.devices]}
    bad = next(s for s in e.devices if s.kind != "index")
    raise NotExpressible(fmt, where, f"devices {bad.to_yaml()!r} (a {bad.kind} selector; {fmt} selects by index or "
                                     "PCI id: export from the host, with --host)")


def _export_entry(fmt: str, e: GpuEntry, where: str) -> dict[str, Any]:
    lay = e.layout
    out = _export_selectors(fmt, e, where)
    extra = [(k, v) for k, v in (("driver", lay.driver if lay.driver != VENDOR else None),
                                 ("sriov-vfs", lay.sriov_vfs), ("sizing", lay.sizing),
                                 ("scheduler", lay.scheduler.policy if lay.scheduler else None)) if v is not None]
    if fmt == MIG_PARTED:
        if lay.mode not in ("mig", "off"):
            raise NotExpressible(fmt, where, f"mode {lay.mode} (mig-parted sets MIG only; "
                                             "vGPU types: --format vgpu-device-manager)")
        if lay.mode == "off" and lay.sriov_vfs == 0:
            extra = [x for x in extra if x[0] != "sriov-vfs"]
        if extra:
            raise NotExpressible(fmt, where, f"{extra[0][0]} {extra[0][1]}")
        if lay.mode == "off":
            return {**out, "mig-enabled": False}
        if not lay.mig_exact and not lay.mig_devices:
            raise NotExpressible(fmt, where, "mig-devices left out (keep the GPU instances there); "
                                             "mig-parted always sets them: write mig-devices")
        return {**out, "mig-enabled": True, "mig-devices": dict(lay.mig_devices)}
    if lay.mode not in ("vgpu", "mig-vgpu"):
        raise NotExpressible(fmt, where, f"mode {lay.mode} (the vGPU Device Manager makes vGPUs only)")
    if extra:
        raise NotExpressible(fmt, where, f"{extra[0][0]} {extra[0][1]}")
    types: dict[str, int] = {}
    implied: dict[str, int] = {}
    for v in lay.vgpu_devices:
        name = v.type.removeprefix("GRID ").removeprefix("NVIDIA ")
        if v.count is None:
            raise NotExpressible(fmt, where, f"{v.type}: fill (as many as fit): give a count")
        if not (_TIME_SLICED.fullmatch(name) or _MIG_BACKED.fullmatch(name)):
            raise NotExpressible(fmt, where, f"vGPU type {v.type!r} (it names types such as A10-4Q, not ids)")
        types[name] = v.count
        if (prof := mig_profile_of(name)) is not None:
            implied[prof] = implied.get(prof, 0) + v.count
    if lay.mode == "mig-vgpu" or lay.mig_devices:
        want = {p: n for p, n in lay.mig_devices if n}
        if want != {p: n for p, n in implied.items() if n}:
            raise NotExpressible(fmt, where, f"mig-devices {want} besides what the vGPU types imply ({implied}): "
                                             "the vGPU Device Manager makes one GPU instance per MIG-backed vGPU")
    elif implied:
        raise NotExpressible(fmt, where, "MIG-backed vGPU types in mode vgpu")
    return {**out, "vgpu-devices": types}
