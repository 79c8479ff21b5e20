"""The ``vgpuvirt`` command: global options, dispatch, and the one-line-error contract.

Each subcommand lives in ``vgpuvirt/cli/<name>.py`` and exposes ``register(subparsers)``, which adds
its parser and sets ``func(ctx, args) -> int``. The CLI only parses, calls the API and prints.
"""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import sys
from collections.abc import Sequence

from vgpuvirt.cli.api_words import cli_words
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.options import CliParser, merge_globals
from vgpuvirt.errors import VgpuvirtError

# Subcommand modules, in help order. A module that does not exist yet is simply not offered.
SUBCOMMANDS = ("inventory", "types", "mdev", "sriov", "iommu", "xml", "plan", "provision", "teardown", "gc", "audit",
               "layout", "sim", "mig", "vm", "attach", "detach", "metrics", "exporter", "top", "scheduler")


def build_parser() -> argparse.ArgumentParser:
    # Global options: vgpuvirt/cli/options.py (every parser and sub-parser carries them).
    p = CliParser(prog="vgpuvirt", description="GPU-backed VMs on KVM/libvirt hosts")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"vgpuvirt.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"vgpuvirt.cli.{name}":
                continue
            raise
        mod.register(sub)
    return p


class _PlainFormatter(logging.Formatter):
    """Log messages carry host text too (agent stderr, kernel messages): written inert, like every line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(cli_words(super().formatMessage(record)))


def error_object(exc: VgpuvirtError) -> dict[str, object]:
    """What ``--json`` prints on stdout for a refusal: the error's own fields (``NoCapacity``: fit of wanted)."""
    to_dict = getattr(exc, "to_dict", None)
    if callable(to_dict):
        return {"ok": False, **to_dict(), "message": cli_words(str(exc))}
    return {"ok": False, "error": type(exc).__name__, "host": getattr(exc, "host", None),
            "message": cli_words(str(exc))}


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # argv and host text may hold undecodable bytes (surrogate-escaped): print them escaped, never crash
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        merge_globals(args)
    except VgpuvirtError as exc:
        parser.error(str(exc))
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PlainFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    ctx = Context(args)
    try:
        rc: int = args.func(ctx, args)
        return rc
    except VgpuvirtError as exc:
        print(printable(f"vgpuvirt: error: {cli_words(str(exc))}"), file=sys.stderr)
        if ctx.json:
            ctx.emit_json(error_object(exc))      # scripts get what fits, where and why on stdout too
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        print("vgpuvirt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`vgpuvirt ... | head`): stop quietly, as cat does, and keep Python's
        # exit-time flush of stdout from raising again.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        ctx.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
