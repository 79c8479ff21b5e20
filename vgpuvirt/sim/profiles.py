"""Simulator profiles: YAML data files describing one host, loaded and validated into frozen specs.

A profile names PCI devices (with their bridges, drivers, IOMMU groups and NUMA nodes), SR-IOV
capabilities, and for GPUs the vGPU mode and type table. Type tables live in ``profiles/_types.yaml``
and may be extended by a profile's own ``type_tables``. The format is documented in docs/sim.md.
A malformed file is refused with :class:`ProfileError` naming the file, the key and the reason.
This module loads a profile; the specs are in :mod:`.profile_spec`, the field checks in
:mod:`.profile_fields`, the type tables in :mod:`.type_tables` (their public names are re-exported here).
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Mapping
from typing import Any

import yaml

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress, parse_cpulist
from vgpuvirt.sim.profile_fields import ProfileContext
from vgpuvirt.sim.profile_spec import (
    DRIVER_VERSION,
    VGPU_MODES,
    DeviceSpec,
    GpuInstanceSpec,
    InitialVgpu,
    MigProfile,
    NodeSpec,
    Profile,
    ProfileError,
    SriovSpec,
    TypeTable,
    VgpuSpec,
    VgpuType,
    vf_address,
)
from vgpuvirt.sim.type_tables import SAFE_LOADER, builtin_type_tables, parse_table, profiles_dir

__all__ = ["VGPU_MODES", "DeviceSpec", "GpuInstanceSpec", "InitialVgpu", "MigProfile", "NodeSpec", "Profile",
           "ProfileError", "SriovSpec", "TypeTable", "VgpuSpec", "VgpuType", "builtin_type_tables", "list_profiles",
           "load_profile", "vf_address"]


def list_profiles() -> list[str]:
    """Names of the profiles shipped with vgpuvirt."""
    return sorted(p.name[:-5] for p in profiles_dir().iterdir()
                  if p.name.endswith(".yaml") and not p.name.startswith("_"))

def _parse_vgpu(ctx: ProfileContext, raw: Any, key: str, tables: Mapping[str, TypeTable]) -> VgpuSpec:
    m = ctx.mapping(raw, key)
    ctx.keys(m, key, {"mode", "types", "heterogeneous", "mig", "pool", "vgpus"}, {"mode", "types"})
    mode = ctx.text(m["mode"], f"{key}.mode")
    if mode not in VGPU_MODES:
        raise ctx.fail(f"{key}.mode", f"{mode!r} is not one of {', '.join(VGPU_MODES)}")
    tname = ctx.text(m["types"], f"{key}.types")
    if tname not in tables:
        raise ctx.fail(f"{key}.types", f"unknown type table {tname!r} (known: {', '.join(sorted(tables))})")
    table = tables[tname]
    if (mode == "gvtg") != (table.driver == "i915"):
        raise ctx.fail(f"{key}.types", f"type table {tname!r} (driver {table.driver}) does not fit mode {mode}")
    het = ctx.boolean(m.get("heterogeneous", False), f"{key}.heterogeneous")
    if het and not table.heterogeneous:
        raise ctx.fail(f"{key}.heterogeneous", f"type table {tname!r} has no heterogeneous (mixed-size) mode")
    mig_on = False
    gis: list[GpuInstanceSpec] = []
    if "mig" in m:
        mk = f"{key}.mig"
        mm = ctx.mapping(m["mig"], mk)
        ctx.keys(mm, mk, {"enabled", "instances"})
        if not table.mig_profiles:
            raise ctx.fail(mk, f"type table {tname!r} has no MIG profiles")
        mig_on = ctx.boolean(mm.get("enabled", False), f"{mk}.enabled")
        known = {p.name for p in table.mig_profiles}
        for i, gi in enumerate(mm.get("instances") or []):
            gk = f"{mk}.instances[{i}]"
            g = ctx.mapping(gi, gk)
            ctx.keys(g, gk, {"id", "profile"}, {"id", "profile"})
            prof = ctx.text(g["profile"], f"{gk}.profile")
            if prof not in known:
                raise ctx.fail(f"{gk}.profile", f"unknown MIG profile {prof!r} (known: {', '.join(sorted(known))})")
            gis.append(GpuInstanceSpec(ctx.integer(g["id"], f"{gk}.id", 0, 64), prof))
        if gis and not mig_on:
            raise ctx.fail(f"{mk}.instances", "GPU instances need mig.enabled: true")
        if len({g.id for g in gis}) != len(gis):
            raise ctx.fail(f"{mk}.instances", "duplicate GPU instance id")
        slices = {p.name: p.slices for p in table.mig_profiles}
        if sum(slices[g.profile] for g in gis) > table.compute_slices:
            raise ctx.fail(f"{mk}.instances", f"the GPU instances need more than the GPU's {table.compute_slices} "
                                              "compute slices")
    pool: dict[str, int] = {}
    if mode == "gvtg":
        pk = f"{key}.pool"
        pm = ctx.mapping(m.get("pool"), pk)
        ctx.keys(pm, pk, {"low_gm", "high_gm", "fences"}, {"low_gm", "high_gm", "fences"})
        pool = {k: ctx.integer(pm[k], f"{pk}.{k}", 0) for k in ("low_gm", "high_gm", "fences")}
    elif "pool" in m:
        raise ctx.fail(f"{key}.pool", "only GVT-g (mode gvtg) has a shared pool")
    vgpus: list[InitialVgpu] = []
    for i, v in enumerate(m.get("vgpus") or []):
        vk = f"{key}.vgpus[{i}]"
        vm = ctx.mapping(v, vk)
        ctx.keys(vm, vk, {"type", "uuid", "vf"}, {"type"})
        vgpus.append(InitialVgpu(str(vm["type"]), ctx.text(vm["uuid"], f"{vk}.uuid") if "uuid" in vm else None,
                                 ctx.integer(vm["vf"], f"{vk}.vf", 0) if "vf" in vm else None))
    return VgpuSpec(mode=mode, table=table, heterogeneous=het, mig_enabled=mig_on, gpu_instances=tuple(gis),
                    pool=pool, vgpus=tuple(vgpus))


_DEVICE_KEYS = {"address", "parent", "vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision",
                "driver", "numa_node", "iommu_group", "reset_method", "product", "boot_vga", "sriov", "vgpu"}
_RESET_METHODS = {"device_specific", "acpi", "flr", "af_flr", "pm", "bus", "cxl_bus"}


def _parse_device(ctx: ProfileContext, raw: Any, key: str, tables: Mapping[str, TypeTable]) -> DeviceSpec:
    m = ctx.mapping(raw, key)
    ctx.keys(m, key, _DEVICE_KEYS, {"address", "vendor", "device", "class"})
    sriov = None
    if "sriov" in m:
        sk = f"{key}.sriov"
        s = ctx.mapping(m["sriov"], sk)
        ctx.keys(s, sk, {"totalvfs", "numvfs", "offset", "stride", "vf_device", "vf_driver", "vf_class"},
                 {"totalvfs"})
        total = ctx.integer(s["totalvfs"], f"{sk}.totalvfs", 1, 256)
        sriov = SriovSpec(totalvfs=total, numvfs=ctx.integer(s.get("numvfs", 0), f"{sk}.numvfs", 0, total),
                          offset=ctx.integer(s.get("offset", 1), f"{sk}.offset", 1, 0xFFFF),
                          stride=ctx.integer(s.get("stride", 1), f"{sk}.stride", 1, 0xFF),
                          vf_device=ctx.integer(s.get("vf_device", m["device"]), f"{sk}.vf_device", 0, 0xFFFF),
                          vf_driver=ctx.text(s["vf_driver"], f"{sk}.vf_driver") if s.get("vf_driver") else None,
                          vf_class=(ctx.integer(s["vf_class"], f"{sk}.vf_class", 0, 0xFFFFFF)
                                    if "vf_class" in s else None))
    reset = str(m.get("reset_method", "") or "")
    for meth in reset.split():
        if meth not in _RESET_METHODS:
            raise ctx.fail(f"{key}.reset_method", f"unknown reset method {meth!r}")
    vgpu = _parse_vgpu(ctx, m["vgpu"], f"{key}.vgpu", tables) if "vgpu" in m else None
    if vgpu and vgpu.mode in ("mdev-sriov", "vendor") and sriov is None:
        raise ctx.fail(f"{key}.vgpu.mode", f"mode {vgpu.mode} needs an sriov section on the device")
    return DeviceSpec(
        address=ctx.addr(m["address"], f"{key}.address"),
        parent=ctx.addr(m["parent"], f"{key}.parent") if m.get("parent") else None,
        vendor=ctx.integer(m["vendor"], f"{key}.vendor", 0, 0xFFFF),
        device=ctx.integer(m["device"], f"{key}.device", 0, 0xFFFF),
        pci_class=ctx.integer(m["class"], f"{key}.class", 0, 0xFFFFFF),
        subsystem_vendor=ctx.integer(m.get("subsystem_vendor", m["vendor"]), f"{key}.subsystem_vendor", 0, 0xFFFF),
        subsystem_device=ctx.integer(m.get("subsystem_device", 0), f"{key}.subsystem_device", 0, 0xFFFF),
        revision=ctx.integer(m.get("revision", 0xa1), f"{key}.revision", 0, 0xFF),
        driver=ctx.text(m["driver"], f"{key}.driver") if m.get("driver") else None,
        numa_node=ctx.integer(m.get("numa_node", -1), f"{key}.numa_node", -1, 63),
        iommu_group=ctx.integer(m["iommu_group"], f"{key}.iommu_group", 0, 1 << 20) if "iommu_group" in m else None,
        reset_method=reset, product=str(m.get("product", "")),
        boot_vga=ctx.boolean(m.get("boot_vga", False), f"{key}.boot_vga"),
        sriov=sriov, vgpu=vgpu)



def _parse_profile(raw: Any, file: str) -> Profile:
    ctx = ProfileContext(file)
    m = ctx.mapping(raw, "")
    ctx.keys(m, "", {"name", "description", "iommu", "cpus", "nodes", "devices", "drivers", "type_tables",
                     "driver_version", "guest", "cmdline"},
             {"name", "devices"})
    tables = dict(builtin_type_tables())
    for n, t in (ctx.mapping(m.get("type_tables") or {}, "type_tables")).items():
        tables[n] = parse_table(ctx, n, t, f"type_tables.{n}")
    threads = 1
    nodes: list[NodeSpec] = []
    if "cpus" in m:
        c = ctx.mapping(m["cpus"], "cpus")
        ctx.keys(c, "cpus", {"sockets", "cores_per_socket", "threads_per_core", "memory_mib_per_node",
                             "hugepages_per_node"}, {"sockets", "cores_per_socket"})
        sockets = ctx.integer(c["sockets"], "cpus.sockets", 1, 16)
        cores = ctx.integer(c["cores_per_socket"], "cpus.cores_per_socket", 1, 512)
        threads = ctx.integer(c.get("threads_per_core", 1), "cpus.threads_per_core", 1, 2)
        mem = ctx.integer(c.get("memory_mib_per_node", 65536), "cpus.memory_mib_per_node", 1)
        hp_raw = ctx.mapping(c.get("hugepages_per_node") or {}, "cpus.hugepages_per_node")
        hk = "cpus.hugepages_per_node"
        hp = {ctx.integer(k, f"{hk}.{k}", 4, 1 << 22): ctx.integer(v, f"{hk}.{k}", 0) for k, v in hp_raw.items()}
        for size in (2048, 1048576):
            hp.setdefault(size, 0)
        # Linux numbering: first thread of every core on every socket, then the SMT siblings.
        for s in range(sockets):
            socket_cpus = {t * sockets * cores + s * cores + k for t in range(threads) for k in range(cores)}
            nodes.append(NodeSpec(s, frozenset(socket_cpus), mem, hp))
    elif "nodes" in m:
        if not isinstance(m["nodes"], list) or not m["nodes"]:
            raise ctx.fail("nodes", "expected a non-empty list")
        for i, n in enumerate(m["nodes"]):
            nk = f"nodes[{i}]"
            nm = ctx.mapping(n, nk)
            ctx.keys(nm, nk, {"id", "cpulist", "memory_mib"}, {"id", "cpulist"})
            try:
                cpus = parse_cpulist(ctx.text(nm["cpulist"], f"{nk}.cpulist"))
            except InvalidSpec as exc:
                raise ctx.fail(f"{nk}.cpulist", exc.expected) from None
            nodes.append(NodeSpec(ctx.integer(nm["id"], f"{nk}.id", 0, 63), cpus,
                                  ctx.integer(nm.get("memory_mib", 65536), f"{nk}.memory_mib", 1),
                                  {2048: 0, 1048576: 0}))
    else:
        nodes.append(NodeSpec(0, frozenset(range(8)), 65536, {2048: 0, 1048576: 0}))
    if not isinstance(m["devices"], list):
        raise ctx.fail("devices", "expected a list")
    devices = [_parse_device(ctx, d, f"devices[{i}]", tables) for i, d in enumerate(m["devices"])]
    iommu = ctx.boolean(m.get("iommu", True), "iommu")
    _check_topology(ctx, devices, {n.id for n in nodes}, iommu)
    drivers = [ctx.text(d, f"drivers[{i}]") for i, d in enumerate(m.get("drivers") or [])]
    return Profile(name=ctx.text(m["name"], "name"), description=str(m.get("description", "")).strip(),
                   iommu=iommu, nodes=tuple(nodes), threads_per_core=threads, devices=tuple(devices),
                   drivers=tuple(drivers), source=file,
                   driver_version=ctx.text(m.get("driver_version", DRIVER_VERSION), "driver_version"),
                   guest=ctx.boolean(m.get("guest", False), "guest"),
                   cmdline=ctx.text(m["cmdline"], "cmdline") if "cmdline" in m else "")


def _check_topology(ctx: ProfileContext, devices: list[DeviceSpec], node_ids: set[int], iommu: bool) -> None:
    seen: dict[PciAddress, int] = {}
    for i, d in enumerate(devices):
        if d.address in seen:
            raise ctx.fail(f"devices[{i}].address", f"{d.address} is already devices[{seen[d.address]}]")
        seen[d.address] = i
    for i, d in enumerate(devices):
        key = f"devices[{i}]"
        if d.parent is not None:
            if d.parent not in seen:
                raise ctx.fail(f"{key}.parent", f"no device {d.parent} in this profile")
            if not devices[seen[d.parent]].is_bridge:
                raise ctx.fail(f"{key}.parent", f"{d.parent} is not a PCI bridge (class 0x0604xx)")
            if seen[d.parent] > i:
                raise ctx.fail(f"{key}.parent", "list a bridge before the devices behind it")
        if d.numa_node != -1 and d.numa_node not in node_ids:
            raise ctx.fail(f"{key}.numa_node", f"no NUMA node {d.numa_node} (nodes: {sorted(node_ids)})")
        if iommu and d.iommu_group is None:
            raise ctx.fail(f"{key}.iommu_group", "required while iommu is true")
        if d.sriov:
            for n in range(d.sriov.totalvfs):
                vf = vf_address(d.address, d.sriov, n)
                if vf in seen:
                    raise ctx.fail(f"{key}.sriov", f"VF {n} would be at {vf}, which is devices[{seen[vf]}]")
        if d.vgpu and d.vgpu.vgpus and d.vgpu.mode in ("mdev-sriov", "vendor"):
            for j, v in enumerate(d.vgpu.vgpus):
                if v.vf is None or d.sriov is None or v.vf >= d.sriov.numvfs:
                    raise ctx.fail(f"{key}.vgpu.vgpus[{j}].vf", "needs the index of an enabled VF")


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Load a shipped profile by name (``t4x2``) or a YAML/JSON file by path (read again at every call)."""
    s = os.fspath(name_or_path)
    if os.sep in s or s.endswith((".yaml", ".yml", ".json")):
        return _parse_text(_read_profile_file(s), s)
    if s.startswith("_") or s not in list_profiles():
        raise ProfileError(s, "", "no such profile (shipped: " + ", ".join(list_profiles()) + ")")
    return _shipped(s)


