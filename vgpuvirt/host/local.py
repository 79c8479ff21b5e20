"""LocalHost: the machine we run on (e.g. inside an Ansible module on the GPU host)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from typing import Any

from vgpuvirt.errors import HostError, InvalidSpec
from vgpuvirt.host import agent
from vgpuvirt.host.audit_log import checked_audit_path
from vgpuvirt.host.base import BaseHost, Result


class LocalHost(BaseHost):
    """This machine. ``sysfs_root`` points every sysfs path at another tree (fixtures, a FUSE mount)."""

    def __init__(self, sysfs_root: str = "/", *, name: str = "local", lock_path: str | None = None,
                 audit_path: str | None = None) -> None:
        if not os.path.isabs(sysfs_root):
            raise InvalidSpec("sysfs root", sysfs_root, "an absolute path")
        if not os.path.isdir(sysfs_root):
            raise InvalidSpec("sysfs root", sysfs_root, "an existing directory")
        super().__init__(name, os.path.abspath(sysfs_root))
        if lock_path is not None:
            self.lock_path = lock_path
        #: the audit log named by the caller (this machine's own code); None: the host's configuration says
        self.audit_override = checked_audit_path(audit_path) if audit_path is not None else None
        if self.audit_override is not None:
            self.audit_path = self.audit_override

    @property
    def is_local(self) -> bool:
        return True         # its programs run here (a sysfs_root elsewhere moves only the sysfs paths)

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        self._count_round_trip()
        return agent.handle(request, agent.OsFs(self.sysfs_root), audit_path=self.audit_override)

    def _run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
             idempotent: bool = False) -> Result:
        argv = tuple(argv)
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise InvalidSpec("argv", argv, "a non-empty list of strings")
        self._count_round_trip()
        try:
            proc = subprocess.run(argv, input=(stdin or "").encode(), capture_output=True, timeout=timeout,
                                  check=False)
        except FileNotFoundError:
            return Result(argv, 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired as exc:
            raise HostError(self.name, f"{argv[0]} timed out after {timeout} s") from exc
        return Result(argv, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                      proc.stderr.decode("utf-8", "replace"))
