"""The default libvirt URI of a host, and one-line reasons for a failed libvirt connection (issue 16)."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from vgpuvirt.host.local import LocalHost
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.libvirt_uri import connect_failure, default_uri, ssh_uri
from vgpuvirt.sim import SimHost


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "vgpuvirt" / "libvirt-ssh"


def _wrapper(uri: str) -> str:
    cmd = re.search(r"[?&]command=([^&]*)", uri)
    assert cmd, uri
    return unquote(cmd[1])


def test_ssh_uri_uses_the_ssh_transport_with_the_hosts_key_and_a_strict_wrapper(_cache: Path) -> None:
    # issue 28: qemu+libssh:// hung after a handful of XMLDesc calls; OpenSSH does not
    uri = ssh_uri("gpu1", port=2222, username="root", identity="/k/id ed", known_hosts="/k/known hosts%d")
    assert uri.startswith("qemu+ssh://root@gpu1:2222/system?keyfile=/k/id%20ed&command=")
    assert "libssh" not in uri and "no_verify" not in uri
    wrapper = _wrapper(uri)
    assert os.path.dirname(wrapper) == str(_cache) and os.access(wrapper, os.X_OK)
    assert stat.S_IMODE(os.stat(_cache).st_mode) == 0o700
    argv = shlex.split(Path(wrapper).read_text().splitlines()[-1])
    assert argv[:3] == ["exec", "ssh", "-F"] and argv[-1] == "$@"
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    # the path travels quoted (ssh splits the option on spaces) with % doubled (ssh expands %-tokens)
    assert 'UserKnownHostsFile="/k/known hosts%%d"' in opts
    for o in ("GlobalKnownHostsFile=none", "StrictHostKeyChecking=yes", "BatchMode=yes", "UpdateHostKeys=no"):
        assert o in opts
    assert any(o.startswith("ServerAliveInterval=") for o in opts)
    assert ssh_uri("gpu1", port=2222, username="root", identity="/k/id ed", known_hosts="/k/known hosts%d") == uri


def test_the_wrapper_runs_ssh_with_those_options_and_libvirts_arguments(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake / "ssh").chmod(0o755)
    wrapper = _wrapper(ssh_uri("h", known_hosts="/k/kh"))
    out = subprocess.run([wrapper, "-p", "22", "--", "h", "sh", "-c", "x y"], capture_output=True, text=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin"}, check=True).stdout.splitlines()
    assert out[:4] == ["-F", "none", "-o", 'UserKnownHostsFile="/k/kh"']
    assert out[-7:] == ["-p", "22", "--", "h", "sh", "-c", "x y"]


def test_a_wrapper_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(PermissionError, match="not a private directory"):
        ssh_uri("h", known_hosts="/k/kh", wrapper_dir=str(d))
    with pytest.raises(ValueError, match="without quotes"):
        ssh_uri("h", known_hosts='/k/"kh')


def test_ssh_uri_defaults_are_absolute_and_ipv6_is_bracketed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    uri = ssh_uri("fe80::1")
    assert uri.startswith("qemu+ssh://[fe80::1]/system?command=")
    assert "keyfile" not in uri
    assert 'UserKnownHostsFile="/home/u/.ssh/known_hosts"' in Path(_wrapper(uri)).read_text()
    rel = ssh_uri("h", identity="id_key")
    assert f"keyfile={os.getcwd()}/id_key" in rel


def test_default_uri_follows_the_host() -> None:
    h = SSHHost("gpu1", port=2200, username="admin", key_filename="/k/id", known_hosts="/k/kh")
    assert default_uri(h) == ssh_uri("gpu1", port=2200, username="admin", identity="/k/id", known_hosts="/k/kh")
    assert default_uri(LocalHost("/")) == "qemu:///system"
    assert default_uri(SimHost.from_profile("t4x2")) == "test:///default"


SSH_CHANGED = ("Cannot recv data: @@@@\r\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n"
               "The fingerprint for the ED25519 key sent by the remote host is\n"
               "SHA256:eEXOM/TfcJnHYTTGYSLyzu+ONeyDSviS9k5icnKIYhI.\r\n"
               "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.\r\n"
               "Host key verification failed.: Connection reset by peer")


@pytest.mark.parametrize(("message", "reason"), [
    # libvirt 9.0 + OpenSSH 9.2's messages, as seen against the testbed's sshd
    ("Cannot recv data: No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict "
     "checking.\r\nHost key verification failed.: Connection reset by peer",
     "host key of 127.0.0.1:2222 is not in /k/kh"),
    (SSH_CHANGED, "host key of 127.0.0.1:2222 CHANGED: it differs from the one in /k/kh (the host sent "
                  "SHA256:eEXOM/TfcJnHYTTGYSLyzu+ONeyDSviS9k5icnKIYhI)"),
    ("Cannot recv data: sh: 1: exec: ssh: not found: Connection reset by peer", "ssh) is not installed"),
])
def test_ssh_transport_failures_name_the_wrappers_known_hosts(message: str, reason: str) -> None:
    uri = ssh_uri("127.0.0.1", port=2222, username="root", identity="/k/id", known_hosts="/k/kh")
    line = connect_failure(uri, message)
    assert reason in line and "\n" not in line and "command=" not in line, line
    assert line.startswith("libvirt qemu+ssh://root@127.0.0.1:2222/system: ")


def test_a_link_that_closed_without_ssh_words_asks_ssh_itself(_cache: Path) -> None:
    """Under load libvirt may read the ssh child's end before its stderr (seen in a full parallel run: "Cannot
    recv data: Value too large for defined data type" for a changed key): ssh's own words are then asked for."""
    uri = ssh_uri("127.0.0.1", port=2222, username="root", identity="/k/id", known_hosts="/k/kh")
    asked: list[str] = []

    def probe(u: str) -> str:
        asked.append(u)
        return SSH_CHANGED.removeprefix("Cannot recv data: ")

    bare = "Cannot recv data: Value too large for defined data type"
    line = connect_failure(uri, bare, probe=probe)
    assert asked == [uri] and "host key of 127.0.0.1:2222 CHANGED" in line and "\n" not in line, line
    assert "closed during set-up" in connect_failure(uri, bare)               # no probe: the old generic line
    assert "CHANGED" in connect_failure(uri, SSH_CHANGED, probe=lambda u: pytest.fail("asked needlessly"))


