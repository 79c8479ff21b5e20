"""``vgpuvirt provision``: inventory, placement, vGPU creation, XML, define and start, on one or
several hosts (in parallel, one connection each), with a summary table.

    vgpuvirt --host sim:t4x2 provision --connect test:///default --count 4 --gpu 'fb>=2G,series=Q'
    vgpuvirt --host ssh://root@gpu1 --host ssh://root@gpu2 provision --count 40 --gpu nvidia-231 --explain
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from vgpuvirt.change.step import Step
from vgpuvirt.cli.context import plain, printable
from vgpuvirt.cli.license_args import add_license_args, license_from_args
from vgpuvirt.cli.targets import add_connect, open_targets
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.provision.placement import POLICIES
from vgpuvirt.provision.plan import Plan
from vgpuvirt.provision.request import NicRequest, VgpuRequest, VmRequest, provisioning_options

__all__ = ["add_request_args", "add_target_args", "open_targets", "progress_bar", "run"]


def add_target_args(p: argparse.ArgumentParser) -> None:
    # the hosts are the global --host (repeatable; vgpuvirt/cli/options.py); --connect pairs with them
    add_connect(p)


def add_request_args(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    p.add_argument("--name", action="append", default=None, help="VM name (repeat); or use --prefix/--count")
    p.add_argument("--prefix", default="vm", help="name prefix for --count (default: vm -> vm-001, vm-002, ...)")
    p.add_argument("--count", type=int, default=None, help="number of VMs (default: 1, or the number of --name)")
    p.add_argument("--gpu", action="append", default=None, metavar="SPEC",
                   help="per-VM GPU: a type (nvidia-231, 'GRID T4-2Q'), 'passthrough', 'vf', or a need "
                        "('fb>=2G,series=Q,heads>=2,res>=3840x2160,mig=no,vendor=nvidia'); repeat for several GPUs")
    p.add_argument("--template", default="vdi", help="vdi (default), gaming, compute, or a template file")
    p.add_argument("--memory-mib", type=int, default=4096)
    p.add_argument("--vcpus", type=int, default=2)
    p.add_argument("--numa-node", type=int, default=None, help="prefer GPUs on this NUMA node")
    p.add_argument("--numa-strict", action="store_true", help="only GPUs on --numa-node")
    p.add_argument("--nic-vf", nargs="?", const="any", default=None, metavar="PF",
                   help="also give each VM an SR-IOV NIC VF (of this PF, or any)")
    p.add_argument("--disk", default=None, metavar="PATH",
                   help="each VM's disk file; {name} is the VM's name (e.g. /var/lib/libvirt/images/{name}.qcow2)")
    p.add_argument("--clone", default=None, metavar="GOLDEN",
                   help="give each VM a qcow2 linked clone of this golden image (a volume of --pool)")
    p.add_argument("--pool", default=None, help="libvirt storage pool for the --clone volumes ({name}.qcow2)")
    p.add_argument("--clone-reserve", type=int, default=1, metavar="GIB",
                   help="free pool space each --clone must find when planned (default 1 GiB; 0: not checked)")
    p.add_argument("--network", action="append", default=[], metavar="NAME",
                   help="put the VM's NIC on this libvirt network (repeat for more NICs; default: the template's "
                        "'default')")
    p.add_argument("--bridge", action="append", default=[], metavar="NAME",
                   help="a NIC on this host bridge (e.g. br0), after any --network NICs")
    p.add_argument("--tpm", action="store_true", help="give each VM a TPM 2.0 (swtpm; Windows 11 needs it)")
    p.add_argument("--secure-boot", action="store_true", help="UEFI secure boot with Microsoft keys enrolled")
    p.add_argument("--graphics", choices=("spice", "vnc", "none"), default=None,
                   help="the emulated display (default: as the template says)")
    p.add_argument("--no-pin", action="store_true",
                   help="gaming template: do not pin the vCPUs to the GPU's local CPUs (pinned by default)")
    p.add_argument("--policy", choices=POLICIES, default="binpack", help="binpack (default) or spread")
    p.add_argument("--heterogeneous", action="store_true", help="GPUs run in mixed-size (heterogeneous) mode")
    p.add_argument("--no-start", action="store_true", help="define the domains but do not start them")
    p.add_argument("--explain", action="store_true", help="say for each candidate GPU why it was chosen or skipped")
    add_license_args(p)


def requests_from_args(args: argparse.Namespace) -> list[VmRequest]:
    gpus = tuple(VgpuRequest.parse(g) for g in (args.gpu or ())) or (VgpuRequest(),)
    nic = None
    if args.nic_vf:
        nic = NicRequest(pf=None if args.nic_vf == "any" else PciAddress.parse(args.nic_vf))
    kw: dict[str, Any] = dict(template=args.template, memory_mib=args.memory_mib, vcpus=args.vcpus,
                              numa_node=args.numa_node, numa_strict=args.numa_strict, nic=nic,
                              pin_cpus=False if args.no_pin else None,
                              start=not args.no_start, disk=_disk(args), license=license_from_args(args),
                              options=provisioning_options(networks=args.network, bridges=args.bridge, tpm=args.tpm,
                                                           secure_boot=args.secure_boot, graphics=args.graphics))
    if args.name:
        if args.count not in (None, len(args.name)):
            raise InvalidSpec("--count", args.count, f"the number of --name values ({len(args.name)}) or nothing")
        return [VmRequest(name=n, gpus=gpus, **kw) for n in args.name]
    return VmRequest.pool(args.prefix, args.count if args.count is not None else 1, gpu=gpus, **kw)


def _disk(args: argparse.Namespace) -> str | ClonedDisk | None:
    if args.clone is None and args.pool is None:
        return args.disk  # type: ignore[no-any-return]
    if args.clone is None or args.pool is None or args.disk is not None:
        raise InvalidSpec("--clone/--pool", [args.clone, args.pool],
                          "--clone GOLDEN and --pool POOL together, without --disk")
    return ClonedDisk(args.pool, args.clone, reserve_gib=args.clone_reserve)


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str) -> Iterator[Any]:
    """A rich progress bar on a terminal; a no-op otherwise (and always with --json)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), transient=False) as bar:
        yield bar


