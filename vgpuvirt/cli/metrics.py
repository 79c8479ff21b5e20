"""``vgpuvirt metrics [HOST ...] [--json]``: one metrics snapshot (GPUs, their vGPUs and the VMs owning them),
one round trip per host, the hosts in parallel.

    vgpuvirt --host sim:t4x2 metrics
    vgpuvirt metrics sim:t4x2 sim:a10-sriov --json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vgpuvirt.cli.context import Context, plain, printable
from vgpuvirt.cli.targets import open_one
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.services.metrics_model import GpuMetrics, HostMetrics, MetricsSnapshot
from vgpuvirt.usage import GpuUse


def register(sub: Any) -> None:
    p = sub.add_parser("metrics", help="one metrics snapshot: GPU and per-vGPU/VM use, health (one round trip/host)")
    p.add_argument("hosts", nargs="*", metavar="HOST",
                   help="hosts to collect (local, ssh://..., sim:PROFILE); default: the global --host")
    p.add_argument("--connect", metavar="URI", default=None,
                   help="libvirt URI of the (single) host: name the VMs owning each vGPU from their domain XML")
    p.set_defaults(func=run)


def snapshot(ctx: Context, args: argparse.Namespace) -> MetricsSnapshot:
    from vgpuvirt.observe.collect import Collector

    if args.connect and len(args.hosts) > 1:
        raise InvalidSpec("--connect", args.connect, "one host only (each host has its own libvirt)")
    hosts = [open_one(s, ctx.args) for s in args.hosts] if args.hosts else [ctx.host()]
    try:
        domains = None
        if args.connect:
            from vgpuvirt.libvirt_conn import LibvirtConnection
            with LibvirtConnection(args.connect, readonly=True) as conn:
                domains = {hosts[0].name: list(conn.domain_xml_pairs())}
        return Collector().collect_many(hosts, domains=domains)
    finally:
        if args.hosts:
            for h in hosts:
                h.close()


def run(ctx: Context, args: argparse.Namespace) -> int:
    snap = snapshot(ctx, args)
    if ctx.json:
        ctx.emit_json(snap.to_dict())
    else:
        render(ctx.console(), snap)
    down = [h for h in snap.hosts if not h.up]
    if down:
        # the snapshot (with up: false and the reason) is printed; the exit status and one line say it is partial
        print(printable(f"vgpuvirt: error: {len(down)} of {len(snap.hosts)} host(s) did not answer: "
                        + "; ".join(f"{h.host}: {h.error}" for h in down)), file=sys.stderr)
        return 1
    return 0


def _v(value: float | int | None, unit: str = "", fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value) + unit


def _gpu_row(g: GpuMetrics) -> list[str]:
    health = "yes" if g.health.healthy else "[bold red]NO[/]"
    p = g.pcie
    link = (f"{_v(p.gen_current)}x{_v(p.width_current)}/{_v(p.gen_max)}x{_v(p.width_max)}"
            if p.gen_max is not None or p.width_max is not None else "-")
    fb = f"{_v(g.fb_used_mib)}/{_v(g.fb_total_mib)}"
    return [plain(g.address), plain(g.mode or "-"), _v(g.sm_util_pct, "%"),
            _v(g.memory_util_pct, "%"), _v(g.encoder_util_pct, "%"), _v(g.decoder_util_pct, "%"), fb,
            _v(g.temperature_c, "C"), _v(g.power_w, "W"), link, str(len(g.vgpus)), plain(g.vm_name or "-"), health]


def render(console: Any, snap: MetricsSnapshot) -> None:
    from rich.table import Table

    for h in snap.hosts:
        _render_host(console, h, Table)


def _render_host(console: Any, h: HostMetrics, table: Any) -> None:
    if not h.up:
        console.print(f"[bold]{plain(h.host)}[/]: [bold red]DOWN[/] {plain(h.error or '')}")
        return
    took = f" in {h.duration_s * 1000:.0f} ms, {h.round_trips} round trip(s)" if h.duration_s is not None else ""
    console.print(f"[bold]{plain(h.host)}[/]: {len(h.gpus)} GPU(s){plain(took)}")
    for g in h.gpus:
        console.print(plain(f"  {g.address}  {g.name or '-'}"))
    t = table(show_edge=False)
    for c in ("GPU", "mode", "SM", "mem", "enc", "dec", "FB MiB", "temp", "power", "PCIe", "vGPUs", "VM", "healthy"):
        t.add_column(c, no_wrap=c in ("GPU", "FB MiB", "PCIe"))
    for g in h.gpus:
        t.add_row(*_gpu_row(g))
    console.print(t)
    vt = table(show_edge=False, title="vGPUs")
    for c in ("vGPU", "GPU", "type", "VM", "FB used", "SM", "enc", "dec", "sess", "FPS", "latency", "FRL"):
        vt.add_column(c, overflow="fold")
    rows = 0
    for g in h.gpus:
        for v in g.vgpus:
            frl = "off" if v.frl_enabled is False else _v(v.frame_rate_limit_fps, " fps")
            short = v.id[:8] if v.kind == GpuUse.MDEV else v.id   # the whole UUID is in --json
            vt.add_row(plain(short), plain(g.address[5:]), plain(v.type_name or v.type_id or "-"),
                       plain(v.vm_name or "-"),
                       _v(v.fb_used_mib, " MiB"), _v(v.sm_util_pct, "%"), _v(v.encoder_util_pct, "%"),
                       _v(v.decoder_util_pct, "%"), _v(v.encoder_sessions), _v(v.encoder_fps),
                       _v(v.encoder_latency_us, " us"), frl)
            rows += 1
    if rows:
        console.print(vt)
    for g in h.gpus:
        if not g.health.healthy:
            console.print(plain(f"  {g.address} unhealthy: {'; '.join(g.health.reasons)}"))
        for x in g.xids or ():
            console.print(plain(f"  {g.address} XID {x.code}: {x.message}"))
    for w in h.warnings:
        console.print(f"  [yellow]warning:[/] {plain(w)}")
