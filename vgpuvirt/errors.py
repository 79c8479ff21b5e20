"""The exception tree of vgpuvirt.

Every error the library raises on purpose is a :class:`VgpuvirtError`; the CLI prints its
``str()`` as a one-line reason and exits non-zero. Backend errors (OSError, paramiko,
libvirt, pynvml) are translated at the boundary with ``raise X(...) from exc``.

::

    VgpuvirtError
    ├── InvalidSpec (ValueError)          bad input, refused before anything reaches a host
    ├── MissingDependency (ImportError)   an optional extra is not installed
    ├── HostError                         something about one host (carries .host)
    │   ├── TransportError                connection refused/dropped/timed out (retryable)
    │   │   ├── HandshakeFailed           SSH set-up (banner, key exchange, auth) cut or timed out (retryable)
    │   │   ├── NotAnSshServer            the peer answered, but not as an SSH server (never retried)
    │   │   └── HostKeyError              unknown, changed or revoked SSH host key (never retried)
    │   ├── AuthenticationFailed          the SSH server refused every key offered (never retried)
    │   │   └── KeyFileRefused            a private key file unreadable or readable by group/others
    │   ├── RemoteRequirementMissing      e.g. no python3, no sudo or a sudo that wants a password
    │   ├── ReadOnlyHost                  a change asked of a read-only host (a capture replay)
    │   └── LockTimeout                   the host-side lock could not be taken in time
    ├── DeviceError                       about one device on one host (carries .host, .device)
    │   ├── DeviceNotFound
    │   ├── NoCapacity                    no instance of the type can be created there
    │   ├── AlreadyExists                 a UUID/VF type exists in a conflicting form
    │   ├── DeviceBusy                    in use (VFs enabled and used, a VM holds it): not changed
    │   ├── WriteFailed                   a sysfs write failed (carries .path, .errno, .strerror)
    │   └── NotAssignable                 IOMMU pre-flight refused (carries the report)
    ├── LibvirtError                      a libvirt call failed (carries .domain, .code)
    ├── XmlError                          domain XML rejected by the linter or the schema
    ├── RecordError                       a client-side record could not be written safely (.path, .errno)
    ├── ProvisioningError                 apply() failed (carries .completed and .rollback)
    └── PreflightFailed                   plan() found a VM's needs missing on its host (carries .problems)
"""

from __future__ import annotations

from typing import Any, ClassVar


class VgpuvirtError(Exception):
    """Base class of every error vgpuvirt raises on purpose."""


class InvalidSpec(VgpuvirtError, ValueError):
    """A value given by the caller is malformed; nothing was attempted."""

    def __init__(self, what: str, value: object, expected: str) -> None:
        self.what = what
        self.value = value
        self.expected = expected
        if value is None:           # nothing was given: "invalid --connect None" reads as if "None" had been
            super().__init__(f"{what} not given: expected {expected}")
        else:
            super().__init__(f"invalid {what} {shown(value)}: expected {expected}")


#: how much of a bad value an error message echoes (a 20 MiB device name is not a message)
SHOWN_MAX = 200


def shown(value: object) -> str:
    """A value as a message shows it: a string quoted and cut to :data:`SHOWN_MAX` characters with the full
    length said, a list as its items (never Python's ``['a', 'b']``), a long list summarised."""
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [shown(v) for v in (sorted(value, key=str) if isinstance(value, (set, frozenset)) else value)]
        return name_list(items, "values") if items else "(none)"
    if isinstance(value, dict):
        return name_list([f"{shown(k)}: {shown(v)}" for k, v in value.items()], "entries") if value else "(none)"
    text = repr(value)
    return text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX - 40]}...({len(text)} characters)"


class MissingDependency(VgpuvirtError, ImportError):
    """An optional dependency is missing; the message names the extra that provides it."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{feature} needs the Python module {module!r}: pip install 'vgpuvirt[{extra}]'"
        )


class HostError(VgpuvirtError):
    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"{host}: {message}")


class TransportError(HostError):
    """The connection to the host failed or dropped. Idempotent operations retry it (``retryable``)."""

    #: whether trying again may help (a retry policy reads it; the subclasses that cannot change say False)
    retryable: ClassVar[bool] = True


class HandshakeFailed(TransportError):
    """The SSH set-up was cut or timed out before the session was ready (banner, key exchange, auth)."""


class NotAnSshServer(TransportError):
    """The peer answered, but not with an SSH banner (a web server, a wrong port). Never retried."""

    retryable = False


class HostKeyError(TransportError):
    """The SSH host key is unknown, revoked or does not match known_hosts. Never retried."""

    retryable = False


class AuthenticationFailed(HostError):
    """The SSH server refused every key offered. Never retried."""


class KeyFileRefused(AuthenticationFailed):
    """A private key file that cannot be read, or that group/others can read (refused, as OpenSSH does)."""


class RemoteRequirementMissing(HostError):
    pass


class ReadOnlyHost(HostError):
    """A change (write, mutating program, lock, audit) asked of a host that can only be read: a capture's replay."""


