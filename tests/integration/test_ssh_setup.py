"""Setting up an SSH connection when things go wrong: typed errors, bounded retries, one clear line.

Against the testbed's real sshd (scripts/testbed.sh), through local fake peers on 127.0.0.1: a proxy that
cuts the server's side of the set-up after N bytes, and a plain TCP server that answers like a web server.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tenacity
from conftest import REPO, Testbed  # type: ignore[import-not-found]

from vgpuvirt.errors import (
    HandshakeFailed,
    HostKeyError,
    KeyFileRefused,
    NotAnSshServer,
    RemoteRequirementMissing,
    TransportError,
)
from vgpuvirt.host.ssh import default_retry, no_retry

pytestmark = pytest.mark.integration


class _Peer:
    """A TCP server on 127.0.0.1 that runs ``serve(conn, index)`` for each connection, in a thread."""

    def __init__(self, serve: object) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections),  # type: ignore[arg-type]
                             daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _web_server(conn: socket.socket, index: int) -> None:
    with conn:
        try:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass


def _cutting_proxy(testbed: Testbed, cut_after: int, cut_connections: int = 10**9) -> object:
    """Forward to sshd; on the first ``cut_connections`` connections, close after ``cut_after`` bytes of the
    server's side (the banner is ~40 bytes, its KEXINIT ~1 KiB, then key exchange and authentication)."""
    def serve(conn: socket.socket, index: int) -> None:
        up = socket.create_connection((testbed.ssh_host, testbed.ssh_port))
        limit = cut_after if index <= cut_connections else None

        def client_to_server() -> None:
            try:
                while data := conn.recv(65536):
                    up.sendall(data)
            except OSError:
                pass
            up.close()
        threading.Thread(target=client_to_server, daemon=True).start()
        sent = 0
        try:
            while limit is None or sent < limit:
                data = up.recv(65536 if limit is None else min(65536, limit - sent))
                if not data:
                    break
                conn.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (conn, up):   # shutdown, not only close: the other thread's recv keeps the socket open
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
    return serve


@pytest.fixture
def peers() -> Iterator[list[_Peer]]:
    made: list[_Peer] = []
    yield made
    for p in made:
        p.close()


def _known_hosts_for(testbed: Testbed, tmp_path: Path, port: int) -> str:
    key = Path(testbed.known_hosts).read_text().splitlines()[0].split(None, 1)[1]
    kh = tmp_path / f"known_hosts_{port}"
    kh.write_text(f"[127.0.0.1]:{port} {key}\n")
    return str(kh)


def _counting(attempts: list[int]) -> tenacity.Retrying:
    return default_retry().copy(before=lambda rs: attempts.append(rs.attempt_number), wait=tenacity.wait_none())


# ---------------------------------------------------------------- a set-up cut part-way
@pytest.mark.parametrize("cut_after", [0, 3, 30, 500, 1100, 1500])
def test_a_setup_cut_part_way_is_a_typed_retryable_failure(testbed: Testbed, tmp_path: Path, peers: list[_Peer],
                                                          cut_after: int) -> None:
    proxy = _Peer(_cutting_proxy(testbed, cut_after))
    peers.append(proxy)
    h = testbed.ssh(port=proxy.port, known_hosts=_known_hosts_for(testbed, tmp_path, proxy.port), retry=no_retry,
                    connect_timeout=3.0)
    with pytest.raises(HandshakeFailed) as ei:      # not a bare EOFError, not "authentication failed"
        h.run(["true"], idempotent=True)
    assert ei.value.retryable and isinstance(ei.value, TransportError)
    assert "\n" not in str(ei.value)


def test_a_setup_cut_once_is_retried_for_every_call(testbed: Testbed, tmp_path: Path, peers: list[_Peer]) -> None:
    proxy = _Peer(_cutting_proxy(testbed, 500, cut_connections=1))
    peers.append(proxy)
    attempts: list[int] = []
    h = testbed.ssh(port=proxy.port, known_hosts=_known_hosts_for(testbed, tmp_path, proxy.port),
                    retry=lambda: _counting(attempts))
    # not idempotent: the request is sent once, but the set-up before it is retried
    assert h.run(["echo", "hi"]).stdout == "hi\n"
    assert attempts == [1, 2] and proxy.connections == 2


def test_setup_retries_are_bounded(testbed: Testbed, tmp_path: Path, peers: list[_Peer]) -> None:
    proxy = _Peer(_cutting_proxy(testbed, 500))
    peers.append(proxy)
    attempts: list[int] = []
    h = testbed.ssh(port=proxy.port, known_hosts=_known_hosts_for(testbed, tmp_path, proxy.port),
                    retry=lambda: _counting(attempts))
    with pytest.raises(HandshakeFailed):
        h.run(["true"])
    assert attempts == [1, 2, 3] and proxy.connections == 3


