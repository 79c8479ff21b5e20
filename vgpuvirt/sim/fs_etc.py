"""The simulated ``/etc/modprobe.d`` and ``/sys/module/nvidia/parameters`` (the driver's registry options),
and the NVML calls of the agent's ``nvml`` op: the parts of :class:`~vgpuvirt.sim.fs.SimFs` that play the
vGPU scheduler's host side (state in :mod:`vgpuvirt.sim.scheduler`)."""

from __future__ import annotations

import errno
from typing import Any

from vgpuvirt.sim.fs_nodes import Attr, Dir, Node
from vgpuvirt.sim.kstrto import oserror
from vgpuvirt.sim.model import SimModel

MODPROBE_DIR = "/etc/modprobe.d"
STATE_DIR = "/var/lib/vgpuvirt"


class EtcTree:
    model: SimModel

    def _etc(self) -> dict[str, Node]:
        files = self.model.sched.modprobe
        return {"modprobe.d": Dir(lambda: {name: Attr(show=lambda n=name: files[n], mode=0o644)  # type: ignore[misc]
                                           for name in sorted(files)})}

    def _module(self) -> dict[str, Node]:
        if "nvidia" not in self.model.drivers:
            return {}
        sched = self.model.sched
        params: dict[str, Node] = {name: Attr(show=lambda n=name: sched.loaded[n] + "\n", mode=0o444)  # type: ignore[misc]
                  for name in sched.loaded}
        return {"nvidia": Dir(lambda: {"parameters": Dir(lambda: params)})}

    def replace_file(self, path: str, value: str, mode: int) -> None:
        """The agent's ``replace_file`` op: only plain file names directly in /etc/modprobe.d and in vgpuvirt's
        state directory exist here."""
        directory, _, name = path.rpartition("/")
        if directory not in (MODPROBE_DIR, STATE_DIR) or not name or name.startswith("."):
            raise oserror(errno.EROFS)
        with self.model.lock:
            if directory == STATE_DIR:
                self.model.state_files[name] = value
                self.model.bump()
                return
            self.model.sched.modprobe[name] = value
            self.model.bump()

    def nvml(self, op: dict[str, Any]) -> dict[str, Any]:
        return self.model.sched.nvml(op)