@functools.cache
def _shipped(name: str) -> Profile:
    # A shipped profile is parsed once per process (3-8 ms of YAML each time, and every simulated host starts
    # from one): its file ships with the package, and a Profile is immutable (frozen dataclasses, tuples).
    file = f"{name}.yaml"
    return _parse_text(profiles_dir().joinpath(file).read_text(encoding="utf-8"), file)


def _parse_text(text: str, file: str) -> Profile:
    try:
        raw = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 -- a safe loader (CSafeLoader or SafeLoader)
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):     # libyaml's own limit (1,000 levels)
            raise ProfileError(file, "", "not valid YAML/JSON: nested too deeply") from exc
        raise ProfileError(file, "", f"not valid YAML/JSON: {' '.join(str(exc).split())}") from exc
    except RecursionError as exc:   # the pure-Python loader composes nested collections recursively
        raise ProfileError(file, "", "not valid YAML/JSON: nested too deeply") from exc
    return _parse_profile(raw, file)


# The largest shipped profile is ~10 KiB; a bigger file is not a profile (``sim:/dev/zero`` never ended).
PROFILE_MAX_BYTES = 1 << 20


def _read_profile_file(path: str) -> str:
    """A profile file's text: a regular file of at most PROFILE_MAX_BYTES of UTF-8, else ProfileError."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ProfileError(path, "", f"cannot read: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ProfileError(path, "", "not a regular file")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(PROFILE_MAX_BYTES + 1)
    if len(data) > PROFILE_MAX_BYTES:
        raise ProfileError(path, "", f"larger than {PROFILE_MAX_BYTES} bytes: not a profile")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(path, "", f"not UTF-8 text (byte {exc.start}): not a YAML/JSON profile") from exc
