"""Shared by the lifecycle subcommands (mdev, sriov, iommu, gc, mig, scheduler): common options, printing a Change,
and printing a change the runner made (its Report, or its failure and rollback)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vgpuvirt import files
from vgpuvirt.change.runner import Report
from vgpuvirt.change.step import HostStep, Step
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.targets import add_connect, local_domains
from vgpuvirt.errors import InvalidSpec, ProvisioningError
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


def emit_report(ctx: Context, report: Report, extra: dict[str, Any] | None = None) -> None:
    """A change the runner made, in the one report format (``extra``: verb-specific JSON fields)."""
    if ctx.json:
        ctx.emit_json({"ok": True, **report.to_dict(), **(extra or {})})
        return
    if not report.done and not report.pending_reload and not report.kept:
        print("nothing to do")
    for line in report.lines():
        print(printable(line))


def emit_failure(ctx: Context, exc: ProvisioningError) -> int:
    """A change that failed and was rolled back: what failed, what had run, what the rollback did (exit 1)."""
    cause = str(exc.cause or exc.reason)
    if ctx.json:
        ctx.emit_json({"ok": False, "error": cause, "completed": exc.completed, "rollback": exc.rollback})
        return 1
    print(printable(f"failed: {cause}"))
    for line in exc.completed:
        print(printable(f"completed: {line}"))
    for line in exc.rollback:
        print(printable(f"rolled back: {line}"))
    return 1


def dry_run_steps(ctx: Context, steps: Sequence[Step]) -> None:
    """What a change would do: each step's line and the argv/writes it would send."""
    if ctx.json:
        ctx.emit_json({"dry_run": True, "steps": [s.to_dict() for s in steps]})
        return
    for s in steps:
        print(printable(f"would: {s.describe()}"))
        if isinstance(s, HostStep):
            for op in s.item(10.0).ops:
                print(printable(f"  {op.describe()}"))
