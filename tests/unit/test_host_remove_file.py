"""The agent's ``remove_file`` op (the undo of a ``replace_file`` that created a configuration file): the file goes,
an absent one is fine, a link goes itself (never what it points to), and nothing outside the host's root is touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vgpuvirt.host.base import Op
from vgpuvirt.host.local import LocalHost

CONF = "/etc/modprobe.d/vgpuvirt-scheduler.conf"


def host_at(root: Path) -> LocalHost:
    (root / "etc/modprobe.d").mkdir(parents=True)
    return LocalHost(str(root), lock_path=str(root / "lock"), audit_path=str(root / "audit.jsonl"))


def test_a_file_made_by_replace_file_is_removed_and_an_absent_one_is_fine(tmp_path: Path) -> None:
    h = host_at(tmp_path / "root")
    assert h.apply([Op.replace_file(CONF, "options nvidia\n")]).ok
    assert (tmp_path / "root" / CONF.lstrip("/")).exists()
    res = h.apply([Op.remove_file(CONF)])
    assert res.ok and not (tmp_path / "root" / CONF.lstrip("/")).exists()
    assert h.apply([Op.remove_file(CONF)]).ok                              # already absent
    assert h.apply([Op.remove_file("/etc/nowhere/x.conf")]).ok             # no directory either
    audit = [r for r in h.read_audit().records if r.get("op") == "remove_file"]
    assert audit and audit[0]["path"] == CONF and Op.remove_file(CONF).mutates


def test_a_link_goes_itself_and_nothing_outside_the_root_is_touched(tmp_path: Path) -> None:
    h = host_at(tmp_path / "root")
    outside = tmp_path / "outside.conf"
    outside.write_text("not ours\n")
    link = tmp_path / "root" / CONF.lstrip("/")
    link.symlink_to(outside)
    assert h.apply([Op.remove_file(CONF)]).ok
    assert not os.path.lexists(link) and outside.read_text() == "not ours\n"
    # a directory that leads out of the root: refused, the file there stays
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/x.conf").write_text("keep\n")
    os.symlink(tmp_path / "elsewhere", tmp_path / "root/etc/vgpuvirt")
    res = h.apply([Op.remove_file("/etc/vgpuvirt/x.conf")])
    assert not res.ok
    assert (tmp_path / "elsewhere/x.conf").read_text() == "keep\n"


@pytest.mark.parametrize("path", ["/etc/../x", "relative"])
def test_bad_paths_are_refused_before_anything_is_sent(path: str) -> None:
    with pytest.raises(ValueError):
        Op.remove_file(path)
