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

from vgpuvirt.cli.context import Context, printable
from vgpuvirt.errors import VgpuvirtError

# Subcommand modules, in help order. A module that does not exist yet is simply not offered.
SUBCOMMANDS = ("inventory", "types", "mdev", "sriov", "iommu", "xml", "plan", "provision", "teardown", "gc", "audit",
               "layout", "sim", "mig")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vgpuvirt", description="GPU-backed VMs on KVM/libvirt hosts")
    p.add_argument("--host", default="local", help="local (default), ssh://[user@]host[:port] or sim:PROFILE")
    p.add_argument("--sysfs-root", default=None, help="read/write sysfs below this directory (local and ssh hosts)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout, nothing else")
    p.add_argument("--identity", default=None, help="SSH private key file")
    p.add_argument("--known-hosts", default=None, help="known_hosts file (default: ~/.ssh/known_hosts)")
    p.add_argument("--sudo", action="store_true", help="run remote commands through sudo -n")
    p.add_argument("--insecure-accept-unknown-host-key", action="store_true", dest="allow_unknown_hosts",
                   help="accept an unknown SSH host key for this run instead of refusing "
                        "(warns with its fingerprint; never saved)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr (-vv: debug)")
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
        return printable(super().formatMessage(record))


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # argv and host text may hold undecodable bytes (surrogate-escaped): print them escaped, never crash
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PlainFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    ctx = Context(args)
    try:
        rc: int = args.func(ctx, args)
        return rc
    except VgpuvirtError as exc:
        print(printable(f"vgpuvirt: error: {exc}"), file=sys.stderr)
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
