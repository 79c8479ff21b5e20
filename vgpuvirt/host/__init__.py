"""Host access: the Host protocol and its implementations (local, SSH; the simulator lives in vgpuvirt.sim)."""

from vgpuvirt.host.base import BaseHost, BatchResult, Entry, Host, Op, OpResult, Result, Snapshot
from vgpuvirt.host.local import LocalHost

__all__ = ["BaseHost", "BatchResult", "Entry", "Host", "LocalHost", "Op", "OpResult", "Result", "Snapshot"]
