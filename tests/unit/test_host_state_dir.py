"""The host-side lock lives in a directory only its owner can write, opened without following links.

A lock in a world-writable place (/run/lock) lets any local user hold it (every batch then times out)
or, where symlink protection is off, redirect it. The agent refuses a lock directory that is a link,
is owned by another user, or is group/world-writable, and creates a missing one 0700.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vgpuvirt.errors import HostError
from vgpuvirt.host import LocalHost, Op, agent
from vgpuvirt.host.agent import FlockLocker
from vgpuvirt.host.base import DEFAULT_LOCK_PATH

ATTR = "/sys/class/x/a"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sys/class/x").mkdir(parents=True)
    (root / "sys/class/x/a").write_text("old\n")
    return root


def apply(tree: Path, lock_dir: Path) -> None:
    LocalHost(str(tree), lock_path=str(lock_dir / "lock")).apply([Op.write(ATTR, "new")])


def test_the_default_lock_is_in_a_directory_of_its_own_not_in_world_writable_run_lock() -> None:
    assert DEFAULT_LOCK_PATH == "/run/vgpuvirt/lock"
    assert FlockLocker.__module__ == "vgpuvirt.host.agent"


def test_a_missing_lock_directory_is_created_0700(tree: Path, tmp_path: Path) -> None:
    apply(tree, tmp_path / "state")
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "state" / "lock").stat().st_mode) == 0o600
    assert (tree / ATTR.lstrip("/")).read_text() == "new"


def refused(tree: Path, lock_dir: Path, says: str) -> None:
    with pytest.raises(HostError, match=says) as info:
        apply(tree, lock_dir)
    assert "\n" not in str(info.value)
    assert (tree / ATTR.lstrip("/")).read_text() == "old\n"     # nothing of the batch ran


def test_a_lock_directory_that_is_a_symlink_is_refused(tree: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(elsewhere)
    refused(tree, tmp_path / "state", "symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_a_world_writable_lock_directory_is_refused(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    os.chmod(tmp_path / "state", 0o777)
    refused(tree, tmp_path / "state", r"group- or world-writable \(mode 0777\)")
    assert not (tmp_path / "state" / "lock").exists()


def test_a_lock_directory_owned_by_another_user_is_refused(tree: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(tmp_path / "state", 65534, 65534)      # nobody
    else:   # the agent runs in-process: make it another user than the directory's owner
        euid = os.geteuid()
        monkeypatch.setattr(agent.os, "geteuid", lambda: euid + 1)   # the agent's own system calls (posix)
    refused(tree, tmp_path / "state", "is owned by uid")


def test_a_lock_file_that_is_a_symlink_is_refused(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "state" / "lock").symlink_to(victim)
    refused(tree, tmp_path / "state", "symbolic link")
    assert victim.read_text() == "keep\n"
