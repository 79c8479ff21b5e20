"""The default libvirt URI of a host, and one-line reasons for a failed libvirt connection (issue 16)."""

from __future__ import annotations

import os

import pytest

from vgpuvirt.host.local import LocalHost
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.libvirt_uri import connect_failure, default_uri, ssh_uri
from vgpuvirt.sim import SimHost


def test_ssh_uri_carries_user_port_key_and_known_hosts_verified_strictly() -> None:
    uri = ssh_uri("gpu1", port=2222, username="root", identity="/k/id ed", known_hosts="/k/known_hosts")
    assert uri == ("qemu+libssh://root@gpu1:2222/system?known_hosts=/k/known_hosts&known_hosts_verify=normal"
                   "&keyfile=/k/id%20ed&sshauth=privkey")


def test_ssh_uri_defaults_are_absolute_and_ipv6_is_bracketed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    uri = ssh_uri("fe80::1")
    assert uri.startswith("qemu+libssh://[fe80::1]/system?known_hosts=/home/u/.ssh/known_hosts&")
    assert "keyfile" not in uri and "no_verify" not in uri and "known_hosts_verify=normal" in uri
    rel = ssh_uri("h", identity="id_key")
    assert f"keyfile={os.getcwd()}/id_key" in rel


def test_default_uri_follows_the_host() -> None:
    h = SSHHost("gpu1", port=2200, username="admin", key_filename="/k/id", known_hosts="/k/kh")
    assert default_uri(h) == ssh_uri("gpu1", port=2200, username="admin", identity="/k/id", known_hosts="/k/kh")
    assert default_uri(LocalHost("/")) == "qemu:///system"
    assert default_uri(SimHost.from_profile("t4x2")) == "test:///default"


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
