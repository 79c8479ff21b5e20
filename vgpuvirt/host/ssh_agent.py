"""The batch agent over SSH: the command that starts it on the host, and the frames a resident one answers in."""

from __future__ import annotations

import base64
import importlib.resources
import struct
import zlib

import paramiko


def _read_frame(chan: paramiko.Channel) -> bytes | None:
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
        raise paramiko.SSHException(f"the resident agent sent {len(buf) - need} bytes more than its answer")
    return bytes(buf[4:])


def _agent_bootstrap() -> str:
    src = importlib.resources.files("vgpuvirt.host").joinpath("agent.py").read_bytes()
    blob = base64.b64encode(zlib.compress(src, 9)).decode("ascii")
    # binascii, not base64: base64 imports re, a third of the agent's start
    return ("import zlib,binascii;exec(compile(zlib.decompress(binascii.a2b_base64('" + blob + "')),"
            "'vgpuvirt-agent','exec'))")


_BOOTSTRAP: str | None = None


def agent_command(python: str = "python3") -> list[str]:
    global _BOOTSTRAP
    if _BOOTSTRAP is None:
        _BOOTSTRAP = _agent_bootstrap()
    # -I: no PYTHON* variables or user site from the host; -S: no site import (stdlib only, ~5 ms per exec)
    return [python, "-I", "-S", "-c", _BOOTSTRAP]
