"""``vgpuvirt inventory [--json]``: what a host offers and what is in use, in one round trip."""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.context import Context, plain
from vgpuvirt.cli.targets import add_connect, connect_uris
from vgpuvirt.services.inventory.read import Inventory, class_name, inventory, type_capacity
from vgpuvirt.usage import Backend


def register(sub: Any) -> None:
    p = sub.add_parser("inventory", help="GPUs, vGPU types and capacity, SR-IOV, IOMMU groups, mdevs")
    add_common_options(p)
    p.set_defaults(func=run)


def add_common_options(p: argparse.ArgumentParser) -> None:
    add_connect(p, help_text="libvirt URI: join mdevs/devices with the domains using them and flag orphans")
    p.add_argument("--no-nvidia-smi", action="store_true",
                   help="do not run nvidia-smi -q -x on the host (it runs in the same round trip otherwise)")
    p.add_argument("--nvml", choices=("auto", "yes", "no"), default="auto",
                   help="NVML enrichment (local host only; 'yes' fails without pynvml)")


def collect(ctx: Context, args: argparse.Namespace) -> Inventory:
    domains = None
    uri = connect_uris(args, 1)[0]
    if uri:
        from vgpuvirt.libvirt_conn import LibvirtConnection

        with LibvirtConnection(uri, readonly=True) as conn:
            domains = list(conn.domain_xml_pairs())
    use_nvml = {"auto": None, "yes": True, "no": False}[args.nvml]
    return inventory(ctx.host(), domains=domains, use_nvml=use_nvml,
                     nvidia_smi=False if args.no_nvidia_smi else None)


def run(ctx: Context, args: argparse.Namespace) -> int:
    inv = collect(ctx, args)
    if ctx.json:
        ctx.emit_json(inv.to_dict())
        return 0
    render(ctx.console(), inv)
    return 0


def _opt(v: object) -> str:
    return "-" if v is None else str(v)


def render(console: Any, inv: Inventory) -> None:
    from rich.table import Table

    iommu = "[green]on[/]" if inv.iommu_enabled else "[bold red]OFF[/]"
    drv = f", NVIDIA driver {inv.nvidia_driver_version}" if inv.nvidia_driver_version else ""
    console.print(f"[bold]{plain(inv.host)}[/]: {len(inv.gpus)} GPU(s), IOMMU {iommu}{plain(drv)}")

    t = Table(title="GPUs", title_justify="left")
    for col in ("address", "vendor / name", "driver", "backend", "mode", "NUMA", "group", "VFs", "vGPUs", "reset"):
        t.add_column(col, no_wrap=col in ("address", "backend"))
    modes = {b.address: b.mode.capacity_word + (f" ({b.sizing}-size)" if b.sizing and b.residents else "")
             for b in inv.capacity()}
    for g in inv.gpus:
        name = g.name or f"{g.vendor_name or g.vendor} {g.device}"
        vfs = f"{g.sriov_numvfs or 0}/{g.sriov_totalvfs}" if g.sriov_totalvfs else "-"
        use = str(g.vgpus_in_use) if g.backend not in (Backend.PASSTHROUGH, Backend.SRIOV_VF) else (g.domain or "-")
        t.add_row(*map(plain, (g.address, name, _opt(g.driver), g.backend, modes.get(g.address, "-"),
                               _opt(g.numa_node), _opt(g.iommu_group), vfs, use,
                               " ".join(g.reset_methods or []) or "-")))
    console.print(t)

    rows = type_capacity(inv)
    if rows:
        tt = Table(title="vGPU types (fit now/max per GPU; * = the host's own figure)", title_justify="left")
        for col in ("parent", "type", "name", "free/max", "in use", "FB MiB", "series"):
            tt.add_column(col, no_wrap=col in ("parent", "type", "free/max"))
        for r in rows:
            free = f"{r.available}{'' if r.exact else '*'}/{_opt(r.max_instances)}"
            style = "dim" if r.available == 0 else None
            series = (r.series or "-") + (f" MIG {r.gi_profile}" if r.mig_backed else "")
            tt.add_row(*map(plain, (r.parent, r.id, _opt(r.name), free, r.in_use, _opt(r.framebuffer_mib), series)),
                       style=style)
        console.print(tt)

    if inv.vendor_vgpu:
        vt = Table(title="NVIDIA vendor-specific VFs (vGPU 17+)", title_justify="left")
        for col in ("PF", "VFs", "configured", "free", "types offered"):
            vt.add_column(col)
        by_pf: dict[str, list[Any]] = {}
        for v in inv.vendor_vgpu:
            by_pf.setdefault(str(v.physfn or v.address), []).append(v)
        for pf, members in sorted(by_pf.items()):
            configured = [f"{m.address}={m.current_type_name or m.current_type}" for m in members if m.current_type]
            offered = len({c.id for m in members for c in m.creatable_types})
            vt.add_row(*map(plain, (pf, len(members), ", ".join(configured) or "-",
                                    sum(1 for m in members if not m.current_type), offered)))
        console.print(vt)

    if inv.mdevs:
        mt = Table(title="mdevs", title_justify="left")
        for col in ("uuid", "parent", "type", "domain"):
            mt.add_column(col)
        for m in inv.mdevs:
            dom = plain(m.domain) if m.domain else ("[yellow]orphan[/]" if m.orphan else "-")
            mt.add_row(plain(m.uuid), plain(_opt(m.parent)), plain(_opt(m.type)), dom)
        console.print(mt)

    gpu_groups = {g.iommu_group for g in inv.gpus if g.iommu_group is not None}
    if gpu_groups:
        gt = Table(title="IOMMU groups with GPUs", title_justify="left")
        gt.add_column("group")
        gt.add_column("members")
        for gid in sorted(gpu_groups):
            members = []
            for a in inv.iommu_groups.get(gid, []):
                d = inv.device(a)
                members.append(plain(f"{a} ({class_name(d.pci_class if d else None)}, "
                                     f"{_opt(d.driver if d else None)})"))
            gt.add_row(plain(gid), "\n".join(members))
        console.print(gt)

    for g in inv.gpus:
        for note in g.notes:
            console.print(f"[cyan]note[/]: GPU {plain(g.address)}: {plain(note)}")
    for w in inv.warnings:
        console.print(f"[bold yellow]warning[/]: {plain(w)}")
