"""``vgpuvirt top``'s frame: hosts, their GPUs, each GPU's vGPUs and the VMs that own them, with bars.

Pure rendering (a snapshot in, a rich renderable out); host text goes through :func:`plain`, so a type name or
a VM name cannot inject markup or control sequences into the terminal.
"""

from __future__ import annotations

import time

from rich.bar import Bar
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from vgpuvirt.cli.context import plain
from vgpuvirt.services.metrics_model import GpuMetrics, HostMetrics, MetricsSnapshot, VgpuMetrics
from vgpuvirt.usage import GpuUse

BAR_WIDTH = 8


def _bar(pct: float | None) -> RenderableType:
    if pct is None:
        return Text("-".center(BAR_WIDTH + 5), style="dim")
    value = max(0.0, min(100.0, pct))
    color = "green" if value < 60 else "yellow" if value < 85 else "red"
    grid = Table.grid(padding=(0, 1))
    grid.add_row(Bar(100, 0, value, width=BAR_WIDTH, color=color), Text(f"{value:3.0f}%"))
    return grid


def _fb(used: int | None, total: int | None) -> str:
    if used is None and total is None:
        return "-"
    pct = f" {100 * used / total:3.0f}%" if used is not None and total else ""
    return f"{'-' if used is None else used}/{'-' if total is None else total}{pct}"


def _n(v: float | int | None, unit: str) -> str:
    return "-" if v is None else f"{v:.0f}{unit}"


def _gpu_row(t: Table, g: GpuMetrics) -> None:
    health = "ok" if g.health.healthy else "[bold red]UNHEALTHY[/] " + plain("; ".join(g.health.reasons))
    # a passed-through GPU's whole use is its VM's: name the VM where a vGPU row would
    mode = plain(g.mode or "-") + (f" {plain(g.vm_name)}" if g.vm_name else "")
    t.add_row(f"[bold]{plain(g.address)}[/]", plain(g.name or "-"), mode, _bar(g.sm_util_pct),
              _fb(g.fb_used_mib, g.fb_total_mib), f"{_n(g.temperature_c, 'C')} {_n(g.power_w, 'W')}", health)


def _vgpu_row(t: Table, v: VgpuMetrics, last: bool) -> None:
    branch = "└─" if last else "├─"
    vm = plain(v.vm_name) if v.vm_name else "[dim](no VM)[/]"
    ident = plain(v.id[:8] if v.kind == GpuUse.MDEV else v.id)
    t.add_row(f"  {branch} {ident}", plain(v.type_name or v.type_id or "-"), vm, _bar(v.sm_util_pct),
              _fb(v.fb_used_mib, v.fb_total_mib),
              f"enc {_n(v.encoder_util_pct, '%')}" + (f" {v.encoder_fps:.0f}fps" if v.encoder_fps else ""),
              "frl off" if v.frl_enabled is False else "")


def host_table(h: HostMetrics) -> RenderableType:
    title = f"[bold]{plain(h.host)}[/]"
    if not h.up:
        return Text.from_markup(f"{title}  [bold red]DOWN[/] {plain(h.error or '')}")
    t = Table(title=title + (f"  driver {plain(h.driver_version)}" if h.driver_version else ""),
              title_justify="left", expand=False, box=None, padding=(0, 1))
    t.add_column("GPU / vGPU", no_wrap=True, min_width=14)      # an address is never cut
    for col in ("name / type", "mode / VM"):
        t.add_column(col, no_wrap=True, overflow="ellipsis", min_width=8)
    t.add_column("SM use", no_wrap=True, width=BAR_WIDTH + 5)     # a Bar would take all the width it is given
    for col in ("FB MiB", "", "health"):
        t.add_column(col, no_wrap=True, overflow="ellipsis")
    if not h.gpus:
        t.add_row("[dim](no GPUs)[/]", "", "", "", "", "", "")
    for g in h.gpus:
        _gpu_row(t, g)
        for i, v in enumerate(g.vgpus):
            _vgpu_row(t, v, i == len(g.vgpus) - 1)
    return t


def frame(snap: MetricsSnapshot, *, interval: float | None = None) -> RenderableType:
    """One screen: a header line, then one table per host."""
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.collected_at))
    gpus = sum(len(h.gpus) for h in snap.hosts)
    vgpus = sum(len(g.vgpus) for h in snap.hosts for g in h.gpus)
    down = [h.host for h in snap.hosts if not h.up]
    head = (f"[bold]vgpuvirt top[/]  {stamp}  hosts {len(snap.hosts)}"
            + (f" ([red]{len(down)} down[/])" if down else "") + f"  GPUs {gpus}  vGPUs {vgpus}"
            + (f"  every {interval:g} s, q quits" if interval else ""))
    return Group(Text.from_markup(head), *(host_table(h) for h in snap.hosts))
