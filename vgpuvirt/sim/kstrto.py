"""The kernel's integer/bool parsers (lib/kstrtox.c), so simulated stores fail exactly like real ones.

Each raises ``OSError(EINVAL)`` for malformed text and ``OSError(ERANGE)`` for overflow; one
trailing newline is accepted, nothing else.
"""

from __future__ import annotations

import errno
import os


def oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _strip_nl(s: str) -> str:
    return s[:-1] if s.endswith("\n") else s


def kstrtoull(text: str, base: int = 0) -> int:
    s = text
    if s.startswith("+"):
        s = s[1:]
    s = _strip_nl(s)
    if base == 0:
        if s[:2].lower() == "0x" and len(s) > 2:
            base, s = 16, s[2:]
        elif s.startswith("0") and len(s) > 1:
            base, s = 8, s[1:]
        else:
            base = 10
    elif base == 16 and s[:2].lower() == "0x":
        s = s[2:]
    if not s or not all(c in "0123456789abcdefABCDEF"[: base if base <= 10 else 10 + (base - 10) * 2] for c in s):
        raise oserror(errno.EINVAL)
    value = int(s, base)
    if value >= 1 << 64:
        raise oserror(errno.ERANGE)
    return value


def kstrtoul(text: str, base: int = 0) -> int:
    return kstrtoull(text, base)


def kstrtol(text: str, base: int = 0) -> int:
    if text.startswith("-"):
        value = kstrtoull(text[1:], base)
        if value > 1 << 63:
            raise oserror(errno.ERANGE)
        return -value
    value = kstrtoull(text, base)
    if value >= 1 << 63:
        raise oserror(errno.ERANGE)
    return value


def kstrtoint(text: str, base: int = 0) -> int:
    value = kstrtol(text, base)
    if not -(1 << 31) <= value < 1 << 31:
        raise oserror(errno.ERANGE)
    return value


def kstrtou16(text: str, base: int = 0) -> int:
    value = kstrtoull(text, base)
    if value > 0xFFFF:
        raise oserror(errno.ERANGE)
    return value


def kstrtobool(text: str) -> bool:
    s = text[:2].lower()
    if s[:1] in ("y", "1", "t"):
        return True
    if s[:1] in ("n", "0", "f"):
        return False
    if s == "on":
        return True
    if s == "of":
        return False
    raise oserror(errno.EINVAL)


def sysfs_streq(value: str) -> str:
    """A name written to bind/unbind/drivers_probe: the kernel ignores one trailing newline."""
    return _strip_nl(value)
