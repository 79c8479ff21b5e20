"""``vgpuvirt layout export|import|plan|apply|assert|install-boot``: declared GPU layouts (docs/layouts.md).

    vgpuvirt --host sim:a10-sriov layout plan examples/layouts/lab.yaml -c day
    vgpuvirt layout apply lab.yaml -c night --host ssh://root@gpu1 --host ssh://root@gpu2 --drain shutdown
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from vgpuvirt import files
from vgpuvirt.cli import layout_interop
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.targets import host_specs, open_one
from vgpuvirt.errors import InvalidSpec, ProvisioningError
from vgpuvirt.host.base import BaseHost
from vgpuvirt.host.local import LocalHost
from vgpuvirt.layout import interop, verbs
from vgpuvirt.layout.model import Layout, LayoutConfig
from vgpuvirt.layout.schema import dump_layout
from vgpuvirt.libvirt_uri import default_uri


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("layout", help="declare, plan, apply and assert how each GPU of a host is partitioned")
    vs = p.add_subparsers(dest="verb", metavar="VERB")
    vs.required = True
    e = vs.add_parser("export", help="the host as it is, as a layout file (YAML on stdout)")
    e.add_argument("-c", "--config", default=None, help="the config's name in the output (default: exported); "
                                                        "with --layout: the config to export (default: all)")
    _hosts(e)
    layout_interop.register(vs, e, open_hosts, _export)      # export --format/--layout, and import
    for name, helptext in (("plan", "ordered steps and a diff; changes nothing"),
                           ("apply", "take the host(s) to the config; rolls back on failure"),
                           ("assert", "exit 1 and print the differences when a host is not in the config")):
        v = vs.add_parser(name, help=helptext)
        v.add_argument("file", help="layout file (YAML, version: v1; or a mig-parted / vGPU Device Manager file)")
        layout_interop.add_from(v)
        v.add_argument("-c", "--config", default=None, help="config name (needed when the file has several)")
        _hosts(v)
        if name == "apply":
            v.add_argument("--drain", choices=("refuse", "shutdown"), default="refuse",
                           help="VMs that use a device the layout removes: refuse (default) or shut them down, "
                                "apply, start again those that still fit")
            v.add_argument("--timeout", type=float, default=120.0, help="graceful shutdown timeout, seconds")
            v.add_argument("--force", action="store_true", help="destroy VMs still running after --timeout")
            v.add_argument("--dry-run", action="store_true", help="print the plan (as `layout plan`); change nothing")
        v.add_argument("--connect", action="append", default=None, metavar="URI",
                       help="libvirt URI (one, or one per --host) whose domains are checked: the VMs a step would "
                            "take devices from, and the vGPUs defined VMs name (made again with their UUIDs); "
                            "default: test:///default for sim:, qemu:///system for local, qemu+ssh://.../system "
                            "for ssh; 'none': no libvirt (nothing is checked)")
        v.set_defaults(func={"plan": _plan, "apply": _apply, "assert": _assert}[name])
    b = vs.add_parser("install-boot", help="install the layout and a systemd unit that applies it at boot")
    b.add_argument("file")
    layout_interop.add_from(b)
    b.add_argument("-c", "--config", default=None)
    b.add_argument("--prefix", default="/", metavar="DIR",
                   help="write the files below DIR instead of / (an image or chroot; required for sim: hosts, "
                        "whose files go below DIR on this machine); default /")
    _hosts(b)
    b.set_defaults(func=_install_boot)


def _hosts(p: argparse.ArgumentParser) -> None:
    """Hosts come from the global ``--host`` (repeatable, before or after the verb; worked in parallel)."""


def load(path: str, config: str | None, fmt: str | None = None) -> tuple[Layout, LayoutConfig]:
    text = files.read_text(path, "layout file")
    layout = interop.read_any(text, path, fmt)      # mig-parted and vGPU Device Manager files work as they are
    return layout, layout.config(config)


@contextlib.contextmanager
def open_hosts(args: argparse.Namespace) -> Iterator[list[BaseHost]]:
    hosts: list[BaseHost] = []
    try:
        for spec in host_specs(args):          # duplicates refused by name there
            hosts.append(open_one(spec, args))
        yield hosts
    finally:
        for h in hosts:
            h.close()


def _export(ctx: Context, args: argparse.Namespace) -> int:
    """The host as it is, as a layout (``--format vgpuvirt``; the other formats: :mod:`.layout_interop`)."""
    with open_hosts(args) as hosts:
        for h in hosts:
            lay = verbs.export(h, args.config or "exported")
            if ctx.json:
                ctx.emit_json({"host": h.name, **lay.to_dict()})
            else:
                if len(hosts) > 1:
                    print(printable(f"# {h.name}"))
                sys.stdout.write(dump_layout(lay))
    return 0


def domains_of(hosts: list[BaseHost], connect: list[str] | None) -> dict[str, list[tuple[str, str]] | None]:
    """Each host's defined domains (name, XML) from ``--connect`` (one URI, or one per host; ``none``: not
    read). Without ``--connect``, a host whose default libvirt does not answer is read without its domains
    (a note on stderr says so); a URI given explicitly must answer."""
    from vgpuvirt.cli.targets import connect_uris
    from vgpuvirt.errors import LibvirtError
    from vgpuvirt.libvirt_conn import LibvirtConnection

    if connect == ["none"]:
        return {h.name: None for h in hosts}
    uris = connect_uris(argparse.Namespace(connect=connect), len(hosts))
    out: dict[str, list[tuple[str, str]] | None] = {}
    for h, uri in zip(hosts, uris, strict=True):
        try:
            with LibvirtConnection(uri or default_uri(h), readonly=True) as conn:
                out[h.name] = list(conn.domain_xml_pairs())
        except (LibvirtError, ImportError) as exc:
            if uri is not None:
                raise
            print(printable(f"vgpuvirt: note: {h.name}: libvirt not read ({str(exc).splitlines()[0]}); the VMs' "
                            "devices are not checked (pass --connect URI, or --connect none)"), file=sys.stderr)
            out[h.name] = None
    return out


def _plan(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.layout.drain import affected

    _, cfg = load(args.file, args.config, args.fmt)
    with open_hosts(args) as hosts:
        doms = domains_of(hosts, args.connect)
        plans = [verbs.plan(h, cfg, doms[h.name]) for h in hosts]
    # the VMs whose devices a step takes: apply refuses them unless --drain shutdown
    hits = {p.host: affected(p, doms[p.host] or []) for p in plans}
    if ctx.json:
        ctx.emit_json([{**p.to_dict(), "takes_from_vms": {vm: sorted(d) for vm, d in sorted(hits[p.host].items())}}
                       for p in plans])
        return 0
    for p in plans:
        print(printable(f"{p.host}: layout {cfg.name}: " + ("nothing to do" if p.empty else
                                                            f"{len(p.steps)} step(s), {len(p.diffs)} GPU(s) change")))
        for d in p.diffs:
            print(printable(f"  ~ {d.format()}"))
        for s in p.phase(1) + p.phase(2):
            print(printable(f"  + {s.text}"))
        for vm, devs in sorted(hits[p.host].items()):
            print(printable(f"  ! takes {', '.join(sorted(devs))} from VM {vm}: apply refuses unless --drain "
                            "shutdown"))
        for x in p.pending:
            print(printable(f"  + then, once the VFs exist: {x}"))
        for n in p.notes:
            print(printable(f"  note: {n}"))
    return 0


def _assert(ctx: Context, args: argparse.Namespace) -> int:
    _, cfg = load(args.file, args.config, args.fmt)
    with open_hosts(args) as hosts:
        doms = domains_of(hosts, args.connect)
        both = {h.name: verbs.check_notes(h, cfg, doms[h.name]) for h in hosts}
    found = {k: v[0] for k, v in both.items()}
    if ctx.json:
        ctx.emit_json([{"host": k, "ok": not v, "differences": v, "notes": both[k][1]} for k, v in found.items()])
    else:
        for host, diffs in found.items():
            print(printable(f"{host}: layout {cfg.name}: " + ("ok" if not diffs else "DIFFERS")))
            for d in diffs:
                print(printable(f"  {d}"))
            for n in both[host][1]:
                print(printable(f"  note: {n}"))
    return 1 if any(found.values()) else 0


def _apply(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.layout.drain import apply_with_drain

    if args.dry_run:
        return _plan(ctx, args)

    _, cfg = load(args.file, args.config, args.fmt)
    with open_hosts(args) as hosts:
        try:
            uris = args.connect or [default_uri(h) for h in hosts]
            conns = None
            if uris == ["none"]:
                conns = {h.name: None for h in hosts}
            report = apply_with_drain(hosts, cfg, connect=uris, conns=conns, drain=args.drain, timeout=args.timeout,
                                      force=args.force)
        except ProvisioningError as exc:
            print(printable(f"vgpuvirt: error: {exc}"), file=sys.stderr)
            return 1
    if ctx.json:
        ctx.emit_json(report.to_dict())
    else:
        for line in report.lines():
            print(printable(line))
    return 0 if report.ok else 1


def _install_boot(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.layout.boot import install_boot

    layout, cfg = load(args.file, args.config, args.fmt)
    with open_hosts(args) as hosts:
        for h in hosts:
            target = None
            if h.name.startswith("sim:"):
                # a simulated host has no /etc of its own: its files go below --prefix on this machine
                if args.prefix == "/":
                    raise InvalidSpec("--prefix", args.prefix,
                                      f"a directory for {h.name}'s files (a sim host has no /etc)")
                target = LocalHost()
            done = install_boot(h, layout, cfg, prefix=args.prefix, target=target)
            if ctx.json:
                ctx.emit_json(done)
            else:
                for path in done["installed"]:
                    print(printable(f"{h.name}: installed {path}"))
    return 0
