"""A TCP proxy that adds latency: a WAN link on loopback (this kernel has no ``tc netem``).

Every chunk read from one side is forwarded to the other ``rtt_ms / 2`` later, in both directions,
so a request/response exchange costs ``rtt_ms`` more while bandwidth is not throttled (chunks are
queued with their due time, not delayed one after the other). The proxy always ends: after
``lifetime`` seconds, on :meth:`DelayProxy.stop`, or at exit of its ``with`` block.

In-process::

    with DelayProxy(("127.0.0.1", 2222), rtt_ms=25) as proxy:
        host = SSHHost(*proxy.address, ...)

Standalone: ``python -m vgpuvirt.testing.delayproxy --target 127.0.0.1:2222 --rtt-ms 25``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
import time
from types import TracebackType


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
        self._writers: set[asyncio.StreamWriter] = set()
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
                for w in list(self._writers):
                    w.transport.abort()
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

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.listen[0], self.listen[1])
        host, port = server.sockets[0].getsockname()[:2]
        self._address = (str(host), int(port))
        ready.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.lifetime)
        server.close()
        for w in list(self._writers):
            w.transport.abort()
        # aborted connections end their handlers by themselves (EOF); cancel only what is left
        pending = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        if pending:
            _, left = await asyncio.wait(pending, timeout=2)
            for t in left:
                t.cancel()

    # -- one proxied connection -------------------------------------------------------------
    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        pair = (client_w, server_w)
        for w in pair:
            self._writers.add(w)
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w),
                                 return_exceptions=True)
        finally:
            for w in pair:
                self._writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def receive() -> None:
            while True:
                try:
                    data = await reader.read(1 << 16)
                except OSError:
                    data = b""
                await queue.put((time.monotonic() + self._one_way, data))
                if not data:
                    return

        async def send() -> None:
            while True:
                due, data = await queue.get()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not data:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(receive(), send())


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
