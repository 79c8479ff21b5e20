"""Leftovers of the first round of probes (issue 27, item 6), each refused in one line before anything is sent
or written: an empty or over-long DNS label in an SSH host (a UnicodeError traceback from the resolver's IDNA
codec), a trailing newline in a domain's ``machine``, ``hyperv_vendor_id``, a NIC's source or a disk's target
(``$`` matched before it), a control character in a ROM file path (an lxml ValueError), and ``sim materialize``
onto a full disk (a traceback, and half a tree left)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.cli import main
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.xml.hostdev import PciHostdev
from vgpuvirt.xml.parts import Disk, VirtioNic
from vgpuvirt.xml.templates import DomainOptions

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("host", ["127.0..1", ".gpu1", "gpu1..example", "a" * 64 + ".example", "x." * 127 + "x",
                                  "é" * 60 + ".example"])
def test_an_unresolvable_dns_name_is_one_line(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidSpec, match="DNS labels of 1 to 63"):
        SSHHost(host)
    assert main(["--host", f"ssh://root@{host}:1", "inventory"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("host", ["gpu1", "gpu1.example.", "a" * 63 + ".example", "127.0.0.1", "::1", "bücher.de"])
def test_a_valid_name_or_address_is_accepted(host: str) -> None:
    assert SSHHost(host).hostname == host


BUILD: dict[str, Callable[[str], Any]] = {
    "machine": lambda v: DomainOptions(machine=v),
    "hyperv_vendor_id": lambda v: DomainOptions(hyperv=True, hyperv_vendor_id=v),
    "VirtioNic.source": lambda v: VirtioNic("network", v),
    "Disk.target": lambda v: Disk("/var/lib/libvirt/images/a.qcow2", "qcow2", target=v),
}
GOOD = {"machine": "pc-q35-8.2", "hyperv_vendor_id": "vgpuvirt", "VirtioNic.source": "default", "Disk.target": "vdb"}


@pytest.mark.parametrize("field", BUILD)
@pytest.mark.parametrize("tail", ["\n", "\r\n", "\n\n"])
def test_a_trailing_newline_is_refused(field: str, tail: str) -> None:
    BUILD[field](GOOD[field])                          # the value itself is fine
    with pytest.raises(InvalidSpec):
        BUILD[field](GOOD[field] + tail)


@pytest.mark.parametrize("ch", ["\x01", "\x1b", "\t", "\x7f", "\x00", "\n"])
def test_a_control_character_in_the_rom_file_is_refused(ch: str) -> None:
    with pytest.raises(InvalidSpec, match="ROM file"):
        PciHostdev(_addr(), rom_file=f"/usr/share/vgabios{ch}.rom")
    assert PciHostdev(_addr(), rom_file="/usr/share/vgabios.rom").to_element() is not None


def _addr() -> Any:
    from vgpuvirt.model import PciAddress
    return PciAddress.parse("0000:3b:00.0")


_MATERIALIZE = 'mount -t tmpfs -o size=64k tmpfs "$1" && shift && "$@"; echo "rc=$?"; ls -A "$0"'


def test_materialize_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    dest = mnt / "tree"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", _MATERIALIZE, str(mnt), str(mnt),
                        sys.executable, "-m", "vgpuvirt", "sim", "materialize", "large", str(dest)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "rc=1" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert r.stdout.strip().endswith("rc=1"), "the tree (or DEST) was left behind: " + r.stdout
    assert r.stderr.count("\n") == 1 and "No space left on device" in r.stderr and "Traceback" not in r.stderr


def test_materialize_still_writes_a_whole_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "sim", "materialize", "t4x2", str(tmp_path / "t")]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] > 100
    assert (tmp_path / "t/sys/bus/pci/devices/0000:3b:00.0").exists()
