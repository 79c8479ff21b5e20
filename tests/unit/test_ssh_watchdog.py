"""The exec watchdog of SSHHost closes a channel whose exec request got no answer, from a timer thread."""

from __future__ import annotations

import paramiko
import pytest

from vgpuvirt.host.ssh import _close_quietly


class _DeadLink:
    """A transport whose socket is gone: sending anything fails as paramiko's packetizer does."""

    def _send_user_message(self, data: object) -> None:
        raise EOFError()


def test_the_watchdog_closes_a_channel_on_a_dead_link_without_raising() -> None:
    chan = paramiko.Channel(7)
    chan.transport = _DeadLink()   # type: ignore[assignment]
    chan.active = True
    with pytest.raises(EOFError):   # what paramiko's close does there, in the timer's thread (a traceback)
        paramiko.Channel.close(chan)
    chan = paramiko.Channel(8)
    chan.transport = _DeadLink()   # type: ignore[assignment]
    chan.active = True
    _close_quietly(chan)
    # closed before the failed send: the exec request waiting on it wakes, and reports the link
    assert chan.closed
