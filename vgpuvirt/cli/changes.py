"""Shared by the lifecycle subcommands (mdev, sriov, iommu, gc): common options and printing a Change."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.services.mutation import Change


def add_common(p: argparse.ArgumentParser, *, dry_run: bool = True, domains: bool = False) -> None:
    # SUPPRESS keeps the global `vgpuvirt --json ...` working when the sub-level flag is not given.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON on stdout")
    if dry_run:
        p.add_argument("--dry-run", action="store_true", help="print the planned writes, change nothing")
    if domains:
        # --connect as in inventory/plan/provision; --libvirt-uri kept as an alias.
        p.add_argument("--connect", "--libvirt-uri", dest="libvirt_uri", metavar="URI", default=None,
                       help="read domain XML from this libvirt URI (devices used by domains are respected)")
        p.add_argument("--domain-xml", action="append", default=[], metavar="FILE",
                       help="a domain XML file to respect (repeatable)")


def domains(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    """(name, xml) pairs from --domain-xml files and/or --libvirt-uri; None when neither was given."""
    out: list[tuple[str, str]] = []
    for f in getattr(args, "domain_xml", []) or []:
        try:
            out.append((Path(f).stem, Path(f).read_text()))
        except OSError as exc:
            raise InvalidSpec("--domain-xml", f, f"a readable file ({exc.strerror})") from exc
        except UnicodeDecodeError as exc:
            raise InvalidSpec("--domain-xml", f, f"a UTF-8 domain XML file ({exc.reason} at byte {exc.start})") from exc
    uri = getattr(args, "libvirt_uri", None)
    if uri:
        from vgpuvirt.libvirt_conn import LibvirtConnection
        conn = LibvirtConnection(uri, readonly=True)
        try:
            out.extend(conn.domain_xml_pairs())
        finally:
            conn.close()
    return out if (uri or getattr(args, "domain_xml", None)) else None


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
