"""libvirt over SSH with the SSH host's own identity, against the testbed's real sshd and real libvirtd
(issue 16: the default URI ignored --identity and --known-hosts and failed with "cannot connect failed")."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.cli import main
from vgpuvirt.errors import LibvirtError
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.libvirt_uri import default_uri, ssh_probe


def test_the_default_uri_of_an_ssh_host_reaches_libvirtd_with_its_key_and_known_hosts(testbed: Any) -> None:
    host = testbed.ssh()
    uri = default_uri(host)
    assert uri.startswith(f"qemu+ssh://root@{testbed.ssh_host}:{testbed.ssh_port}/system?")
    with LibvirtConnection(uri, readonly=True) as conn:
        assert conn.driver == "qemu"


def _known_hosts_with(tmp_path: Path, testbed: Any, key_line: str | None) -> str:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{testbed.ssh_host}]:{testbed.ssh_port} {key_line}\n" if key_line else "")
    return str(kh)


def test_an_unknown_host_key_is_refused_in_one_line_and_not_saved(testbed: Any, tmp_path: Path) -> None:
    kh = _known_hosts_with(tmp_path, testbed, None)
    uri = default_uri(testbed.ssh(known_hosts=kh))
    with pytest.raises(LibvirtError) as info, LibvirtConnection(uri) as conn:
        _ = conn.driver
    msg = str(info.value)
    assert f"host key of {testbed.ssh_host}:{testbed.ssh_port} is not in {kh}" in msg and "\n" not in msg
    assert Path(kh).read_text() == ""                      # strict: nothing added


def test_a_changed_host_key_is_refused(testbed: Any, tmp_path: Path) -> None:
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kh = _known_hosts_with(tmp_path, testbed, " ".join(key.with_suffix(".pub").read_text().split()[:2]))
    with pytest.raises(LibvirtError, match="CHANGED"), LibvirtConnection(default_uri(testbed.ssh(known_hosts=kh))) as c:
        _ = c.driver


def test_the_ssh_probe_gets_ssh_s_own_words_for_a_changed_key(testbed: Any, tmp_path: Path) -> None:
    """What the connection's failure falls back on when libvirt only says the link closed: the same wrapper, the
    same strict options, ssh's stderr (and None where the key is right: nothing to explain)."""
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kh = _known_hosts_with(tmp_path, testbed, " ".join(key.with_suffix(".pub").read_text().split()[:2]))
    said = ssh_probe(default_uri(testbed.ssh(known_hosts=kh)))
    assert said is not None and "REMOTE HOST IDENTIFICATION HAS CHANGED" in said
    assert ssh_probe(default_uri(testbed.ssh())) is None


def test_the_cli_default_uri_for_an_ssh_host_uses_identity_and_known_hosts(
        testbed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"ssh://root@{testbed.ssh_host}:{testbed.ssh_port}"
    rc = main(["--host", spec, "teardown", "--pattern", "w16cli-none-*", "--dry-run",
               "--identity", testbed.identity, "--known-hosts", testbed.known_hosts, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip().startswith("{")


def test_insecure_accept_unknown_host_key_lets_libvirt_check_the_key_ssh_accepted(
        testbed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kh = _known_hosts_with(tmp_path, testbed, None)
    spec = f"ssh://root@{testbed.ssh_host}:{testbed.ssh_port}"
    argv = ["--host", spec, "--identity", testbed.identity, "--known-hosts", kh, "teardown", "--pattern",
            "w16cli-none-*", "--dry-run", "--json"]
    assert main(argv) == 1                                 # without the flag: refused, the key is unknown
    _, err = capsys.readouterr()
    assert ("host key unknown" in err or f"is not in {kh}" in err) and err.count("\n") == 1, err
    rc = main([*argv, "--insecure-accept-unknown-host-key"])
    _, err = capsys.readouterr()
    assert rc == 0, err
    assert Path(kh).read_text() == ""                      # accepted for this run, never saved
