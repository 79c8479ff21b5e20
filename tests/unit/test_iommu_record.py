"""``iommu prepare --record FILE``: the record of original drivers is on disk, complete, BEFORE any
device is bound, and never written through a planted link. Each way the write can fail (no
directory, a link or an earlier record at the name, a full disk) is a one-line error with every
device still on its original driver."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from vgpuvirt.change.driver import prepare_vfio
from vgpuvirt.cli import main
from vgpuvirt.cli.context import Context
from vgpuvirt.errors import RecordError
from vgpuvirt.services.iommu import api as iommu
from vgpuvirt.services.pci import sysfs
from vgpuvirt.sim import SimHost

GPU, AUDIO = "0000:01:00.0", "0000:01:00.1"


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> SimHost:
    """One simulated host shared by every CLI call of the test (a sim: host is fresh per call)."""
    h = SimHost.from_profile("desktop")
    monkeypatch.setattr(Context, "host", lambda self: h)
    return h


def drivers(h: SimHost) -> dict[str, str | None]:
    snap = h.read([f"{sysfs.PCI}/{a}/driver" for a in (GPU, AUDIO)])
    return {a: snap.link_name(f"{sysfs.PCI}/{a}/driver") for a in (GPU, AUDIO)}


ORIGINAL = {GPU: "nvidia", AUDIO: "snd_hda_intel"}


def prepare(capsys: pytest.CaptureFixture[str], record: Path | str) -> tuple[int, str, str]:
    rc = main(["iommu", "prepare", GPU, "--record", str(record)])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_refused(rc: int, err: str, host: SimHost, *words: str) -> None:
    assert rc != 0 and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert drivers(host) == ORIGINAL


def test_the_record_is_complete_before_anything_is_bound(host, tmp_path, capsys):
    seen: list[dict[str, str | None]] = []
    rec = tmp_path / "rec.json"
    import vgpuvirt.cli.iommu as cli_iommu
    real = cli_iommu.prepare_vfio

    def spy(*a, **kw):
        hook = kw["before_change"]

        def check(record):
            hook(record)
            seen.append(drivers(host))                       # the host as it was when the record landed
            assert json.loads(rec.read_text())["bindings"][0]["original_driver"] == "nvidia"
        return real(*a, **{**kw, "before_change": check})

    cli_iommu.prepare_vfio = spy
    try:
        rc, _, err = prepare(capsys, rec)
    finally:
        cli_iommu.prepare_vfio = real
    assert rc == 0, err
    assert seen == [ORIGINAL] and drivers(host) == {GPU: "vfio-pci", AUDIO: "vfio-pci"}
    assert oct(rec.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]   # no temporary file left


def test_missing_directory_binds_nothing(host, tmp_path, capsys):
    rc, _, err = prepare(capsys, tmp_path / "nodir" / "rec.json")
    assert_refused(rc, err, host, "does not exist")


def test_unwritable_directory_binds_nothing(host, tmp_path, capsys):
    if os.geteuid() == 0:
        # root writes anywhere: a directory that is really a file stands in for "cannot write here"
        (tmp_path / "file").write_text("x")
        rc, _, err = prepare(capsys, tmp_path / "file" / "rec.json")
        assert_refused(rc, err, host, "not a directory")
        return
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    rc, _, err = prepare(capsys, d / "rec.json")
    assert_refused(rc, err, host, "cannot be written")


def test_planted_symlink_at_the_record_is_not_followed(host, tmp_path, capsys):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    rec = tmp_path / "rec.json"
    rec.symlink_to(outside)
    rc, _, err = prepare(capsys, rec)
    assert_refused(rc, err, host, "symbolic link")
    assert outside.read_text() == "precious\n" and rec.is_symlink()
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "created-through-the-link")
    rc, _, err = prepare(capsys, dangling)
    assert_refused(rc, err, host, "symbolic link")
    assert not (tmp_path / "created-through-the-link").exists()


def test_an_earlier_record_is_never_replaced(host, tmp_path, capsys):
    rec = tmp_path / "rec.json"
    rec.write_text('{"host": "h", "bindings": [{"address": "0000:01:00.0", "original_driver": "nvidia"}]}\n')
    before = rec.read_text()
    rc, _, err = prepare(capsys, rec)
    assert_refused(rc, err, host, "already exists")
    assert rec.read_text() == before


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_full_disk_binds_nothing_and_leaves_no_file(host, tmp_path, capsys, monkeypatch, call):
    def enospc(*_a: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, call, enospc)
    rc, _, err = prepare(capsys, tmp_path / "rec.json")
    monkeypatch.undo()
    assert_refused(rc, err, host, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_api_hook_failure_changes_nothing(tmp_path):
    h = SimHost.from_profile("desktop")

    def full(_record: iommu.BindingRecord) -> None:
        raise RecordError(str(tmp_path / "r"), errno.ENOSPC, "cannot be written (No space left on device)")
    with pytest.raises(RecordError, match="nothing was bound"):
        prepare_vfio(h, [GPU], before_change=full)
    assert drivers(h) == ORIGINAL
