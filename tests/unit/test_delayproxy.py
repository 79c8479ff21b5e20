"""The delay proxy the benchmarks and SSH tests put between client and sshd: it must delay, keep bytes
and order intact, pass half-closes through, and cut connections on demand. Loopback sockets only."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from vgpuvirt.testing.delayproxy import DelayProxy


@pytest.fixture()
def echo_server() -> Iterator[tuple[str, int]]:
    """Echoes every byte until EOF, then sends b"BYE" and closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def one(c: socket.socket) -> None:
        with c:
            while data := c.recv(65536):
                c.sendall(data)
            c.sendall(b"BYE")

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    host, port = srv.getsockname()[:2]
    yield str(host), int(port)
    srv.close()


def _connect(addr: tuple[str, int]) -> socket.socket:
    s = socket.create_connection(addr, timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        assert chunk, "connection closed early"
        got += chunk
    return got


def _read_to_eof(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(1 << 20):
        out += chunk
    return bytes(out)


def test_each_exchange_is_delayed_by_the_rtt(echo_server: tuple[str, int]) -> None:
    with DelayProxy(echo_server, rtt_ms=40) as proxy, _connect(proxy.address) as s:
        for i in range(5):
            msg = f"ping {i}".encode()
            t = time.monotonic()
            s.sendall(msg)
            assert _recv_exactly(s, len(msg)) == msg
            assert time.monotonic() - t >= 0.040 - 0.002   # half the RTT each way (timer slack: 2 ms)


def test_half_close_passes_through_both_ways(echo_server: tuple[str, int]) -> None:
    with DelayProxy(echo_server, rtt_ms=2) as proxy, _connect(proxy.address) as s:
        s.sendall(b"abc")
        s.shutdown(socket.SHUT_WR)            # the server sees EOF, answers, then closes
        assert _read_to_eof(s) == b"abcBYE"


def test_bulk_data_arrives_intact_and_in_order(echo_server: tuple[str, int]) -> None:
    data = os.urandom(8 << 20)
    with DelayProxy(echo_server, rtt_ms=5) as proxy, _connect(proxy.address) as s:
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(_read_to_eof(s)))
        reader.start()
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        reader.join(60)
        assert got == [data + b"BYE"]


def test_drop_all_cuts_open_connections_and_new_ones_work(echo_server: tuple[str, int]) -> None:
    with DelayProxy(echo_server, rtt_ms=2) as proxy:
        with _connect(proxy.address) as s:
            s.sendall(b"x")
            assert _recv_exactly(s, 1) == b"x"
            proxy.drop_all()
            try:
                assert s.recv(10) == b""      # closed by the proxy (the echo server never closes first)
            except ConnectionResetError:
                pass
        with _connect(proxy.address) as s2:
            s2.sendall(b"y")
            s2.shutdown(socket.SHUT_WR)
            assert _read_to_eof(s2) == b"yBYE"
        assert proxy.connections == 2


def test_unreachable_target_closes_the_client_and_the_proxy_stays_up() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))           # bound, never listening: connections are refused
    target = closed.getsockname()[:2]
    try:
        with DelayProxy((str(target[0]), int(target[1])), rtt_ms=2) as proxy:
            for _ in range(2):
                with _connect(proxy.address) as s:
                    try:
                        assert s.recv(10) == b""
                    except ConnectionResetError:
                        pass
            assert proxy.connections == 2
    finally:
        closed.close()


def test_lifetime_ends_the_proxy(echo_server: tuple[str, int]) -> None:
    proxy = DelayProxy(echo_server, rtt_ms=2, lifetime=0.2).start()
    s = _connect(proxy.address)
    proxy.wait()                              # returns once the lifetime is over
    with s:
        try:
            assert s.recv(10) == b""          # open connections are cut at the end
        except ConnectionResetError:
            pass
    with pytest.raises(OSError):
        _connect(proxy.address).close()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        DelayProxy(("127.0.0.1", 1), rtt_ms=-1)
    with pytest.raises(ValueError):
        DelayProxy(("127.0.0.1", 1), rtt_ms=1, lifetime=0)