def print_explain(ctx: Any, plan: Plan) -> None:
    from rich.table import Table

    t = Table(title="placement: every candidate GPU", show_lines=False)
    for col in ("VM", "host", "GPU", "verdict", "why"):
        t.add_column(col)
    for c in plan.explain:
        style = {"chosen": "green", "eligible": "", "skipped": "dim"}[c.verdict]
        t.add_row(*map(plain, (c.vm, c.host, c.gpu, c.verdict, c.reason)), style=style)
    ctx.console().print(t)


def print_summary(ctx: Any, rows: list[dict[str, Any]], seconds: float | None) -> None:
    from rich.table import Table

    t = Table(title="provisioned VMs")
    for col in ("VM", "host", "GPU", "type", "device", "status"):
        t.add_column(col)
    for r in rows:
        t.add_row(*map(plain, (r["vm"], r["host"], r["gpu"] or "-",
                               f"{r['type']} ({r['type_name']})" if r["type"] else "-", r["device"] or "-",
                               r["status"])))
    con = ctx.console()
    con.print(t)
    if seconds is not None:
        con.print(f"{len({r['vm'] for r in rows})} VM(s) in place; applied in {seconds:.2f} s")


def run(ctx: Any, args: argparse.Namespace, *, dry_run: bool) -> int:
    from vgpuvirt.provision.run import provision

    vms = requests_from_args(args)
    tty = sys.stdout.isatty() and not ctx.json
    with open_targets(args) as (hosts, conns), progress_bar(tty and not dry_run, "provisioning") as bar:
        task: list[Any] = []

        def on_plan(p: Plan) -> None:
            if bar is not None:
                task.append(bar.add_task("provisioning", total=max(1, len(p.steps)), last=""))

        def tick(host: str, step: Step) -> None:
            if bar is not None and task:
                bar.update(task[0], advance=1, last=plain(step.describe()))

        try:
            result = provision(hosts, conns, vms, policy=args.policy, heterogeneous=args.heterogeneous,
                               dry_run=dry_run, progress=tick, on_plan=on_plan)
        except ProvisioningError as exc:
            if ctx.json:
                ctx.emit_json({"error": str(exc.cause or exc), "completed": exc.completed, "rollback": exc.rollback})
            else:
                con = ctx.console()
                con.print("[red]provisioning failed; rolled back:[/red]")
                for line in exc.rollback:
                    con.print(f"  - {plain(line)}")
            raise
    if ctx.json:
        ctx.emit_json(result.to_dict())
        return 0
    if args.explain:
        print_explain(ctx, result.plan)
    if dry_run:
        ctx.console().print("\n".join(printable(line) for line in result.plan.format().splitlines()),
                            markup=False)
        return 0
    print_summary(ctx, result.rows(), result.applied.seconds if result.applied else None)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("provision", help="create vGPUs and VMs on one or several hosts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_request_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing (same as `vgpuvirt plan`)")
    p.set_defaults(func=lambda ctx, args: run(ctx, args, dry_run=args.dry_run))
