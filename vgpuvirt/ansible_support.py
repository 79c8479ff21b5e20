"""What the modules of the Ansible collection vgpuvirt.kvm_gpu share on the library side: opening the target and
libvirt, and main()'s way of running a task and reporting its failure (the collection's module_utils hold the
Ansible side: the guarded import of vgpuvirt and the argument spec of a GPU request).

It lives in the package because the modules need vgpuvirt on the target anyway (AnsiballZ ships
only the module file). It never imports ansible: a module passes in its AnsibleModule and
``missing_required_lib``, so vgpuvirt keeps no dependency on ansible-core.
"""

from __future__ import annotations

import contextlib
import platform
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from vgpuvirt.errors import MissingDependency, NotAssignable, ProvisioningError, VgpuvirtError
from vgpuvirt.host.local import LocalHost

if TYPE_CHECKING:  # pragma: no cover
    from vgpuvirt.host.base import Host
    from vgpuvirt.libvirt_conn import LibvirtConnection


class AnsibleModuleLike(Protocol):
    """The part of ansible's AnsibleModule used here."""

    params: dict[str, Any]

    def fail_json(self, msg: str, **kwargs: Any) -> NoReturn: ...

    def exit_json(self, **kwargs: Any) -> NoReturn: ...


def open_local_host(module: AnsibleModuleLike) -> LocalHost:
    """The target itself, below the ``sysfs_root`` option. A module with a ``host_name`` option names
    the host by it (default: the target's hostname); one without (vgpu_info) keeps LocalHost's ``local``."""
    p = module.params
    if "host_name" not in p:
        return LocalHost(p["sysfs_root"])
    return LocalHost(p["sysfs_root"], name=p["host_name"] or platform.node() or "local")


def open_libvirt(module: AnsibleModuleLike) -> LibvirtConnection:
    """A connection to the ``uri`` option (imported late: libvirt is an extra)."""
    from vgpuvirt.libvirt_conn import LibvirtConnection

    return LibvirtConnection(module.params["uri"])


def domain_pairs(uri: str) -> list[tuple[str, str]]:
    """(name, xml) of every libvirt domain at ``uri``, for telling used devices from orphans."""
    from vgpuvirt.libvirt_conn import LibvirtConnection

    with LibvirtConnection(uri, readonly=True) as conn:
        return list(conn.domain_xml_pairs())


def _carried(exc: VgpuvirtError) -> dict[str, Any]:
    """The data an error carries, as failure fields (NotAssignable's report, ProvisioningError's steps)."""
    if isinstance(exc, NotAssignable):
        return dict(assignable=False, report=exc.report.to_dict() if hasattr(exc.report, "to_dict") else None)
    if isinstance(exc, ProvisioningError):
        return dict(completed=exc.completed, rollback=exc.rollback)
    return {}


def run_module(
    module: AnsibleModuleLike,
    missing_required_lib: Callable[..., str],
    open_host: Callable[[Any], Host],
    run: Callable[..., dict[str, Any]],
    *,
    open_libvirt: Callable[[Any], LibvirtConnection] | None = None,
    carried: tuple[type[VgpuvirtError], ...] = (),
) -> NoReturn:
    """Open the host (and, given ``open_libvirt``, a libvirt connection), call ``run(module, host[, conn])``,
    close them and exit with its result.

    The openers are arguments, not imports, so a module's own ``open_host``/``open_libvirt`` (which unit tests
    replace) are used. A failure exits with ``msg`` and ``error`` (the exception class); a missing extra in
    Ansible's missing_required_lib words; errors of the ``carried`` types add the data they carry.
    """
    try:
        with contextlib.ExitStack() as opened:  # closes the connection, then the host
            host = open_host(module)
            opened.callback(host.close)
            if open_libvirt is None:
                result = run(module, host)
            else:
                conn = open_libvirt(module)
                opened.callback(conn.close)
                result = run(module, host, conn)
    except MissingDependency as exc:
        module.fail_json(msg=missing_required_lib(exc.module, reason=str(exc)), exception=traceback.format_exc())
    except VgpuvirtError as exc:
        extra = _carried(exc) if isinstance(exc, carried) else {}
        module.fail_json(msg=str(exc), error=type(exc).__name__, **extra)
    module.exit_json(**result)
