"""``vgpuvirt layout import`` and ``layout export --format``: NVIDIA's mig-parted and vGPU Device Manager
files, and KubeVirt's configuration (docs/layouts.md, "Interop").

    vgpuvirt layout import mig-parted.yaml --from mig-parted > layout.yaml
    vgpuvirt --host sim:t4x2 layout export --format vgpu-device-manager
    vgpuvirt --host sim:t4x2 layout export --format kubevirt --layout lab.yaml -c day

Registered by :mod:`vgpuvirt.cli.layout` (which hands in its host opener: no import back).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from vgpuvirt import files
from vgpuvirt.cli.context import Context, printable
from vgpuvirt.host.base import BaseHost
from vgpuvirt.layout import interop, interop_host, verbs
from vgpuvirt.layout.model import Layout
from vgpuvirt.layout.schema import dump_layout

OpenHosts = Callable[[argparse.Namespace], contextlib.AbstractContextManager[list[BaseHost]]]
EXPORT_FORMATS = ("vgpuvirt", interop_host.KUBEVIRT, *interop.FORMATS)


def add_from(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="fmt", default=None, choices=("vgpuvirt", *interop.FORMATS),
                   help="FILE's format (default: told from its top key: configs, mig-configs or vgpu-configs)")


def register(vs: argparse._SubParsersAction, export: argparse.ArgumentParser,  # type: ignore[type-arg]
             open_hosts: OpenHosts, plain_export: Callable[[Context, argparse.Namespace], int]) -> None:
    i = vs.add_parser("import", help="read a mig-parted or vGPU Device Manager file as a layout (YAML on stdout)")
    i.add_argument("file", help="the file (its version: v1 schema)")
    i.add_argument("--from", dest="fmt", default=None, choices=interop.FORMATS,
                   help="the file's format (default: told from mig-configs / vgpu-configs)")
    i.add_argument("-c", "--config", default=None, help="only this config (default: all)")
    i.add_argument("-o", "--output", default=None, help="write the layout here instead of stdout")
    i.set_defaults(func=_import)
    export.add_argument("--format", default="vgpuvirt", choices=EXPORT_FORMATS,
                        help="vgpuvirt (default), kubevirt (spec.configuration: permittedHostDevices and "
                             "mediatedDevicesConfiguration), mig-parted, vgpu-device-manager")
    export.add_argument("--layout", default=None, metavar="FILE",
                        help="export this layout file's config (-c) instead of the host as it is; for mig-parted and "
                             "vgpu-device-manager no host is read unless a selector needs one")

    def run(ctx: Context, args: argparse.Namespace) -> int:
        if args.format == "vgpuvirt" and args.layout is None:
            return plain_export(ctx, args)
        return _export(ctx, args, open_hosts)

    export.set_defaults(func=run)


def _read(path: str, what: str) -> str:
    return files.read_text(path, what)


def _import(ctx: Context, args: argparse.Namespace) -> int:
    layout = interop.import_config(_read(args.file, f"{args.fmt or 'config'} file"), args.file, args.fmt, args.config)
    text = dump_layout(layout)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(printable(f"wrote {args.output}: {len(layout.configs)} config(s): {', '.join(layout.names)}"))
    elif ctx.json:
        ctx.emit_json(layout.to_dict())
    else:
        sys.stdout.write(text)
    return 0


def _configs(args: argparse.Namespace) -> Layout | None:
    if args.layout is None:
        return None
    layout = interop.read_any(_read(args.layout, "layout file"), args.layout)     # NVIDIA's files too
    return Layout((layout.config(args.config),), layout.source) if args.config else layout


def _host_free(layout: Layout) -> bool:
    return all(s.kind in ("all", "index", "pci-id") for c in layout.configs for e in c.entries for s in e.devices)


@contextlib.contextmanager
def _no_hosts() -> Iterator[list[BaseHost]]:
    yield []


def _export(ctx: Context, args: argparse.Namespace, open_hosts: OpenHosts) -> int:
    layout = _configs(args)
    fmt = args.format
    if fmt in interop.FORMATS and layout is not None and _host_free(layout):
        sys.stdout.write(interop.export_config(layout, fmt))
        return 0
    opener = open_hosts(args) if fmt == interop_host.KUBEVIRT or layout is None or not _host_free(layout) \
        else _no_hosts()
    with opener as hosts:
        read = {h.name: verbs.read_gpus(h)[1] for h in hosts}
    name = args.config or "current"
    if layout is None and fmt != interop_host.KUBEVIRT:
        # the host as that tool's own export prints it
        for h, gpus in read.items():
            if len(read) > 1:
                print(printable(f"# {h}"))
            sys.stdout.write(interop.dump(interop_host.host_export(gpus, fmt, name)))
        return 0
    configs = {h: layout.config(args.config) if layout is not None else interop_host.as_is(gpus, name)
               for h, gpus in read.items()}
    if fmt == interop_host.KUBEVIRT:
        out: dict[str, Any] = interop_host.to_kubevirt({_node(h): read[h] for h in read}) if layout is None else \
            interop_host.kubevirt_configuration({_node(h): interop_host.governed(configs[h], read[h]) for h in read})
        text = yaml.safe_dump({"spec": {"configuration": out}}, sort_keys=False, width=120)
        if ctx.json:
            ctx.emit_json({"spec": {"configuration": out}})
        else:
            sys.stdout.write(text)
        return 0
    for h, gpus in read.items():
        if len(read) > 1:
            print(printable(f"# {h}"))
        cfg = configs[h]
        sys.stdout.write(interop.export_config(Layout((interop_host.by_index(cfg, gpus),)), fmt))
    return 0


def _node(host: str) -> str:
    """A Kubernetes node name for a host: ``ssh://root@gpu1:22`` -> ``gpu1``."""
    return re.sub(r":\d+$", "", re.sub(r"^.*[@/]", "", host)) or host
