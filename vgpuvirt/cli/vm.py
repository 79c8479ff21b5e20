"""``vgpuvirt vm``: list a host's VMs with their GPUs; start, shut down, reboot, power off, suspend or resume VMs.

    vgpuvirt --host sim:t4x2 vm list --connect test:///default
    vgpuvirt vm start desk-001 desk-002
    vgpuvirt --json vm list 'desk-*'

``list`` joins libvirt's domains with the host's inventory (one read): each GPU device with its mdev
UUID and type or its PCI address, the vGPU type's name, and the host; vGPUs the domain names that the host
no longer has (MISSING), then the other host devices (NIC VF, the GPU's HDMI audio).
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import sys
from typing import Any

from vgpuvirt.cli.context import Context, plain, printable
from vgpuvirt.cli.targets import add_connect, connect_uris
from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.libvirt_conn import LibvirtConnection

log = logging.getLogger("vgpuvirt.cli")
ACTIONS = ("start", "shutdown", "reboot", "destroy")


def connection(ctx: Context, args: argparse.Namespace) -> LibvirtConnection:
    """The libvirt connection of the one host these verbs work on: --connect, else the host's default
    (vgpuvirt.libvirt_uri.default_uri: the SSH host's own user, port, key and known_hosts)."""
    from vgpuvirt.libvirt_uri import default_uri
    return LibvirtConnection(connect_uris(args, 1)[0] or default_uri(ctx.host()))


def register(sub: Any) -> None:
    p = sub.add_parser("vm", help="list VMs with their GPUs; start, shutdown, reboot, destroy, suspend, resume",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="vm_command", metavar="ACTION")
    s.required = True
    ls = s.add_parser("list", help="every VM of the host with its GPUs (mdev UUID/type or PCI device)")
    ls.add_argument("pattern", nargs="?", default=None, help="only VMs whose name matches this glob")
    add_connect(ls)
    ls.set_defaults(func=_list)
    for action, text in zip(ACTIONS, ("start (define first: vgpuvirt provision)", "ask the guest to shut down (ACPI)",
                                      "ask the guest to reboot (ACPI)", "power off at once (the definition stays)"),
                            strict=True):
        a = s.add_parser(action, help=text)
        a.add_argument("names", nargs="+", metavar="VM")
        add_connect(a)
        a.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
        a.set_defaults(func=_act, action=action)
    for action, text in (("suspend", "save a running VM to disk (managed save); its vGPUs stay reserved for it"),
                         ("resume", "restore a suspended VM, creating again any vGPU the host lost")):
        a = s.add_parser(action, help=text)
        a.add_argument("names", nargs="+", metavar="VM")
        add_connect(a)
        a.set_defaults(func=_save, action=action)


def _list(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.provision.vms import vm_infos
    from vgpuvirt.services.inventory.read import inventory

    with connection(ctx, args) as conn:
        doms = [d for d in conn.domains() if args.pattern is None or fnmatch.fnmatchcase(d.name, args.pattern)]
        host = ctx.host()
        try:
            inv = inventory(host, domains=[(d.name, d.xml) for d in doms]) if doms else None
        except VgpuvirtError as exc:
            # The VMs are still worth listing: types then come from vgpuvirt's metadata only.
            print(printable(f"vgpuvirt: warning: cannot read {host.name}: {exc}; GPU types from metadata only"),
                  file=sys.stderr)
            inv = None
        vms = vm_infos(host.name, doms, inv)
        uri = conn.uri
    if ctx.json:
        ctx.emit_json({"host": host.name, "uri": uri, "vms": [v.to_dict() for v in vms]})
        return 0
    from rich.table import Table

    t = Table(title=f"VMs on {plain(host.name)} ({plain(uri)})")
    for col in ("VM", "state", "GPU device", "type", "type name", "host"):
        t.add_column(col, overflow="fold")
    for v in vms:
        # GPUs first; then what the domain names that the host lacks; then the devices that come along
        rows: list[tuple[Any, str]] = [(g, "") for g in v.gpus] + [(g, "MISSING ") for g in v.missing] \
            + [(g, "") for g in v.devices]
        for i, (g, note) in enumerate(rows or [(None, "")]):
            dev = "-" if g is None else f"{note}{g.kind} {g.device}"
            t.add_row(*map(plain, (v.name if i == 0 else "", v.state if i == 0 else "", dev,
                                   (g.type if g else None) or "-", (g.type_name if g else None) or "-", v.host)))
    ctx.console().print(t)
    if any(v.missing for v in vms):
        print(printable("vgpuvirt: note: MISSING: a vGPU the VM's domain names is not on the host (gone after a "
                        "reboot?); `vgpuvirt provision` with the same request re-creates it"), file=sys.stderr)
    return 0


def _would(action: str, running: bool) -> tuple[bool, str]:
    """(changed, text) of a dry run: what ``action`` would do to a VM that is (not) running."""
    if action == "start":
        return not running, "would start" if not running else "already running"
    if action in ("destroy", "shutdown"):
        return running, (f"would {'power off' if action == 'destroy' else 'request shutdown'}" if running
                         else "not running")
    return True, "would request reboot" if running else "not running: reboot would be refused"


def _act(ctx: Context, args: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = []
    with connection(ctx, args) as conn:
        for name in args.names:
            was = conn.is_active(name)
            if args.dry_run:
                changed, text = _would(args.action, was)
            elif args.action == "start":
                conn.start(name)
                changed, text = not was, "started" if not was else "already running"
            elif args.action == "destroy":
                changed = conn.destroy(name)
                text = "powered off" if changed else "not running"
            elif args.action == "shutdown":
                conn.shutdown(name)
                changed, text = was, "shutdown requested" if was else "not running"
            else:
                conn.reboot(name)
                changed, text = True, "reboot requested"
            out.append({"vm": name, "action": args.action, "changed": changed, "result": text})
            if not ctx.json:
                print(printable(f"{name}: {text}"))
    if ctx.json:
        ctx.emit_json({"uri": conn.uri, "dry_run": args.dry_run, "vms": out})
    return 0


def _save(ctx: Context, args: argparse.Namespace) -> int:
    """suspend / resume: the VMs' vGPUs are the host's business too, so these take the host (``--host``)."""
    from vgpuvirt.provision.mobility.checks import Side
    from vgpuvirt.provision.mobility.suspend import resume, suspend

    out: list[dict[str, Any]] = []
    with connection(ctx, args) as conn:
        side = Side(ctx.host(), conn)
        for name in args.names:
            r = (suspend if args.action == "suspend" else resume)(side, name)
            out.append(r.to_dict())
            if not ctx.json:
                extra = f"; vGPUs created again: {', '.join(r.recreated)}" if r.recreated else ""
                kept = f"; vGPUs kept: {', '.join(r.kept)}" if r.kept else ""
                print(printable(f"{name}: {r.action}{kept}{extra}"))
    if ctx.json:
        ctx.emit_json({"uri": conn.uri, "vms": out})
    return 0
