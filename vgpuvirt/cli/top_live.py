"""``vgpuvirt top``'s live loop: a full-screen rich view refreshed every ``interval`` seconds; ``q`` or Ctrl-C
quits and the terminal is given back as it was (cbreak mode undone, the alternate screen left)."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live

from vgpuvirt.cli.top_view import frame
from vgpuvirt.observe.exporter import ParallelScraper


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """stdin in cbreak mode (keys arrive one by one, unechoed) while the view runs; restored on any exit."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios
    import tty
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int | None, wait: float) -> bool:
    """Wait up to ``wait`` seconds for a key; True for q/Q."""
    if fd is None:
        time.sleep(wait)
        return False
    end = time.monotonic() + wait
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 1) in (b"q", b"Q"):
            return True
    return False


def view(scraper: ParallelScraper, *, interval: float, once: bool = False, console: Console | None = None) -> None:
    """Show the hosts of ``scraper`` until q or Ctrl-C (``once``: print one frame and return)."""
    console = console or Console(highlight=False)
    if once:
        console.print(frame(scraper.scrape()))
        return
    try:
        with _keys() as fd, Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                live.update(frame(scraper.scrape(), interval=interval), refresh=True)
                if _quit_pressed(fd, interval):
                    break
    except KeyboardInterrupt:
        pass               # Ctrl-C is the other way out: both context managers have restored the terminal
