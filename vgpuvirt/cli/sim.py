"""``vgpuvirt sim``: list, show, materialize and mount simulated GPU hosts."""

from __future__ import annotations

import argparse
import os
from typing import Any

from vgpuvirt.cli.context import Context, plain
from vgpuvirt.errors import InvalidSpec


def register(sub: Any) -> None:
    p = sub.add_parser("sim", help="simulated GPU hosts (profiles, static trees, live FUSE mounts)")
    s = p.add_subparsers(dest="sim_command", metavar="ACTION")
    s.required = True
    s.add_parser("list", help="the shipped profiles").set_defaults(func=_list)
    show = s.add_parser("show", help="what a profile contains")
    show.add_argument("profile", help="a shipped profile name or a YAML/JSON file")
    show.set_defaults(func=_show)
    mat = s.add_parser("materialize", help="write a profile's sysfs as a static tree (for --sysfs-root)")
    mat.add_argument("profile")
    mat.add_argument("dest", help="directory to create DEST/sys in (must be empty or absent)")
    mat.set_defaults(func=_materialize)
    mnt = s.add_parser("mount", help="mount a live simulated sysfs with FUSE (root); DIR/sys appears")
    mnt.add_argument("profile")
    mnt.add_argument("mountpoint")
    mnt.add_argument("--background", action="store_true", help="serve from a background process and return")
    mnt.add_argument("--pid-file", default=None, help="with --background: where to write the server's pid")
    mnt.set_defaults(func=_mount)
    rb = s.add_parser("reboot", help="reboot a mounted simulated host (VFs, MIG instances, mdevs vanish)")
    rb.add_argument("mountpoint")
    rb.add_argument("--pid-file", required=True, help="the file `sim mount --background --pid-file` wrote")
    rb.set_defaults(func=_reboot)
    drv = s.add_parser("install-driver", help="install a vGPU manager version on a mounted simulated host "
                                              "(reported after `sim reboot`)")
    drv.add_argument("mountpoint")
    drv.add_argument("version", help="the new version, e.g. 580.95.05")
    drv.set_defaults(func=_install_driver)
    um = s.add_parser("umount", help="unmount a simulated sysfs")
    um.add_argument("mountpoint")
    um.add_argument("--pid-file", default=None, help="wait for (and remove) the server named in this file")
    um.set_defaults(func=_umount)
    from vgpuvirt.cli import sim_fault
    sim_fault.register(s)


def _list(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim import list_profiles, load_profile
    rows = [{"name": n, "description": load_profile(n).description} for n in list_profiles()]
    if ctx.json:
        ctx.emit_json(rows)
    else:
        con = ctx.console()
        for r in rows:
            con.print(plain(f"{r['name']:<14} {r['description']}"))
    return 0


def summary(profile_name: str) -> dict[str, Any]:
    from vgpuvirt.sim import SimHost
    host = SimHost.from_profile(profile_name)
    m = host.model
    gpus = []
    for addr, g in m.gpus.items():
        d = m.devices[addr]
        gpus.append({"address": addr, "product": d.spec.product, "mode": g.spec.mode, "type_table": g.table.name,
                     "types": len(g.table.types), "vfs": d.numvfs,
                     "sriov_totalvfs": d.spec.sriov.totalvfs if d.spec.sriov else None,
                     "mig_enabled": g.mig_enabled, "gpu_instances": dict(sorted(g.gpu_instances.items())),
                     "mig_pending": g.mig_pending, "gpu_instance_starts": dict(sorted(g.gi_start.items())),
                     "numa_node": d.numa_node})
    return {"name": host.profile.name, "description": host.profile.description, "iommu": m.iommu,
            "numa_nodes": len(host.profile.nodes), "pci_devices": len(m.devices), "iommu_groups": len(m.groups()),
            "mdev_parents": len(m.mdev_parents()), "mdevs": len(m.mdevs), "gpus": gpus}


def _show(ctx: Context, args: argparse.Namespace) -> int:
    info = summary(args.profile)
    if ctx.json:
        ctx.emit_json(info)
        return 0
    con = ctx.console()
    con.print(plain(f"{info['name']}: {info['description']}"))
    con.print(f"  PCI devices {info['pci_devices']}, IOMMU {'on' if info['iommu'] else 'off'} "
              f"({info['iommu_groups']} groups), NUMA nodes {info['numa_nodes']}, mdev parents "
              f"{info['mdev_parents']}, mdevs {info['mdevs']}")
    for g in info["gpus"]:
        vfs = f", VFs {g['vfs']}/{g['sriov_totalvfs']}" if g["sriov_totalvfs"] else ""
        gis = ", ".join(f"{p}@{g['gpu_instance_starts'].get(i, 0)}" for i, p in g["gpu_instances"].items())
        mig = f", MIG on ({len(g['gpu_instances'])} GIs{': ' + gis if gis else ''})" if g["mig_enabled"] else ""
        con.print(plain(f"  {g['address']} {g['product']}: {g['mode']} ({g['types']} types of {g['type_table']})"
                        f"{vfs}{mig}"))
    return 0


def _materialize(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim import materialize
    dest = os.path.abspath(args.dest)
    if os.path.exists(dest) and os.listdir(dest):
        raise InvalidSpec("destination", args.dest, "an empty or absent directory")
    n = materialize(args.profile, dest)
    if ctx.json:
        ctx.emit_json({"profile": args.profile, "sysfs_root": dest, "entries": n})
    else:
        ctx.console().print(plain(f"{n} entries written; use --sysfs-root {dest}"))
    return 0


def _mount(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim import fuse
    mnt = os.path.abspath(args.mountpoint)
    if not os.path.isdir(mnt):
        raise InvalidSpec("mount point", args.mountpoint, "an existing directory")
    if args.background:
        pid = fuse.start(args.profile, mnt, pid_file=args.pid_file)
        if ctx.json:
            ctx.emit_json({"profile": args.profile, "mountpoint": mnt, "pid": pid})
        else:
            ctx.console().print(plain(f"mounted {args.profile} on {mnt} (pid {pid}); --sysfs-root {mnt}"))
        return 0
    if args.pid_file:
        raise InvalidSpec("--pid-file", args.pid_file, "only with --background")
    fuse.mount(args.profile, mnt, foreground=True)
    return 0


def _umount(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim import fuse
    mnt = os.path.abspath(args.mountpoint)
    fuse.stop(mnt, pid_file=args.pid_file)
    if ctx.json:
        ctx.emit_json({"mountpoint": mnt, "mounted": False})
    return 0


def _reboot(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim import fuse
    boot_id = fuse.reboot(os.path.abspath(args.mountpoint), pid_file=args.pid_file)
    if ctx.json:
        ctx.emit_json({"mountpoint": os.path.abspath(args.mountpoint), "boot_id": boot_id})
    else:
        ctx.console().print(plain(f"rebooted the simulated host on {args.mountpoint} (boot_id {boot_id})"))
    return 0


def _install_driver(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim.package import install_driver
    mnt = os.path.abspath(args.mountpoint)
    v = install_driver(mnt, args.version)
    if ctx.json:
        ctx.emit_json({"mountpoint": mnt, "installed_driver": v})
    else:
        ctx.console().print(plain(f"vGPU manager {v} installed on {args.mountpoint}; it loads at the next "
                                  "`sim reboot`"))
    return 0
