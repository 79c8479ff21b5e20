"""The batch agent over SSH: the command that starts it on the host, and the frames a resident one answers in."""

from __future__ import annotations

import base64
import importlib.resources
import importlib.util
import marshal
import re
import struct
import sys
import types
import zlib
from collections.abc import Collection
from typing import TYPE_CHECKING

from vgpuvirt.errors import RemoteRequirementMissing

if TYPE_CHECKING:   # the agent's command line is built without paramiko (benchmarks on a GPU host)
    import paramiko

# What a shell says when ``sudo`` itself is not there (bash: "sudo: command not found", dash: "sudo: not
# found"), as opposed to sudo saying that the program it was asked to run is missing ("sudo: python3: ...").
_NO_SUDO = re.compile(rb"(^|[\s:])sudo: (command )?not found|sudo: No such file or directory", re.MULTILINE)
_SUDO_PASSWORD = re.compile(rb"^sudo: (a password is required|a terminal is required|no askpass program)",
                            re.MULTILINE)
_SUDO_DENIED = re.compile(rb"^(sudo: )?\S+ is not in the sudoers file|^Sorry, user \S+ is not allowed",
                          re.MULTILINE)


def sudo_problem(host: str, rc: int, err: bytes) -> RemoteRequirementMissing | None:
    """The error for a ``sudo -n -- ...`` command that sudo did not run, from its exit status and stderr."""
    if rc == 0:
        return None
    if _NO_SUDO.search(err):
        return RemoteRequirementMissing(host, "sudo is not installed on the host (needed for sudo=True): "
                                              "install it, or log in as root without --sudo")
    if _SUDO_PASSWORD.search(err):
        return RemoteRequirementMissing(host, "sudo -n needs a password on the host: allow passwordless sudo "
                                              "(NOPASSWD) for python3 for this user, or log in as root")
    if _SUDO_DENIED.search(err):
        return RemoteRequirementMissing(host, "sudo refused: this user may not run python3 through sudo on the "
                                              "host (sudoers)")
    return None


def read_frame(chan: paramiko.Channel) -> bytes | None:
    """One ``length + bytes`` frame from the resident agent; None if its output ended first."""
    buf = bytearray()
    need = 4
    length: int | None = None
    while len(buf) < need:
        data = chan.recv(max(need - len(buf), 1 << 16))
        if not data:
            return None
        buf += data
        if length is None and len(buf) >= 4:
            length = struct.unpack(">I", bytes(buf[:4]))[0]
            need = 4 + length
    if len(buf) != need:
        import paramiko
        raise paramiko.SSHException(f"the resident agent sent {len(buf) - need} bytes more than its answer")
    return bytes(buf[4:])


#: What a bytecode bootstrap says (on stderr, exit status 1) on a host whose Python is not the client's: it ran
#: nothing, so the client sends the same request again with the source (:meth:`SSHHost._exchange`).
FOREIGN_BYTECODE = b"vgpuvirt-agent: bytecode for another python"

# Python 3.11+ keeps a column range for each instruction (the location table): half the bytecode's size, and
# used only by tracebacks' ^^^ markers. Entries (Objects/locations.md, the same in 3.11-3.13): a first byte
# 1CCCCLLL (code C, length L+1 code units), then code 0-9: one column byte (line unchanged); 10-12: two
# column bytes (line + C-10); 13: a signed varint line delta, no columns; 14: line delta, then three
# varints (end line, columns); 15: no location.
_LOCATION_TABLE_VERSIONS = ((3, 11), (3, 12), (3, 13))

#: The largest bytecode bootstrap sent (base64). It shares one 128 KiB argument (MAX_ARG_STRLEN) with a request
#: of up to 64 KiB (ssh.ARGV_REQUEST_MAX); the thinned agent takes ~42 KiB, its full tables ~73 KiB.
BYTECODE_BOOTSTRAP_MAX = 56 * 1024


def _varint_end(table: bytes, i: int) -> int:
    while table[i] & 0x40:
        i += 1
    return i + 1


def _svarint(value: int) -> bytes:
    value = (-value << 1) | 1 if value < 0 else value << 1
    out = bytearray()
    while value >= 0x40:
        out.append(0x40 | (value & 0x3F))
        value >>= 6
    out.append(value)
    return bytes(out)


def _lines_only(table: bytes) -> bytes:
    """A 3.11+ location table with the same lines and no columns (tracebacks keep their line numbers)."""
    out = bytearray()
    i = 0
    while i < len(table):
        head = table[i]
        code, units = (head >> 3) & 0x0F, head & 0x07
        if code == 15:
            out.append(head)
            i += 1
            continue
        if code == 13 or code == 14:
            start, i = i + 1, _varint_end(table, i + 1)
            delta = table[start:i]
            if code == 14:
                for _ in range(3):
                    i = _varint_end(table, i)
            out.append(0x80 | (13 << 3) | units)
            out += delta
            continue
        out.append(0x80 | (13 << 3) | units)
        out += _svarint(code - 10 if code >= 10 else 0)
        i += 3 if code >= 10 else 2
    return bytes(out)


