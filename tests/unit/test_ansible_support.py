"""vgpuvirt.ansible_support.run_module: what it closes, and what a failure reports (no ansible needed)."""

from __future__ import annotations

import platform
from typing import Any, NoReturn

import pytest

from vgpuvirt.ansible_support import open_local_host, run_module
from vgpuvirt.errors import DeviceBusy, MissingDependency, NotAssignable, ProvisioningError


class FakeModule:
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.exited: dict[str, Any] | None = None

    def fail_json(self, msg: str, **kwargs: Any) -> NoReturn:
        self.exited = dict(failed=True, msg=msg, **kwargs)
        raise SystemExit(1)

    def exit_json(self, **kwargs: Any) -> NoReturn:
        self.exited = kwargs
        raise SystemExit(0)


class Closable:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def close(self) -> None:
        self.log.append(f"close {self.name}")


def missing_required_lib(library: str, reason: str | None = None) -> str:
    return f"missing {library} ({reason})"


def call(run: Any, *, with_libvirt: bool = False, fail_libvirt: bool = False,
         **kw: Any) -> tuple[dict[str, Any], list[str]]:
    log: list[str] = []
    module = FakeModule()

    def open_libvirt(m: Any) -> Any:
        if fail_libvirt:
            raise MissingDependency("libvirt", "libvirt", "talking to libvirt")
        return Closable("conn", log)

    if with_libvirt or fail_libvirt:
        kw["open_libvirt"] = open_libvirt
    with pytest.raises(SystemExit):
        run_module(module, missing_required_lib, lambda m: Closable("host", log), run, **kw)  # type: ignore[arg-type,return-value]
    assert module.exited is not None
    return module.exited, log


def test_result_is_exited_and_the_connection_closes_before_the_host() -> None:
    res, log = call(lambda m, h, c: dict(changed=True, saw=[h.name, c.name]), with_libvirt=True)
    assert res == dict(changed=True, saw=["host", "conn"])
    assert log == ["close conn", "close host"]


def test_host_is_closed_when_libvirt_cannot_be_opened() -> None:
    res, log = call(lambda m, h, c: {}, fail_libvirt=True)
    assert res["failed"] is True and res["msg"].startswith("missing libvirt (talking to libvirt needs")
    assert "exception" in res
    assert log == ["close host"]


def test_a_vgpuvirt_error_reports_its_class_and_carried_data_only_when_asked() -> None:
    def refuse(m: Any, h: Any) -> Any:
        raise NotAssignable("hv1", "0000:01:00.0", ["group 5 not viable"], report=None)

    res, log = call(refuse)
    assert res == dict(failed=True, msg="hv1: 0000:01:00.0: not assignable: group 5 not viable", error="NotAssignable")
    assert log == ["close host"]
    res, _ = call(refuse, carried=(NotAssignable,))
    assert res["assignable"] is False and res["report"] is None


def test_provisioning_error_carries_its_steps() -> None:
    def fail(m: Any, h: Any) -> Any:
        raise ProvisioningError("start failed", completed=["define domain d"], rollback=["undefine domain d"])

    res, _ = call(fail, carried=(ProvisioningError,))
    assert res["error"] == "ProvisioningError"
    assert res["completed"] == ["define domain d"] and res["rollback"] == ["undefine domain d"]
    res, _ = call(lambda m, h: (_ for _ in ()).throw(DeviceBusy("hv1", "x", "in use")), carried=(ProvisioningError,))
    assert set(res) == {"failed", "msg", "error"} and res["error"] == "DeviceBusy"


def test_open_local_host_names_the_host_only_for_modules_with_host_name(tmp_path: Any) -> None:
    assert open_local_host(FakeModule(sysfs_root=str(tmp_path))).name == "local"
    named = open_local_host(FakeModule(sysfs_root=str(tmp_path), host_name="hv7"))
    assert named.name == "hv7" and named.sysfs_root == str(tmp_path)
    assert open_local_host(FakeModule(sysfs_root=str(tmp_path), host_name=None)).name == (platform.node() or "local")
