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
from typing import Any, NoReturn

from vgpuvirt import __version__
from vgpuvirt.cli.api_words import cli_words
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.cli.options import CliParser, merge_globals
from vgpuvirt.errors import VgpuvirtError

# The verbs, in help order: one line each (name, module, one-line help). `vgpuvirt --help` is printed from this
# table alone, and a run imports only the chosen verb's module: importing all of them to build one parser cost
# 0.4-0.7 s per call (provisioning, layouts, the simulator, libvirt, the XML builders, the exporter).
# The help text must be the one the module's register() gives its parser (tests/unit/test_cli_start.py holds it).
# A module that does not exist yet is simply not offered.
SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("inventory", "vgpuvirt.cli.inventory", "GPUs, vGPU types and capacity, SR-IOV, IOMMU groups, mdevs"),
    ("types", "vgpuvirt.cli.types", "vGPU / mdev types with free and maximum instances"),
    ("mdev", "vgpuvirt.cli.mdev", "create, remove, list mediated devices (mdev vGPUs)"),
    ("sriov", "vgpuvirt.cli.sriov", "enable/disable SR-IOV VFs, show VF <-> PF"),
    ("iommu", "vgpuvirt.cli.iommu", "IOMMU pre-flight and vfio-pci binding"),
    ("xml", "vgpuvirt.cli.xml", "build, lint and inspect libvirt domain XML"),
    ("plan", "vgpuvirt.cli.plan", "show what provision would do (dry run)"),
    ("provision", "vgpuvirt.cli.provision", "create vGPUs and VMs on one or several hosts"),
    ("teardown", "vgpuvirt.cli.teardown", "remove VMs vgpuvirt made, and their vGPUs"),
    ("gc", "vgpuvirt.cli.gc", "list (or --apply: remove) orphan mdevs / VF vGPU types"),
    ("audit", "vgpuvirt.cli.audit", "the audit trail: what was changed on a host, by whom, with what outcome"),
    ("layout", "vgpuvirt.cli.layout", "declare, plan, apply and assert how each GPU of a host is partitioned"),
    ("sim", "vgpuvirt.cli.sim", "simulated GPU hosts (profiles, static trees, live FUSE mounts)"),
    ("mig", "vgpuvirt.cli.mig", "MIG mode, GPU instances and compute instances (nvidia-smi mig)"),
    ("vm", "vgpuvirt.cli.vm", "list VMs with their GPUs; start, shutdown, reboot, destroy, suspend, resume"),
    ("attach", "vgpuvirt.cli.attach", "add a vGPU or GPU to an existing VM"),
    ("detach", "vgpuvirt.cli.detach", "remove a vGPU or GPU from a VM (and the vGPU itself)"),
    ("migrate", "vgpuvirt.cli.migrate", "move a VM and its vGPUs to another host (live or --offline)"),
    ("host", "vgpuvirt.cli.host", "host maintenance: cordon, uncordon, drain, status"),
    ("metrics", "vgpuvirt.cli.metrics",
     "one metrics snapshot: GPU and per-vGPU/VM use, health (one round trip/host)"),
    ("exporter", "vgpuvirt.cli.exporter", "serve Prometheus metrics of one or several hosts"),
    ("top", "vgpuvirt.cli.top", "live view of GPUs, vGPUs and their VMs (q quits)"),
    ("scheduler", "vgpuvirt.cli.scheduler", "show or set the vGPU scheduler policy of NVIDIA GPUs"),
    ("capture", "vgpuvirt.cli.capture", "record a host read-only into FILE; replay it with --host capture:FILE"),
    ("completion", "vgpuvirt.cli.completion", "print a shell completion script (bash or zsh)"),
)


def _register(sub: Any, module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return
        raise
    mod.register(sub)


def _stub(sub: Any, name: str, helptext: str) -> None:
    """A verb's line in `--help`, taking whatever follows it: a stand-in for a verb that is not run."""
    sub.add_parser(name, help=helptext, add_help=False).add_argument(
        "_rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, just that verb's real parser and a help-only stand-in for the others
    (it accepts anything and is never run: :func:`main` picks the verb first)."""
    # Global options: vgpuvirt/cli/options.py (every parser and sub-parser carries them).
    p = CliParser(prog="vgpuvirt", description="GPU-backed VMs on KVM/libvirt hosts")
    p.add_argument("--version", action="version", version=f"vgpuvirt {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module, helptext in SUBCOMMANDS:
        if only is None or name == only:
            _register(sub, module)
        else:
            _stub(sub, name, helptext)
    return p


class _ProbeFailed(Exception):
    pass


class _Probe(CliParser):
    def error(self, message: str) -> NoReturn:
        raise _ProbeFailed(message)


def chosen_verb(argv: Sequence[str]) -> str | None:
    """The verb ``argv`` names, found by a parser made of the table alone (no verb module imported); None
    when that parser cannot tell. ``vgpuvirt --help`` is printed (and the process ends) here."""
    probe = _Probe(prog="vgpuvirt", description="GPU-backed VMs on KVM/libvirt hosts")
    sub = probe.add_subparsers(dest="command", metavar="COMMAND",
                               parser_class=type("_Probe1", (_Probe,), {"level": 1}))
    sub.required = True
    for name, _module, helptext in SUBCOMMANDS:
        _stub(sub, name, helptext)
    try:
        ns, _extra = probe.parse_known_args(list(argv))
    except _ProbeFailed:
        return None
    verb = getattr(ns, "command", None)
    return verb if isinstance(verb, str) else None


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
    argv = sys.argv[1:] if argv is None else list(argv)
    # Anything the probe cannot place (no verb, a bad one) goes to the whole parser, for its exact message.
    verb = chosen_verb(argv)
    parser = build_parser(only=verb if verb is not None else None)
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
