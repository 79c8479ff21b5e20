"""``vgpuvirt capture [--redact] -o FILE``: record what vgpuvirt reads from a host (one read-only round trip), to
replay it anywhere with ``--host capture:FILE`` (docs/capture.md)."""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import InvalidSpec


def register(sub: Any) -> None:
    p = sub.add_parser("capture", help="record a host read-only into FILE; replay it with --host capture:FILE")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write the capture (JSON; gzip when FILE ends in .gz)")
    p.add_argument("--redact", action="store_true",
                   help="replace serials, UUIDs and host names consistently, keep only the kernel command line's "
                        "IOMMU/hugepage/VFIO options and the kernel log's NVIDIA lines")
    p.add_argument("--program", action="append", default=[], metavar="NAME=PATH",
                   help="run PATH for program NAME (nvidia-smi, dmesg) on the host; recorded under NAME")
    p.set_defaults(func=run)


def _programs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise InvalidSpec("--program", item, "NAME=PATH, e.g. nvidia-smi=/usr/lib/nvidia/bin/nvidia-smi")
        out[name] = path
    return out


def run(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.capture.record import capture
    from vgpuvirt.capture.redact import redact
    from vgpuvirt.host.replay import save_capture

    programs = _programs(args.program)
    host = ctx.host()
    data = capture(host, programs=programs)
    if args.redact:
        data = redact(data).capture
    try:
        save_capture(data, args.output)
    except OSError as exc:
        raise InvalidSpec("-o", args.output, f"a file that can be written ({exc.strerror})") from None
    summary = {"host": data["host"], "file": args.output, "paths": len(data["entries"]),
               "programs": len(data["programs"]), "redacted": bool(data["redacted"]),
               "driver_version": data["driver_version"], "vgpuvirt_version": data["vgpuvirt_version"]}
    if ctx.json:
        ctx.emit_json(summary)
    else:
        print(printable(f"{data['host']}: {summary['paths']} paths and {summary['programs']} program answers "
                        f"written to {args.output}" + (" (redacted)" if args.redact else "")))
    return 0
