"""SimHost: a Host whose filesystem is a simulated GPU host, in-process (no root, no FUSE).

``read``/``apply`` go through :func:`vgpuvirt.host.agent.handle` with the simulator's filesystem,
so they behave exactly like LocalHost and SSHHost. ``run`` emulates a few host tools from the
model (see :mod:`vgpuvirt.sim.tools`); anything else is "command not found" (exit 127).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host import agent
from vgpuvirt.host.base import BaseHost, Result
from vgpuvirt.sim.fs import SimFs
from vgpuvirt.sim.model import SimModel
from vgpuvirt.sim.profiles import Profile, load_profile


class _ModelLock:
    """The host-side lock of a simulated host: the model's own lock (one process, many threads)."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock

    def __enter__(self) -> _ModelLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _MemoryAuditor:
    """A simulated host's audit log: the agent's JSON lines, kept in memory for the host's lifetime."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self.lines)


class SimFsWithTools(SimFs):
    """SimFs plus ``run(argv, op)`` so that ``exec`` ops in a batch reach the emulated tools."""

    def run(self, argv: list[str], op: dict[str, Any]) -> dict[str, Any]:
        from vgpuvirt.sim.tools import run_tool
        rc, out, err = run_tool(self.model, list(argv), op.get("stdin") or "")
        res: dict[str, Any] = {"ok": rc in op.get("ok_codes", [0]), "rc": rc, "stdout": out, "stderr": err}
        if not res["ok"]:
            res["errno"] = None
            res["error"] = f"{argv[0]} exited {rc}"
        return res


class SimHost(BaseHost):
    """A simulated host built from a profile; every instance has its own state."""

    def __init__(self, profile: Profile, *, name: str | None = None) -> None:
        super().__init__(name or f"sim:{profile.name}", "/")
        self.profile = profile
        self.model = SimModel(profile)
        self.fs = SimFsWithTools(self.model)
        self._locker = _ModelLock(self.model.lock)
        self._auditor = _MemoryAuditor()

    def reboot(self) -> None:
        """Restart the simulated host (see :meth:`vgpuvirt.sim.model.SimModel.reboot` for what survives)."""
        self.model.reboot()

    @classmethod
    def from_profile(cls, name_or_path: str | os.PathLike[str], *, name: str | None = None) -> SimHost:
        return cls(load_profile(name_or_path), name=name)

    @property
    def is_local(self) -> bool:
        return False        # a model: this machine's NVML and libvirt describe another host than the simulated one

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        self._count_round_trip()
        response: dict[str, Any] = agent.handle(request, fs=self.fs, locker=self._locker,
                                                   auditor=self._auditor)
        return response

    def _run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
             idempotent: bool = False) -> Result:
        args = tuple(argv)
        if not args or not all(isinstance(a, str) and "\0" not in a for a in args):
            raise InvalidSpec("argv", args, "a non-empty list of strings")
        self._count_round_trip()
        from vgpuvirt.sim.tools import run_tool
        with self.model.lock:
            rc, out, err = run_tool(self.model, list(args), stdin or "")
        return Result(args, rc, out, err)
