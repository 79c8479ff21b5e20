"""The global options, accepted before or after any verb and sub-verb, by one mechanism.

Every parser of the ``vgpuvirt`` command is a :class:`CliParser`; each adds the global options to itself, and
its ``add_subparsers`` makes the verb parsers CliParsers one level deeper. So a verb module gets the global
options with no code of its own (``vgpuvirt sriov --json disable --host X PF -v`` works as well as
``vgpuvirt --json --host X -v sriov disable PF``).

Why one dest per level: argparse parses a verb's arguments into a fresh namespace and copies it over the
parent's, so with one shared dest ``--host A verb --host B`` would keep only B and ``-v verb -v`` would count 1.
Level N stores into ``_g{N}_<name>`` (defaults SUPPRESSed, so an option not given at a level leaves nothing
there), and :func:`merge_globals` folds the levels in command-line order: hosts add up, -v counts add up,
switches are on when given anywhere, a value given at two levels must agree.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from vgpuvirt.errors import InvalidSpec

# name -> (option strings, kind, argparse keywords). kind: "list" (append, concatenated), "count", "flag", "value"
GLOBALS: dict[str, tuple[tuple[str, ...], str, dict[str, Any]]] = {
    "hosts": (("--host",), "list", dict(
        action="append", metavar="HOST",
        help="local (default), ssh://[user@]host[:port], sim:PROFILE, sim:PROFILE@NAME or capture:FILE (a "
             "read-only replay); repeat for several "
             "hosts (provision, plan, teardown work on all of them; other verbs take one)")),
    "sysfs_root": (("--sysfs-root",), "value", dict(
        metavar="DIR", help="read/write sysfs below this directory (local and ssh hosts)")),
    "json": (("--json",), "flag", dict(action="store_true", help="machine-readable output on stdout, nothing else")),
    "identity": (("--identity",), "value", dict(metavar="KEY", help="SSH private key file")),
    "known_hosts": (("--known-hosts",), "value", dict(
        metavar="FILE", help="known_hosts file (default: ~/.ssh/known_hosts); libvirt over SSH checks it too")),
    "sudo": (("--sudo",), "flag", dict(action="store_true", help="run remote commands through sudo -n")),
    "allow_unknown_hosts": (("--insecure-accept-unknown-host-key",), "flag", dict(
        action="store_true", help="accept an unknown SSH host key for this run instead of refusing "
                                  "(warns with its fingerprint; never saved)")),
    "verbose": (("-v", "--verbose"), "count", dict(action="count", help="log to stderr (-vv: debug)")),
}
DEFAULTS: dict[str, Any] = {"hosts": [], "sysfs_root": None, "json": False, "identity": None, "known_hosts": None,
                            "sudo": False, "allow_unknown_hosts": False, "verbose": 0}
_LEVEL_DEST = re.compile(r"^_g(\d+)_(\w+)$")


#: What a verb's --help says instead of listing the global options again (they are listed once, in
#: ``vgpuvirt --help``; every verb still accepts them).
VERB_EPILOG = ("global options, accepted before or after the verb: "
               + ", ".join(f[0] for f, _k, _kw in GLOBALS.values()) + " (see vgpuvirt --help)")


def add_global_options(p: argparse.ArgumentParser, level: int) -> None:
    if level == 0:
        group = p.add_argument_group("global options (before or after the verb)")
    for name, (flags, _kind, kw) in GLOBALS.items():
        if level == 0:
            group.add_argument(*flags, dest=f"_g{level}_{name}", default=argparse.SUPPRESS, **kw)
        else:              # parsed at every level, shown once: a verb's help is about the verb
            p.add_argument(*flags, dest=f"_g{level}_{name}", default=argparse.SUPPRESS,
                           **{**kw, "help": argparse.SUPPRESS})


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser that carries the global options and hands them on to its sub-parsers.

    ``conflict_handler="resolve"``: a verb that still defines one of these flags itself (say its own
    ``--json``) takes it over for that verb instead of breaking the whole command at start-up."""

    level = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        if self.level > 0:
            kwargs["epilog"] = (kwargs["epilog"] + "\n\n" + VERB_EPILOG) if kwargs.get("epilog") else VERB_EPILOG
        super().__init__(*args, **kwargs)
        add_global_options(self, self.level)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", type("CliParser", (CliParser,), {"level": self.level + 1}))
        return super().add_subparsers(**kwargs)


def merge_globals(ns: argparse.Namespace) -> argparse.Namespace:
    """Fold the per-level ``_g{N}_*`` values into ``ns.hosts``, ``ns.json``, ... and drop them; ``ns.host``
    is the first host (``local`` when none was given) for code that works on one host."""
    found: dict[str, list[tuple[int, Any]]] = {}
    for key in list(vars(ns)):
        m = _LEVEL_DEST.match(key)
        if m and m[2] in GLOBALS:
            found.setdefault(m[2], []).append((int(m[1]), getattr(ns, key)))
            delattr(ns, key)
    for name, (flags, kind, _kw) in GLOBALS.items():
        values = [v for _lvl, v in sorted(found.get(name, []), key=lambda t: t[0])]
        own = getattr(ns, name, None)
        if own not in (None, [], False, 0):
            # a verb that defines the flag itself (conflict "resolve") stored under the plain name: keep it too
            values.append(own)
        if kind == "list":
            value: Any = [x for v in values for x in v]
        elif kind == "count":
            value = sum(values)
        elif kind == "flag":
            value = any(values)
        elif len(set(values)) > 1:
            raise InvalidSpec(flags[-1], values, "one value (it was given twice, differently)")
        else:
            value = values[0] if values else DEFAULTS[name]
        setattr(ns, name, value if values else DEFAULTS[name])
    ns.host = ns.hosts[0] if ns.hosts else "local"
    return ns
