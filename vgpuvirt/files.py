"""Reading the files a user names (layouts, records, domain XML, fault files): one door, hostile input refused.

A file the CLI reads may be anything the user (or whoever wrote it) points at: ``/dev/zero`` (read until memory
runs out), a FIFO (waits forever for a writer), a 20 MiB file, a binary, a document nested 100,000 deep. Each
is refused here with one line, before any parser sees it: only a regular file, at most ``max_bytes``, UTF-8
text without NUL bytes. Stdlib only, so every layer may use it.
"""

from __future__ import annotations

import os
import stat

from vgpuvirt.errors import InvalidSpec

#: a layout, record or fault file is a few KiB; ten thousand GPUs' layout is well below this
MAX_BYTES = 4 << 20


def read_bytes(path: str, what: str, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The file's bytes: a regular file (opened without waiting: a FIFO is refused, not waited on) of at most
    ``max_bytes``; InvalidSpec naming ``what`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidSpec(what, path, f"a readable file ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidSpec(what, path, "a regular file (not a device, FIFO, socket or directory)")
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise InvalidSpec(what, path, f"a readable file ({exc.strerror})") from None
    finally:
        os.close(fd)
    if got > max_bytes:
        raise InvalidSpec(what, path, f"a file of at most {max_bytes} bytes")
    return b"".join(chunks)


def read_text(path: str, what: str, *, max_bytes: int = MAX_BYTES) -> str:
    """The file as text: :func:`read_bytes`, then UTF-8 without NUL bytes (YAML and JSON have no use for them, and
    a NUL is how a binary file shows)."""
    data = read_bytes(path, what, max_bytes=max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec(what, path, f"UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise InvalidSpec(what, path, f"text without NUL bytes (one at byte {nul})")
    return text
