"""Reading the fields of a profile file: each check's error names the file, the key and the reason."""

from __future__ import annotations

import errno as _errno
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.sim.profile_spec import ProfileError


class ProfileContext:
    """Where we are in the file, so every error names the key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, reason: str) -> ProfileError:
        return ProfileError(self.file, key, reason)

    def mapping(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        return value

    def integer(self, value: Any, key: str, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self.fail(key, f"expected an integer, got {value!r}")
        try:
            n = value if isinstance(value, int) else int(value, 0)
        except ValueError:
            raise self.fail(key, f"expected an integer, got {value!r}") from None
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise self.fail(key, f"{n} is out of range {lo}..{hi}")
        return n

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value or "\n" in value or "\0" in value:
            raise self.fail(key, f"expected a one-line string, got {value!r}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def addr(self, value: Any, key: str) -> PciAddress:
        try:
            return PciAddress.parse(self.text(value, key))
        except InvalidSpec as exc:
            raise self.fail(key, exc.expected) from None

    def keys(self, m: dict[str, Any], key: str, allowed: set[str], required: set[str] | None = None) -> None:
        for k in m:
            if k not in allowed:
                raise self.fail(f"{key}.{k}" if key else str(k),
                                "unknown key (allowed: " + ", ".join(sorted(allowed)) + ")")
        for k in sorted(required or ()):
            if k not in m:
                raise self.fail(f"{key}.{k}" if key else k, "required key is missing")


def errno_value(ctx: ProfileContext, value: Any, key: str) -> int:
    name = ctx.text(value, key)
    code = getattr(_errno, name, None)
    if not isinstance(code, int):
        raise ctx.fail(key, f"{name!r} is not an errno name (e.g. EINVAL, ENOSPC)")
    return code
