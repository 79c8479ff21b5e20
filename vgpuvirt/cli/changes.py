"""Shared by the lifecycle subcommands (mdev, sriov, iommu, gc): common options and printing a Change."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from vgpuvirt import files
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.targets import add_connect, local_domains
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import BaseHost
from vgpuvirt.services.mutation import Change


def add_common(p: argparse.ArgumentParser, *, dry_run: bool = True, domains: bool = False) -> None:
    if dry_run:
        p.add_argument("--dry-run", action="store_true", help="print the planned writes, change nothing")
    if domains:
        add_connect(p, help_text="read domain XML from this libvirt URI: devices that domains use are respected "
                                 "(default on the local host: qemu:///system when it answers)")
        p.add_argument("--domain-xml", action="append", default=[], metavar="FILE",
                       help="a domain XML file to respect (repeatable)")


def domains(args: argparse.Namespace, host: BaseHost | None = None) -> list[tuple[str, str]] | None:
    """(name, xml) pairs from --domain-xml files and/or --connect; None when neither was given. With ``host``
    (a verb that removes devices: sriov disable, mdev remove, gc) and neither given, the local host's own
    libvirt is read (:func:`~vgpuvirt.cli.targets.local_domains`), so that a VM's device is never removed
    just because no --connect was typed."""
    out: list[tuple[str, str]] = []
    for f in getattr(args, "domain_xml", []) or []:
        out.append((Path(f).stem, files.read_text(f, "--domain-xml")))
    uris = getattr(args, "connect", None) or []
    if len(uris) > 1:
        raise InvalidSpec("--connect", uris, "one URI (this command works on one host)")
    uri = uris[0] if uris else None
    if uri:
        from vgpuvirt.libvirt_conn import LibvirtConnection
        conn = LibvirtConnection(uri, readonly=True)
        try:
            out.extend(conn.domain_xml_pairs())
        finally:
            conn.close()
    if uri or getattr(args, "domain_xml", None):
        return out
    return local_domains(host) if host is not None else None


def _lines(ch: Change) -> Iterator[str]:
    state = "would change" if ch.dry_run and ch.changed else "changed" if ch.changed else "unchanged"
    yield f"{state}: {ch.action} {ch.target}: {ch.message}"
    for op in ch.ops if ch.dry_run else ():
        yield f"  {op.describe()}"


def emit(ctx: Context, ch: Change) -> None:
    if ctx.json:
        ctx.emit_json(ch.to_dict())
        return
    for line in _lines(ch):
        print(printable(line))
