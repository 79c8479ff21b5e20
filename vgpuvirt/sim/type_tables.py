"""vGPU type tables: ``profiles/_types.yaml`` (built in) and a profile's own ``type_tables``."""

from __future__ import annotations

import errno as _errno
import importlib.resources
import re
from typing import Any

import yaml

from vgpuvirt.sim.profile_fields import ProfileContext, errno_value
from vgpuvirt.sim.profile_spec import MigProfile, TypeTable, VgpuType

_TYPES_FILE = "_types.yaml"
_MIG_NAME = re.compile(r"^[1-8]g\.\d{1,4}gb(?:[+-](?:me|gfx)(?:\.all)?)?\Z")


def profiles_dir() -> Any:
    return importlib.resources.files("vgpuvirt.sim").joinpath("profiles")


def _nvidia_description(t: dict[str, Any]) -> str:
    return (f"num_heads={t['heads']}, frl_config={t['frl']}, framebuffer={t['fb']}M, "
            f"max_resolution={t['res']}, max_instance={t['max']}\n")


def _gvt_description(t: dict[str, Any]) -> str:
    return (f"low_gm_size: {t['low_gm']}MB\nhigh_gm_size: {t['high_gm']}MB\nfence: {t['fence']}\n"
            f"resolution: {t['res']}\nweight: {t['weight']}\n")


