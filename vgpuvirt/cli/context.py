"""What every subcommand gets: the parsed global options, a lazily opened Host, output helpers.

Text from a host (type names, descriptions, driver names, product strings, kernel and agent messages) is
data, not terminal input: everything the CLI prints goes through :func:`printable` (print/stderr) or
:func:`plain` (rich), so a host file cannot inject rich markup (``[/x]`` crashed ``types``), colours, cursor
moves, OSC-8 hyperlinks or bidi overrides into the user's terminal.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the host package loads when a verb opens a host, not for every parse
    from vgpuvirt.host.base import BaseHost

# C0, DEL, C1 (ESC, CSI, OSC, ST...), and the line/paragraph separators and bidi embeddings, overrides and
# isolates that reorder what the reader sees ("Trojan Source").
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape_char(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(value: object) -> str:
    """``str(value)`` with every control character written as an escape (``\\x1b``, ``\\u202e``): one line,
    inert on any terminal. For plain ``print`` and stderr lines."""
    return _UNSAFE.sub(_escape_char, str(value))


def plain(value: object) -> str:
    """:func:`printable` with rich markup escaped too: for host text inside a rich ``print`` or table cell."""
    from rich.markup import escape
    return escape(printable(value))


# Width of the console when the output is not a terminal: a pipe or a file gets whole lines (rich would
# otherwise assume 80 columns and cut cells: `GRID T4-…`).
PIPE_WIDTH = 100_000


def console_for(stream: Any) -> Any:
    """A rich Console on ``stream`` whose tables never truncate: on a terminal every cell wraps (fold) instead
    of ending in an ellipsis; elsewhere the width is unlimited, so each row stays one whole line."""
    from rich.console import Console
    from rich.table import Table

    def whole(obj: Any) -> None:
        if isinstance(obj, Table):
            for col in obj.columns:
                col.no_wrap = False
                col.overflow = "fold"
        for inner in getattr(obj, "renderables", ()):     # a Group of tables (vgpuvirt top's frame)
            whole(inner)

    class _WholeCells(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            for obj in objects:
                whole(obj)
            super().print(*objects, **kwargs)

    tty = bool(getattr(stream, "isatty", lambda: False)())
    return _WholeCells(file=stream, highlight=False, width=None if tty else PIPE_WIDTH)


class Context:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json: bool = bool(args.json)
        self._host: BaseHost | None = None

    def host(self) -> BaseHost:
        if self._host is None:
            from vgpuvirt.cli.targets import one_host_spec, open_one
            self._host = open_one(one_host_spec(self.args), self.args)
        return self._host

    def emit_json(self, obj: Any) -> None:
        json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")

    def console(self) -> Any:
        # Human output goes to stdout; with --json nothing but JSON goes there.
        return console_for(sys.stderr if self.json else sys.stdout)

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None