def _without_columns(code: types.CodeType) -> types.CodeType:
    consts = tuple(_without_columns(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_consts=consts, co_linetable=_lines_only(code.co_linetable))


_PART_START = re.compile(rb'^# >>> agent part "(\w+)"')
_PART_END = re.compile(rb'^# <<< agent part "(\w+)"')


def agent_parts(source: bytes) -> list[tuple[str | None, list[bytes]]]:
    """agent.py's lines as runs: (part name, its lines), None for the core; a marker line belongs to its part.

    Raises ValueError for markers that do not pair up (a part left open, closed by another name, or nested).
    """
    runs: list[tuple[str | None, list[bytes]]] = [(None, [])]
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        start, end = _PART_START.match(line), _PART_END.match(line)
        current = runs[-1][0]
        if start:
            if current is not None:
                raise ValueError(f"agent.py:{number}: part {start[1].decode()!r} opens inside part {current!r}")
            runs.append((start[1].decode(), [line]))
        elif end:
            if current != end[1].decode():
                raise ValueError(f"agent.py:{number}: closes part {end[1].decode()!r}, open: {current!r}")
            runs[-1][1].append(line)
            runs.append((None, []))
        else:
            runs[-1][1].append(line)
    if runs[-1][0] is not None:
        raise ValueError(f"agent.py: part {runs[-1][0]!r} is never closed")
    return runs


def agent_source(parts: Collection[str] | None = None) -> bytes:
    """The agent's source with the core and ``parts`` (None: every part); the other parts' lines are left
    blank, so that a traceback from the host names the lines of agent.py."""
    src = importlib.resources.files("vgpuvirt.host").joinpath("agent.py").read_bytes()
    if parts is None:
        return src
    runs = agent_parts(src)
    unknown = set(parts) - {name for name, _ in runs if name is not None}
    if unknown:
        raise ValueError(f"agent.py has no part {sorted(unknown)}")
    return b"".join(b"".join(lines) if name is None or name in parts else b"\n" * len(lines)
                    for name, lines in runs)


def _agent_bootstrap(bytecode: bool, parts: frozenset[str] | None) -> str:
    src = agent_source(parts)
    if not bytecode:
        blob = base64.b64encode(zlib.compress(src, 9)).decode("ascii")
        # binascii, not base64: base64 imports re, a third of the agent's start
        return ("import zlib,binascii;exec(compile(zlib.decompress(binascii.a2b_base64('" + blob + "')),"
                "'vgpuvirt-agent','exec'))")
    # Compiling the agent's source is most of its start on the host (10 ms here, 39 ms on the H100 box) and
    # gives the same code object every time: this client compiles it once and ships it. A host whose
    # interpreter reads other bytecode (its import magic or cache tag differs) runs none of it and says so.
    # optimize=2 drops docstrings (the agent reads none) and its one assert (a type checker's hint).
    code = compile(src, "vgpuvirt-agent", "exec", dont_inherit=True, optimize=2)
    if sys.version_info[:2] in _LOCATION_TABLE_VERSIONS:
        code = _without_columns(code)
    blob = base64.b64encode(zlib.compress(marshal.dumps(code), 9)).decode("ascii")
    if len(blob) > BYTECODE_BOOTSTRAP_MAX:
        # (a Python whose location tables this module does not know how to thin): the source, which is smaller
        return _agent_bootstrap(False, parts)
    guard = repr((importlib.util.MAGIC_NUMBER, sys.implementation.cache_tag))
    return ("import sys,zlib,binascii,marshal\n"
            "if (getattr(sys.modules.get('_frozen_importlib_external'),'MAGIC_NUMBER',None),"
            "sys.implementation.cache_tag)!=" + guard + ":sys.exit(" + repr(FOREIGN_BYTECODE.decode()) + ")\n"
            "exec(marshal.loads(zlib.decompress(binascii.a2b_base64('" + blob + "'))))")


_BOOTSTRAP: dict[tuple[bool, frozenset[str] | None], str] = {}


def agent_command(python: str = "python3", bytecode: bool = False,
                  parts: Collection[str] | None = None) -> list[str]:
    """The argv that runs the agent on the host: from its source, or (``bytecode``) from this client's
    compiled form of it, which only a host with the same Python runs (else it exits with
    :data:`FOREIGN_BYTECODE`, having done nothing). ``parts``: the agent's parts to send besides its core
    (``agent.parts_needed(request)`` for one request; None: all, as the resident agent needs)."""
    key = (bytecode, None if parts is None else frozenset(parts))
    boot = _BOOTSTRAP.get(key)
    if boot is None:
        boot = _BOOTSTRAP[key] = _agent_bootstrap(*key)
    # -I: no PYTHON* variables or user site from the host; -S: no site import (stdlib only, ~5 ms per exec)
    return [python, "-I", "-S", "-c", boot]
