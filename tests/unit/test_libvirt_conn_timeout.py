"""Every libvirt call is bounded in time (issue 28 item 1): a libvirt that stops answering is a one-line
LibvirtTimeout, not a hang, and the connection is given up afterwards."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from vgpuvirt.errors import InvalidSpec, LibvirtError
from vgpuvirt.libvirt_bound import LibvirtTimeout, default_timeout
from vgpuvirt.libvirt_conn import LibvirtConnection

libvirt = pytest.importorskip("libvirt")


class StuckConnection:
    """A virConnect whose calls block until released (a daemon that stopped answering)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def getType(self) -> str:
        return "QEMU"

    def listAllDomains(self, flags: int) -> list[Any]:
        self.calls += 1
        self.release.wait(30)
        return []


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = StuckConnection()
    monkeypatch.setattr(libvirt, "open", lambda uri: fake)
    yield fake
    fake.release.set()


def test_a_call_that_gets_no_answer_is_a_one_line_timeout(stuck: StuckConnection) -> None:
    conn = LibvirtConnection("qemu+ssh://root@gpu1:2222/system?keyfile=/k/id&command=/w", timeout=0.3)
    assert conn.driver == "qemu"
    t0 = time.monotonic()
    with pytest.raises(LibvirtTimeout) as info:
        conn.domains()
    assert time.monotonic() - t0 < 5
    msg = str(info.value)
    assert msg == ("libvirt qemu+ssh://root@gpu1:2222/system: list domains got no answer in 0.3 s: libvirt on "
                   "gpu1:2222 stopped answering (check libvirtd there; VGPUVIRT_LIBVIRT_TIMEOUT=SECONDS waits "
                   "longer)")
    assert isinstance(info.value, LibvirtError)
    with pytest.raises(LibvirtTimeout):        # given up: no second wait, no retry
        conn.domains()
    assert stuck.calls == 1
    conn.close()                               # does not wait for the blocked call


def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VGPUVIRT_LIBVIRT_TIMEOUT", "2.5")
    assert default_timeout() == 2.5 and LibvirtConnection("qemu:///system").timeout == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("VGPUVIRT_LIBVIRT_TIMEOUT", bad)
        with pytest.raises(InvalidSpec, match="VGPUVIRT_LIBVIRT_TIMEOUT"):
            default_timeout()


def test_errors_raised_in_the_worker_thread_keep_libvirts_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # libvirt's error is thread-local: it must be read in the thread that made the call
    real = libvirt.open("test:///default")
    monkeypatch.setattr(libvirt, "open", lambda uri: real)
    conn = LibvirtConnection("qemu+ssh://gpu1/system", timeout=5)
    with pytest.raises(LibvirtError) as info:
        conn.xml("no-such-domain-w28a")
    assert info.value.code == 42 and "no-such-domain-w28a" in str(info.value)
    assert not conn.exists("no-such-domain-w28a")
    assert "test" in {d.name for d in conn.domains()}
    real.close()
