"""How one libvirt call is run: transient errors retried (an injectable tenacity policy), and a time bound.

The bound (issue 28): libvirt-python's calls block until the daemon answers, and a
daemon or a link that stops answering would hold the caller for ever (``qemu+libssh://`` did, in
``virDomainGetXMLDesc``). libvirt cannot cancel a call, so the call runs in a daemon thread and the caller stops
waiting after the bound: the thread is left behind (it ends when the link does, and never holds the process at
exit), and the connection that hung is given up by its owner (:class:`vgpuvirt.libvirt_conn.LibvirtConnection`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection
from typing import Any, TypeVar
from urllib.parse import urlsplit

import tenacity

from vgpuvirt.errors import InvalidSpec, LibvirtError
from vgpuvirt.libvirt_uri import display_uri

T = TypeVar("T")
RetryFactory = Callable[[], tenacity.Retrying]

# libvirt's virErrorNumber for "cannot acquire state change lock" and the like: the only code retried
VIR_ERR_OPERATION_TIMEOUT = 68
TRANSIENT_CODES: frozenset[int] = frozenset({VIR_ERR_OPERATION_TIMEOUT})

#: Seconds one libvirt call may take before it is given up (env ``VGPUVIRT_LIBVIRT_TIMEOUT`` overrides).
#: Generous: starting a VM with hugepages, or the first connection to a daemon probing QEMU, takes seconds.
DEFAULT_TIMEOUT_S = 60.0


def retry_transient(codes: Collection[int] = TRANSIENT_CODES, attempts: int = 4,
                    max_wait: float = 2.0) -> RetryFactory:
    """A retry policy that retries only LibvirtErrors whose code is in ``codes``."""
    def factory() -> tenacity.Retrying:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, LibvirtError) and e.code in codes),
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=0.25, max=max_wait),
            reraise=True,
        )
    return factory


def no_retry() -> tenacity.Retrying:
    return tenacity.Retrying(stop=tenacity.stop_after_attempt(1), reraise=True)


default_retry: RetryFactory = retry_transient()


class LibvirtTimeout(LibvirtError):
    """A libvirt call got no answer within its bound (never retried: it would hang again)."""


def translate(exc: Any, uri: str, domain: str | None, what: str) -> LibvirtError:
    """A libvirtError as a :class:`LibvirtError` naming what failed, where, and libvirt's code."""
    code = exc.get_error_code() if hasattr(exc, "get_error_code") else None
    msg = exc.get_error_message() if hasattr(exc, "get_error_message") else None
    return LibvirtError(f"{what} failed on {uri}: {msg or exc} (libvirt error {code})",
                        domain=domain, code=code, uri=uri)


def undecodable(uri: str, domain: str | None, what: str) -> LibvirtError:
    # libvirt-python raises SystemError ("returned a result with an exception set") when libvirt's own
    # error text is not UTF-8, e.g. for a URI with a percent-escaped byte such as test:///%80
    return LibvirtError(f"{what} failed on {uri}: libvirt's error message is not UTF-8 text",
                        domain=domain, uri=uri)


def default_timeout() -> float:
    """The bound in seconds: ``VGPUVIRT_LIBVIRT_TIMEOUT`` when set (a number above 0), else 60."""
    raw = os.environ.get("VGPUVIRT_LIBVIRT_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:          # also refuses nan
        raise InvalidSpec("VGPUVIRT_LIBVIRT_TIMEOUT", raw, "a number of seconds above 0")
    return value


def where(uri: str) -> str:
    """The host a URI reaches (``this machine`` for a local one), with its port."""
    parts = urlsplit(uri)
    if not parts.hostname:
        return "this machine"
    return parts.hostname + (f":{parts.port}" if parts.port else "")


def bounded_call(fn: Callable[[], T], timeout: float, uri: str, what: str, domain: str | None = None) -> T:
    """``fn()``'s result or exception, or :class:`LibvirtTimeout` when it has not returned after ``timeout``."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:    # handed to the caller's thread and raised there
            box.append((False, exc))

    worker = threading.Thread(target=run, name=f"libvirt {what}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not box:
        of = f" of {domain}" if domain else ""
        raise LibvirtTimeout(f"libvirt {display_uri(uri)}: {what}{of} got no answer in {timeout:g} s: libvirt on "
                             f"{where(uri)} stopped answering (check libvirtd there; VGPUVIRT_LIBVIRT_TIMEOUT=SECONDS "
                             "waits longer)", domain=domain, uri=uri)
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