class LockTimeout(HostError):
    pass


class DeviceError(VgpuvirtError):
    def __init__(self, host: str, device: str, message: str) -> None:
        self.host = host
        self.device = device
        super().__init__(f"{host}: {device}: {message}")


class DeviceNotFound(DeviceError):
    pass


class NoCapacity(DeviceError):
    """Not enough room. ``fit`` of ``wanted`` (when counted): how many of the asked-for VMs or vGPUs fit."""

    def __init__(self, host: str, device: str, message: str, *, fit: int | None = None,
                 wanted: int | None = None) -> None:
        self.fit = fit
        self.wanted = wanted
        super().__init__(host, device, message)

    def to_dict(self) -> dict[str, object]:
        return {"error": "no-capacity", "host": self.host, "device": self.device, "fit": self.fit,
                "wanted": self.wanted, "message": str(self)}


class AlreadyExists(DeviceError):
    pass


class DeviceBusy(DeviceError):
    """The device is in use (by a VM, by its VFs, by the host) and was left as it was."""


class WriteFailed(DeviceError):
    def __init__(
        self, host: str, device: str, path: str, value: str, errno: int | None, strerror: str
    ) -> None:
        self.path = path
        self.value = value
        self.errno = errno
        self.strerror = strerror
        super().__init__(host, device, f"writing {value!r} to {path} failed: {strerror}")


class NotAssignable(DeviceError):
    def __init__(self, host: str, device: str, reasons: list[str], report: Any = None) -> None:
        self.reasons = reasons
        self.report = report
        super().__init__(host, device, "not assignable: " + "; ".join(reasons))


class LibvirtError(VgpuvirtError):
    def __init__(self, message: str, *, domain: str | None = None, code: int | None = None,
                 uri: str | None = None) -> None:
        self.domain = domain
        self.code = code
        self.uri = uri
        where = f"domain {domain!r}: " if domain else ""
        super().__init__(f"{where}{message}")


class XmlError(VgpuvirtError):
    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = problems or [message]
        super().__init__(message)


class RecordError(VgpuvirtError):
    """A record the client keeps (e.g. ``iommu prepare --record``) could not be written safely."""

    def __init__(self, path: str, errno: int | None, reason: str) -> None:
        self.path = path
        self.errno = errno
        self.reason = reason
        super().__init__(f"record {path}: {reason}")


class ProvisioningError(VgpuvirtError):
    """A plan failed part-way; ``completed`` lists the steps that had run, ``rollback`` what undo did."""

    def __init__(self, message: str, *, completed: list[str], rollback: list[str],
                 cause: BaseException | None = None) -> None:
        self.reason = message
        self.completed = completed
        self.rollback = rollback
        self.cause = cause
        done = ", ".join(completed) or "nothing"
        undone = ", ".join(rollback) or "nothing"
        super().__init__(f"{message} (completed: {done}; rolled back: {undone})")


class PreflightFailed(VgpuvirtError):
    """The plan's pre-flight found what a VM needs missing on its host (a network, a storage pool, a golden
    image, firmware, free hugepages, pinned CPUs); ``problems`` has one line each. Nothing was changed."""

    def __init__(self, problems: list[str], grouped: list[str] | None = None) -> None:
        self.problems = problems
        lines = grouped if grouped is not None else problems
        self.shown = "; ".join(lines[:8]) + (f"; and {len(lines) - 8} more" if len(lines) > 8 else "")
        super().__init__(f"pre-flight refused the plan, nothing was changed: {self.shown}")

    @classmethod
    def of(cls, found: list[tuple[str, str, str]]) -> PreflightFailed:
        """From (host, VM, problem) triples: one line per host and problem, naming the VMs that share it
        (eight desktops on one missing network are one line, not eight)."""
        vms: dict[tuple[str, str], list[str]] = {}
        for host, vm, problem in found:
            vms.setdefault((host, problem), []).append(vm)
        grouped = [f"{host}: {name_list(names, 'VMs')}: {problem}" for (host, problem), names in vms.items()]
        return cls([f"{h}: {v}: {p}" for h, v, p in found], grouped)


def name_list(names: list[str], noun: str = "items", *, show: int = 3) -> str:
    """``a, b, c`` for a few names; ``a, b, ... z (40 VMs)`` for many: an error line stays one readable line."""
    if len(names) <= show + 1:
        return ", ".join(names)
    return f"{', '.join(names[:show - 1])}, ... {names[-1]} ({len(names)} {noun})"
