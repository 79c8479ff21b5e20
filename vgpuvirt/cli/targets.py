"""Hosts and libvirt URIs from the command line: the global ``--host`` (repeatable) and a verb's ``--connect``
(once for every host, or once per host in ``--host`` order).

Every host given is used or the command is refused: a one-host verb given two ``--host`` says so, two
``--host`` values that open the same host (``ssh://gpu1`` and ``ssh://gpu1:22``, or ``sim:t4x2`` twice) are
refused by name, and simulated hosts of one profile are told apart as ``sim:t4x2@a``, ``sim:t4x2@b``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from vgpuvirt.errors import InvalidSpec, LibvirtError
from vgpuvirt.host.base import BaseHost
from vgpuvirt.hosts import open_host
from vgpuvirt.libvirt_uri import accepted_key_uri, default_uri

if TYPE_CHECKING:  # loaded where a verb connects: with the XML builders it costs ~45 ms that `inventory` never uses
    from vgpuvirt.libvirt_conn import LibvirtConnection

LOCAL_URI = "qemu:///system"


def add_connect(p: argparse.ArgumentParser, *, help_text: str | None = None) -> None:
    """``--connect URI`` (alias ``--libvirt-uri``): once for every host, or once per ``--host`` in order."""
    p.add_argument("--connect", "--libvirt-uri", dest="connect", action="append", default=None, metavar="URI",
                   help=help_text or "libvirt URI: one for every host, or one per --host in order (default: "
                                     "test:///default for sim:, qemu:///system for local, qemu+ssh://... with "
                                     "the host's own user, port, --identity and --known-hosts for ssh://)")


def host_specs(args: argparse.Namespace) -> list[str]:
    specs: list[str] = list(getattr(args, "hosts", None) or []) or ["local"]
    seen: set[str] = set()
    for s in specs:
        if s in seen:
            raise InvalidSpec("--host", s, "each host once (name simulated hosts apart: sim:PROFILE@NAME)")
        seen.add(s)
    return specs


def one_host_spec(args: argparse.Namespace) -> str:
    specs = host_specs(args)
    if len(specs) > 1:
        verb = getattr(args, "command", None) or "this command"
        raise InvalidSpec("--host", specs, f"one host for `{verb}` (provision, plan and teardown take several)")
    return specs[0]


def connect_uris(args: argparse.Namespace, n_hosts: int) -> list[str | None]:
    """One URI (or None: the host's default) per host, from ``--connect`` given 0, 1 or ``n_hosts`` times."""
    uris: list[str] = list(getattr(args, "connect", None) or [])
    for uri in uris:
        if not uri.strip():
            raise InvalidSpec("--connect", uri, "a libvirt URI such as qemu:///system or test:///default")
    if len(uris) == n_hosts:
        return list(uris)
    if len(uris) == 1:
        return [uris[0]] * n_hosts
    if not uris:
        return [None] * n_hosts
    raise InvalidSpec("--connect", uris, f"one URI for every host, or one per --host ({n_hosts} in order)")


def open_one(spec: str, args: argparse.Namespace) -> BaseHost:
    root = args.sysfs_root
    if root and spec == "local":
        root = os.path.abspath(root)       # a directory on this machine: relative to where the user stands
    return open_host(spec, sysfs_root=root, identity=args.identity, known_hosts=args.known_hosts,
                     sudo=args.sudo, allow_unknown_hosts=args.allow_unknown_hosts)


@contextlib.contextmanager
def open_targets(args: argparse.Namespace) -> Iterator[tuple[dict[str, BaseHost], dict[str, LibvirtConnection]]]:
    """Open every ``--host`` and its libvirt connection; close them all afterwards."""
    from vgpuvirt.libvirt_conn import LibvirtConnection

    specs = host_specs(args)
    uris = connect_uris(args, len(specs))
    hosts: dict[str, BaseHost] = {}
    conns: dict[str, LibvirtConnection] = {}
    given: dict[str, str] = {}
    scratch: list[str] = []       # a directory for this run's known_hosts files (--insecure-accept-unknown-host-key)
    try:
        for spec, uri in zip(specs, uris, strict=True):
            h = open_one(spec, args)
            if h.name in hosts:
                h.close()
                raise InvalidSpec("--host", spec, f"a host not given already: it is the same host as "
                                                  f"{given[h.name]!r} ({h.name}); name simulated hosts apart "
                                                  "with sim:PROFILE@NAME")
            hosts[h.name] = h
            given[h.name] = spec
            if uri is None and getattr(h, "allow_unknown_hosts", False):    # an SSHHost opened with the flag
                scratch = scratch or [tempfile.mkdtemp(prefix="vgpuvirt-")]
                uri = accepted_key_uri(h, tempfile.mkdtemp(dir=scratch[0]))
            conns[h.name] = LibvirtConnection(uri or default_uri(h))
        yield hosts, conns
    finally:
        for d in scratch:
            shutil.rmtree(d, ignore_errors=True)
        for c in conns.values():
            c.close()
        for h in hosts.values():
            h.close()


def local_domains(host: BaseHost) -> list[tuple[str, str]] | None:
    """The domains of this machine's libvirt (``qemu:///system``), for a verb on the local host that must
    respect the devices VMs use; None, with a note on stderr, when that libvirt does not answer."""
    from vgpuvirt.libvirt_conn import LibvirtConnection

    if not host.is_local:
        return None
    try:
        with LibvirtConnection(LOCAL_URI, readonly=True) as conn:
            return list(conn.domain_xml_pairs())
    except (LibvirtError, ImportError) as exc:
        print(f"vgpuvirt: note: local libvirt {LOCAL_URI} not reachable ({_first_line(exc)}); the devices of "
              "libvirt domains are not checked (pass --connect URI or --domain-xml FILE)", file=sys.stderr)
        return None


def _first_line(exc: Any) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
