"""What every subcommand gets: the parsed global options, a lazily opened Host, output helpers."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vgpuvirt.host.base import BaseHost
from vgpuvirt.hosts import open_host


class Context:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json: bool = bool(args.json)
        self._host: BaseHost | None = None

    def host(self) -> BaseHost:
        if self._host is None:
            a = self.args
            self._host = open_host(a.host, sysfs_root=a.sysfs_root, identity=a.identity,
                                   known_hosts=a.known_hosts, sudo=a.sudo,
                                   allow_unknown_hosts=a.allow_unknown_hosts)
        return self._host

    def emit_json(self, obj: Any) -> None:
        json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")

    def console(self) -> Any:
        from rich.console import Console
        # Human output goes to stdout; with --json nothing but JSON goes there.
        return Console(file=sys.stderr if self.json else sys.stdout, highlight=False)

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None