def parse_table(ctx: ProfileContext, name: str, raw: Any, key: str) -> TypeTable:
    m = ctx.mapping(raw, key)
    ctx.keys(m, key, {"driver", "mdev_driver", "framebuffer_mib", "heterogeneous", "mig_profiles", "compute_slices",
                      "memory_slices", "mig_reset", "types", "create_errno", "fb_total_mib", "fb_reserved_mib"},
             {"driver", "mdev_driver", "types"})
    driver = ctx.text(m["driver"], f"{key}.driver")
    # a board known only by its MIG table (no vGPU type seen on it) has an empty list
    if not isinstance(m["types"], list) or not (m["types"] or m.get("mig_profiles")):
        raise ctx.fail(f"{key}.types", "expected a non-empty list")
    types: list[VgpuType] = []
    seen: set[str] = set()
    for i, row in enumerate(m["types"]):
        rk = f"{key}.types[{i}]"
        r = ctx.mapping(row, rk)
        if driver == "i915":
            ctx.keys(r, rk, {"id", "low_gm", "high_gm", "fence", "weight", "res", "name"},
                     {"id", "low_gm", "high_gm", "fence", "weight", "res"})
            sid = ctx.text(r["id"], f"{rk}.id")
            vals = {k: ctx.integer(r[k], f"{rk}.{k}", 1) for k in ("low_gm", "high_gm", "fence", "weight")}
            t = VgpuType(sysfs_id=f"i915-{sid}", name=str(r.get("name", sid)), low_gm=vals["low_gm"],
                         high_gm=vals["high_gm"], fence=vals["fence"], weight=vals["weight"],
                         max_resolution=ctx.text(r["res"], f"{rk}.res"),
                         description=_gvt_description({**r, **vals}))
        else:
            ctx.keys(r, rk, {"id", "name", "fb", "heads", "frl", "res", "max", "mig"},
                     {"id", "name", "fb", "heads", "frl", "res", "max"})
            num = ctx.integer(r["id"], f"{rk}.id", 1, 1 << 30)
            vals = {k: ctx.integer(r[k], f"{rk}.{k}", 0) for k in ("fb", "heads", "frl", "max")}
            if vals["fb"] <= 0 or vals["max"] <= 0:
                raise ctx.fail(f"{rk}", "fb and max must be positive")
            t = VgpuType(sysfs_id=f"{driver}-{num}", number=num, name=ctx.text(r["name"], f"{rk}.name"),
                         framebuffer_mib=vals["fb"], num_heads=vals["heads"], frl=vals["frl"],
                         max_resolution=ctx.text(r["res"], f"{rk}.res"), max_instance=vals["max"],
                         mig_profile=ctx.text(r["mig"], f"{rk}.mig") if "mig" in r else None,
                         description=_nvidia_description({**r, **vals}))
        if t.sysfs_id in seen:
            raise ctx.fail(f"{rk}.id", f"duplicate type {t.sysfs_id}")
        seen.add(t.sysfs_id)
        types.append(t)
    migs: list[MigProfile] = []
    for i, row in enumerate(m.get("mig_profiles") or []):
        rk = f"{key}.mig_profiles[{i}]"
        r = ctx.mapping(row, rk)
        ctx.keys(r, rk, {"id", "name", "max", "slices", "gib", "engines"}, {"id", "name", "max", "slices"})
        pname = ctx.text(r["name"], f"{rk}.name")
        if not _MIG_NAME.match(pname):
            raise ctx.fail(f"{rk}.name", f"{pname!r} is not a MIG profile name such as 1g.10gb or 1g.10gb+me")
        engines = r.get("engines", [])
        if not isinstance(engines, list) or len(engines) not in (0, 6):
            raise ctx.fail(f"{rk}.engines", "expected [SM, DEC, ENC, CE, JPEG, OFA]")
        gib = r.get("gib", 0)
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib < 0:
            raise ctx.fail(f"{rk}.gib", f"expected a non-negative number, got {gib!r}")
        migs.append(MigProfile(ctx.integer(r["id"], f"{rk}.id", 0), pname,
                               ctx.integer(r["max"], f"{rk}.max", 1), ctx.integer(r["slices"], f"{rk}.slices", 1, 8),
                               float(gib), tuple(ctx.integer(e, f"{rk}.engines[{j}]", 0)
                                                 for j, e in enumerate(engines))))
    slices = ctx.integer(m.get("compute_slices", 7), f"{key}.compute_slices", 1, 8)
    mem_slices = ctx.integer(m.get("memory_slices", 8), f"{key}.memory_slices", 1, 8)
    if mem_slices < slices or mem_slices & (mem_slices - 1):
        raise ctx.fail(f"{key}.memory_slices", f"{mem_slices} must be a power of two of at least compute_slices")
    for i, p in enumerate(migs):
        if p.slices > slices:
            raise ctx.fail(f"{key}.mig_profiles[{i}].slices", f"{p.slices} is more than compute_slices ({slices})")
    names = {p.name for p in migs}
    for t in types:
        if t.mig_profile and t.mig_profile not in names:
            raise ctx.fail(f"{key}.types", f"{t.sysfs_id} uses MIG profile {t.mig_profile!r} not in mig_profiles")
    return TypeTable(name=name, driver=driver, mdev_driver=ctx.text(m["mdev_driver"], f"{key}.mdev_driver"),
                     types=tuple(types),
                     framebuffer_mib=ctx.integer(m.get("framebuffer_mib", 0), f"{key}.framebuffer_mib", 0),
                     heterogeneous=ctx.boolean(m.get("heterogeneous", False), f"{key}.heterogeneous"),
                     mig_profiles=tuple(migs), compute_slices=slices, memory_slices=mem_slices,
                     mig_reset=ctx.boolean(m.get("mig_reset", True), f"{key}.mig_reset"),
                     create_errno=errno_value(ctx, m["create_errno"], f"{key}.create_errno")
                     if "create_errno" in m else _errno.EINVAL,
                     fb_total_mib=ctx.integer(m.get("fb_total_mib", 0), f"{key}.fb_total_mib", 0),
                     fb_reserved_mib=ctx.integer(m.get("fb_reserved_mib", 0), f"{key}.fb_reserved_mib", 0))


#: libyaml's safe loader where PyYAML has it, else the pure-Python one (the same documents; benchmarks/bench_sim.py
#: prints both for the shipped profiles); libyaml refuses nesting deeper than 1,000 levels itself
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_BUILTIN_TABLES: dict[str, TypeTable] | None = None


def builtin_type_tables() -> dict[str, TypeTable]:
    global _BUILTIN_TABLES
    if _BUILTIN_TABLES is None:
        f = profiles_dir().joinpath(_TYPES_FILE)
        # read by every simulated host's first start
        raw = yaml.load(f.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)
        ctx = ProfileContext(_TYPES_FILE)
        tables = ctx.mapping(ctx.mapping(raw, "")["tables"], "tables")
        _BUILTIN_TABLES = {n: parse_table(ctx, n, t, f"tables.{n}") for n, t in tables.items()}
    return _BUILTIN_TABLES