URI = "qemu+libssh://root@127.0.0.1:2222/system?known_hosts=/k/kh&known_hosts_verify=normal&keyfile=/k/id&sshauth=privkey"


@pytest.mark.parametrize(("message", "reason"), [
    # libvirt 9.0's own messages, as seen against the testbed's sshd
    ("libssh transport error: No user interaction callback provided: Can't verify the session host key",
     "host key of 127.0.0.1:2222 is not in /k/kh"),
    ("authentication failed: !!! SSH HOST KEY VERIFICATION FAILED !!!: Identity of host '127.0.0.1:2222' differs "
     "from stored identity.", "host key of 127.0.0.1:2222 CHANGED"),
    ("libssh transport error: failed to authenticate: Access denied for 'publickey'.",
     "SSH authentication refused for 127.0.0.1:2222 (key /k/id)"),
    ("authentication failed: error while reading private key '/k/id'", "cannot read the private key /k/id"),
    ("unable to connect to server at '127.0.0.1:2222': Connection refused", "connection refused by 127.0.0.1:2222"),
    ("Cannot recv data: Host key verification failed.: Connection reset by peer", "not verified by ssh"),
    ("Failed to connect socket to '/var/run/libvirt/libvirt-sock': No such file or directory",
     "libvirtd is not running on 127.0.0.1:2222"),
    ("something new", "cannot connect: something new"),
])
def test_connect_failures_say_in_one_line_what_failed(message: str, reason: str) -> None:
    line = connect_failure(URI, message)
    assert reason in line and "\n" not in line and "keyfile" not in line, line
    assert line.startswith("libvirt qemu+libssh://root@127.0.0.1:2222/system: ")
    assert "cannot connect failed" not in line
