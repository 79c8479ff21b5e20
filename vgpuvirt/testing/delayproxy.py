"""A TCP proxy that adds latency: a WAN link on loopback (this kernel has no ``tc netem``).

Every chunk read from one side is forwarded to the other ``rtt_ms / 2`` later, in both directions,
so a request/response exchange costs ``rtt_ms`` more while bandwidth is not throttled (chunks are
queued with their due time, not delayed one after the other). The proxy always ends: after
``lifetime`` seconds, on :meth:`DelayProxy.stop`, or at exit of its ``with`` block.

In-process::

    with DelayProxy(("127.0.0.1", 2222), rtt_ms=25) as proxy:
        host = SSHHost(*proxy.address, ...)

Standalone: ``python -m vgpuvirt.testing.delayproxy --target 127.0.0.1:2222 --rtt-ms 25``.

The proxy runs on one asyncio event loop with plain protocols and one timer per direction (no
streams, queues or tasks per chunk): benchmarks run it beside the hosts they time, on the same
cores, so what it costs is taken from what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType


class _Link:
    """One direction of a proxied connection: chunks leave for ``dest`` ``delay`` seconds after they came."""

    __slots__ = ("delay", "dest", "ended", "loop", "on_end", "pending", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, on_end: Callable[[], None]) -> None:
        self.loop = loop
        self.delay = delay
        self.dest: asyncio.Transport | None = None     # set once that side is connected
        self.pending: collections.deque[tuple[float, bytes]] = collections.deque()  # (due, data); b"" = EOF
        self.timer: asyncio.TimerHandle | None = None
        self.ended = False                              # EOF delivered (or the destination is gone)
        self.on_end = on_end

    def push(self, data: bytes) -> None:
        if self.ended:
            return
        self.pending.append((self.loop.time() + self.delay, data))
        self._arm()

    def attach(self, dest: asyncio.Transport) -> None:
        self.dest = dest
        self._arm()

    def _arm(self) -> None:
        if self.timer is None and self.pending and self.dest is not None:
            self.timer = self.loop.call_at(self.pending[0][0], self._flush)

    def _flush(self) -> None:
        self.timer = None
        dest = self.dest
        now = self.loop.time()
        while self.pending and self.pending[0][0] <= now and dest is not None:
            _, data = self.pending.popleft()
            if data:
                dest.write(data)
                continue
            with contextlib.suppress(OSError, RuntimeError, NotImplementedError):
                if not dest.is_closing() and dest.can_write_eof():
                    dest.write_eof()
            self.end()
            return
        self._arm()

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.pending.clear()
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.on_end()


class _Side(asyncio.Protocol):
    """One socket of a proxied pair: what it receives goes out through ``out`` (toward the peer)."""

    def __init__(self, conn: _Conn, out: _Link, into: _Link) -> None:
        self.conn = conn
        self.out = out          # data received here, delayed, to the peer
        self.into = into        # data for this side (its dest is this side's transport)
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn.proxy._transports.add(transport)
        self.into.attach(transport)

    def data_received(self, data: bytes) -> None:
        self.out.push(data)

    def eof_received(self) -> bool:
        self.out.push(b"")
        return True             # keep the other direction open (half-close), as TCP does

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.conn.proxy._transports.discard(self.transport)
        self.out.push(b"")      # a reset or a close reads as EOF on this side, as a read error did
        self.into.end()         # nothing more can be written here

    # The peer's kernel buffer is full: stop reading this side until it drains (bounded memory).
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.resume_reading()


class _Conn:
    """A client connection and its upstream: closed once both directions have ended."""

    def __init__(self, proxy: DelayProxy) -> None:
        loop = asyncio.get_running_loop()
        self.proxy = proxy
        up = _Link(loop, proxy._one_way, self._ended)     # client -> target
        down = _Link(loop, proxy._one_way, self._ended)   # target -> client
        self.client = _Side(self, out=up, into=down)
        self.server = _Side(self, out=down, into=up)
        self.client.peer, self.server.peer = self.server, self.client
        self.links = (up, down)

    def _ended(self) -> None:
        if all(link.ended for link in self.links):
            for side in (self.client, self.server):
                if side.transport is not None:
                    side.transport.close()

    async def connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: self.server, *self.proxy.target)
        except OSError:
            if self.client.transport is not None:
                self.client.transport.abort()
            for link in self.links:
                link.end()


class DelayProxy:
    def __init__(self, target: tuple[str, int], *, rtt_ms: float, listen: tuple[str, int] = ("127.0.0.1", 0),
                 lifetime: float = 600.0) -> None:
        if rtt_ms < 0 or lifetime <= 0:
            raise ValueError("rtt_ms must be >= 0 and lifetime > 0")
        self.target = target
        self.listen = listen
        self.rtt_ms = rtt_ms
        self.lifetime = lifetime
        self.connections = 0          # accepted so far
        self._one_way = rtt_ms / 2000.0
        self._address: tuple[str, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._transports: set[asyncio.Transport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) to connect to instead of the target."""
        if self._address is None:
            raise RuntimeError("the proxy is not started")
        return self._address

    # -- lifecycle (a private event loop in a daemon thread) ----------------------------------
    def start(self) -> DelayProxy:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="delayproxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if self._error is not None:
            raise self._error
        if self._address is None:
            raise RuntimeError("the delay proxy did not start")
        return self

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended by itself (lifetime)
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def wait(self) -> None:
        """Block until the proxy ends (its lifetime or :meth:`stop`)."""
        if self._thread is not None:
            self._thread.join()

    def drop_all(self) -> None:
        """Cut every open connection (RST) as a failing link would; the listener stays up."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            done = threading.Event()

            def abort() -> None:
                for t in list(self._transports):
                    t.abort()
                done.set()

            loop.call_soon_threadsafe(abort)
            done.wait(5)

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # reported to start()'s caller
            self._error = exc
        finally:
            ready.set()
            loop.close()

    def _accept(self) -> asyncio.Protocol:
        self.connections += 1
        conn = _Conn(self)
        task = asyncio.get_running_loop().create_task(conn.connect_upstream())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return conn.client

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(self._accept, self.listen[0], self.listen[1])
        host, port = server.sockets[0].getsockname()[:2]
        self._address = (str(host), int(port))
        ready.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.lifetime)
        server.close()
        for t in list(self._transports):
            t.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)      # let the aborts' connection_lost callbacks run


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vgpuvirt.testing.delayproxy", description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, type=_hostport, help="HOST:PORT to forward to")
    ap.add_argument("--listen", default="127.0.0.1:0", type=_hostport, help="HOST:PORT (port 0: any free port)")
    ap.add_argument("--rtt-ms", type=float, default=25.0, help="round-trip time added (half each way)")
    ap.add_argument("--lifetime", type=float, default=600.0, help="seconds before the proxy exits")
    a = ap.parse_args(argv)
    proxy = DelayProxy(a.target, rtt_ms=a.rtt_ms, listen=a.listen, lifetime=a.lifetime).start()
    host, port = proxy.address
    print(f"listening {host}:{port} -> {a.target[0]}:{a.target[1]}, +{a.rtt_ms} ms RTT, "
          f"for {a.lifetime} s", flush=True)
    try:
        proxy.wait()
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