# ---------------------------------------------------------------- a peer that is not an SSH server
def test_a_peer_that_is_not_an_ssh_server(testbed: Testbed, tmp_path: Path, peers: list[_Peer]) -> None:
    web = _Peer(_web_server)
    peers.append(web)
    attempts: list[int] = []
    h = testbed.ssh(port=web.port, known_hosts=_known_hosts_for(testbed, tmp_path, web.port),
                    retry=lambda: _counting(attempts))
    with pytest.raises(NotAnSshServer, match=re.escape("not an SSH server: it answered 'HTTP/1.1 400 Bad Request'")):
        h.read(["/sys"])
    assert attempts == [1]       # a web server does not become an SSH server on a retry


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "vgpuvirt", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_the_cli_says_one_line_and_no_library_traceback(testbed: Testbed, tmp_path: Path, peers: list[_Peer]) -> None:
    web = _Peer(_web_server)
    cut = _Peer(_cutting_proxy(testbed, 30))
    peers += [web, cut]
    for peer, fragment in ((web, "not an SSH server"), (cut, "SSH set-up cut")):
        res = _cli("--host", f"ssh://root@127.0.0.1:{peer.port}", "--identity", testbed.identity,
                   "--known-hosts", _known_hosts_for(testbed, tmp_path, peer.port), "inventory")
        assert res.returncode == 1 and res.stdout == ""
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("vgpuvirt: error: "), res.stderr
        assert fragment in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------------------- known_hosts markers
def test_a_revoked_host_key_is_refused_even_when_also_listed(testbed: Testbed, tmp_path: Path) -> None:
    line = Path(testbed.known_hosts).read_text().splitlines()[0]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{line}\n@revoked * {line.split(None, 1)[1]}\n")
    attempts: list[int] = []
    with pytest.raises(HostKeyError, match="REVOKED"):
        testbed.ssh(known_hosts=str(kh), retry=lambda: _counting(attempts)).read(["/sys"])
    assert attempts == [1]
    with pytest.raises(HostKeyError, match="REVOKED"):   # the opt-in for unknown keys does not cover it
        testbed.ssh(known_hosts=str(kh), allow_unknown_hosts=True).run(["true"])


def test_a_host_trusted_only_through_a_cert_authority_is_refused_clearly(testbed: Testbed, tmp_path: Path) -> None:
    ca_key = Path(testbed.identity + ".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# comment\n@cert-authority [127.0.0.1]:*,*.example.org {' '.join(ca_key)}\n")
    with pytest.raises(HostKeyError, match=r"line 2 trusts a certificate authority \(@cert-authority\)"):
        testbed.ssh(known_hosts=str(kh)).run(["true"])


def test_marker_lines_for_other_hosts_leave_the_plain_key_working(testbed: Testbed, tmp_path: Path) -> None:
    ca_key = Path(testbed.identity + ".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority *.example.org {' '.join(ca_key)}\n@revoked other.example.org {' '.join(ca_key)}\n"
                  "@bogus-marker x ssh-ed25519 AAAA\nnot a key line\n" + Path(testbed.known_hosts).read_text())
    assert testbed.ssh(known_hosts=str(kh)).run(["true"]).ok


# ---------------------------------------------------------------- private key permissions
def test_a_private_key_readable_by_others_is_refused(testbed: Testbed, tmp_path: Path) -> None:
    key = tmp_path / "id"
    shutil.copy(testbed.identity, key)
    for mode in (0o644, 0o640, 0o604):
        key.chmod(mode)
        with pytest.raises(KeyFileRefused, match=f"readable by group/others \\(mode {mode:04o}\\).*chmod 600"):
            testbed.ssh(key_filename=str(key)).run(["true"], idempotent=True)
    key.chmod(0o600)
    assert testbed.ssh(key_filename=str(key)).run(["true"]).ok


# ---------------------------------------------------------------- sudo
def test_sudo_that_cannot_run_is_a_clear_requirement(testbed: Testbed) -> None:
    h = testbed.ssh(sudo=True)
    if shutil.which("sudo") is None:   # this testbed's host (the same machine) has no sudo
        with pytest.raises(RemoteRequirementMissing, match="sudo is not installed on the host"):
            h.read(["/sys"])
        with pytest.raises(RemoteRequirementMissing, match="sudo is not installed on the host"):
            h.run(["true"])
    else:                              # root with sudo: sudo -n runs without a password
        assert h.run(["true"]).ok
