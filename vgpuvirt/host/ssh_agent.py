"""The batch agent over SSH: the command that starts it on the host, and the frames a resident one answers in."""

from __future__ import annotations

import base64
import importlib.resources
import re
import struct
import zlib

import paramiko

from vgpuvirt.errors import RemoteRequirementMissing

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
