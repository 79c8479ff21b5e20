"""Shared helpers for the simulator's integration tests: a FUSE mount below the testbed's shared mnt dir."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator

from conftest import require_part  # type: ignore[import-not-found]


def require_fuse() -> None:
    require_part("FUSE", os.geteuid() == 0 and os.path.exists("/dev/fuse")
                 and importlib.util.find_spec("mfusepy") is not None and shutil.which("fusermount3") is not None,
                 "needs root, /dev/fuse, fusermount3 (fuse3) and mfusepy (vgpuvirt[fuse])")


@contextlib.contextmanager
def sim_mount(mnt_dir: str, profile: str) -> Iterator[str]:
    """Mount ``profile`` live in a fresh directory below ``mnt_dir`` (shared propagation: sshd sees it)."""
    from vgpuvirt.sim import fuse
    require_fuse()
    d = tempfile.mkdtemp(prefix=f"sim-{profile}-", dir=mnt_dir)
    pid_file = d + ".pid"
    try:
        fuse.start(profile, d, pid_file=pid_file)
        yield d
    finally:
        fuse.stop(d, pid_file=pid_file)
        os.rmdir(d)
