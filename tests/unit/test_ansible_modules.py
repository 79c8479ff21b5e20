"""The Ansible modules' logic, run in-process: main() with patched module args against a SimHost
(and libvirt's test driver), plus their documentation checked against their argument specs.

The modules are loaded by path from the collection's source (ansible_collections/vgpuvirt/kvm_gpu), with
its module_utils imported by their collection names, as AnsiballZ ships them. The host a module opens is
replaced by a simulated one (the module's ``open_host`` hook), so every call of one test sees the same
simulated kernel state.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import uuid as _uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import require_part

pytest.importorskip("ansible")
from ansible.module_utils.testing import patch_module_args

from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision.plan import mdev_uuid_for
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "ansible_collections" / "vgpuvirt" / "kvm_gpu"
LIBRARY = COLLECTION / "plugins" / "modules"
FQCN = "vgpuvirt.kvm_gpu"
MODULES = ("vgpu_info", "vgpu_mdev", "vgpu_passthrough", "vgpu_domain", "vgpu_pool", "vgpu_layout", "vgpu_host")
# the collection's own imports (ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils...) resolve from here
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def load(name: str) -> Any:
    """A fresh copy of the module file (hooks patched in one test never leak into another)."""
    spec = importlib.util.spec_from_file_location(f"ansible_lib_{name}_{_uuid.uuid4().hex}", LIBRARY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Runner:
    """Calls one module's main() the way AnsiballZ does, against one simulated host."""

    def __init__(self, name: str, host: Any, conn: LibvirtConnection | None = None) -> None:
        self.mod = load(name)
        self.host = host
        self.mod.open_host = lambda module: host
        if conn is not None:
            self.mod.open_libvirt = lambda module: conn

    def __call__(self, check: bool = False, diff: bool = True, **args: Any) -> dict[str, Any]:
        if check:
            args["_ansible_check_mode"] = True
        args["_ansible_diff"] = diff
        out = io.StringIO()
        with patch_module_args(args), contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            self.mod.main()
        result: dict[str, Any] = json.loads(out.getvalue())
        return result


class _SharedConn(LibvirtConnection):
    """test:///default forgets everything when its last connection closes: keep one open per test."""

    def close(self) -> None:
        pass

    def really_close(self) -> None:
        super().close()


@pytest.fixture
def conn() -> Any:
    pytest.importorskip("libvirt")
    c = _SharedConn("test:///default")
    # test:///default forgets its state only when the process's LAST connection to it closes; other tests
    # (tests/unit/xmlcheck.py) keep one open for the whole session, so start from the driver's own state:
    # nothing but its built-in domain "test", a foreign domain the modules must leave alone.
    _reset(c)
    yield c
    _reset(c)
    c.really_close()


def _reset(c: LibvirtConnection) -> None:
    for d in c.domains():
        if d.name != "test":
            c.destroy(d.name)
            c.undefine(d.name)


def sim(profile: str, name: str = "hv1") -> SimHost:
    h = SimHost.from_profile(profile, name=name)
    h.close = lambda: None  # type: ignore[method-assign]  # the modules close their host; the test keeps it
    return h


def mdevs(host: SimHost) -> dict[str, tuple[str | None, str | None]]:
    return {str(m.uuid): (m.parent, m.type) for m in inventory(host, use_nvml=False).mdevs}


def vf_types(host: SimHost) -> dict[str, int]:
    return {str(v.address): v.current_type for v in inventory(host, use_nvml=False).vendor_vgpu}


def drivers(host: SimHost) -> dict[str, str | None]:
    return {str(d.address): d.driver for d in inventory(host, use_nvml=False).pci_devices}


# ------------------------------------------------------------------------------------------ documentation


def _doc(name: str, tmp: Path) -> dict[str, Any]:
    exe = shutil.which("ansible-doc", path=str(Path(sys.executable).parent)) or shutil.which("ansible-doc")
    require_part("ansible-doc", exe is not None, "installed with ansible-core (the dev extra)")
    assert exe is not None
    out = subprocess.run([exe, "--json", f"{FQCN}.{name}"], capture_output=True, text=True, check=True,
                         env=doc_env(tmp))
    doc: dict[str, Any] = json.loads(out.stdout)[f"{FQCN}.{name}"]
    return doc


def doc_env(tmp: Path) -> dict[str, str]:
    """ansible-doc reading the collection from this checkout, writing nothing outside ``tmp``."""
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO), ANSIBLE_HOME=str(tmp / "home"),
                ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"))


def _compare_options(documented: dict[str, Any], spec: dict[str, Any], where: str) -> None:
    assert set(documented) == set(spec), f"{where}: documented {sorted(documented)} != spec {sorted(spec)}"
    for opt, s in spec.items():
        d = documented[opt]
        assert d.get("type", "str") == s.get("type", "str"), f"{where}.{opt}: type"
        assert d.get("default") == s.get("default"), f"{where}.{opt}: default"
        assert bool(d.get("required", False)) == bool(s.get("required", False)), f"{where}.{opt}: required"
        assert d.get("choices") == s.get("choices"), f"{where}.{opt}: choices"
        assert d.get("elements") == s.get("elements"), f"{where}.{opt}: elements"
        assert d.get("description"), f"{where}.{opt}: no description"
        if "options" in s:
            _compare_options(d.get("suboptions", {}), s["options"], f"{where}.{opt}")


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders_and_matches_the_argument_spec(name: str, tmp_path: Path) -> None:
    doc = _doc(name, tmp_path)
    assert doc["doc"]["module"] == name
    assert doc["doc"]["short_description"]
    assert doc["examples"].strip() and doc["return"]
    _compare_options(doc["doc"]["options"], load(name).ARGUMENT_SPEC, name)
    assert doc["doc"]["attributes"]["check_mode"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_only_documented_options(name: str) -> None:
    mod = load(name)
    tasks = yaml.safe_load(mod.EXAMPLES)
    assert tasks, "no examples"
    assert not [t for t in tasks if name in t], "examples call modules by their FQCN"
    used = [t for t in tasks if f"{FQCN}.{name}" in t]
    assert used, f"no example task calls {FQCN}.{name}"
    for t in used:
        args = t[f"{FQCN}.{name}"] or {}
        unknown = set(args) - set(mod.ARGUMENT_SPEC)
        assert not unknown, f"example {t.get('name')!r} uses undocumented options {unknown}"
        for k, spec in mod.ARGUMENT_SPEC.items():
            if spec.get("required"):
                assert k in args, f"example {t.get('name')!r} lacks required option {k}"


def test_render_plain_text_for_humans(tmp_path: Path) -> None:
    exe = shutil.which("ansible-doc", path=str(Path(sys.executable).parent)) or shutil.which("ansible-doc")
    require_part("ansible-doc", exe is not None, "installed with ansible-core (the dev extra)")
    assert exe is not None
    out = subprocess.run([exe, f"{FQCN}.vgpu_mdev"], capture_output=True, text=True, check=True,
                         env=doc_env(tmp_path))
    assert "persistent" in out.stdout and "EXAMPLES" in out.stdout and "RETURN VALUES" in out.stdout


# ------------------------------------------------------------------------------------------ missing libraries


@pytest.mark.parametrize("name", MODULES)
def test_missing_vgpuvirt_fails_with_missing_required_lib(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the guard lives in the collection's module_utils, imported once: forget it too, so it runs again
    for mod in [m for m in sys.modules if m == "vgpuvirt" or m.startswith(("vgpuvirt.", "ansible_collections."))]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "vgpuvirt", None)  # import vgpuvirt -> ImportError
    mod = load(name)
    assert mod.HAS_VGPUVIRT is False
    args = {"vgpu_info": {}, "vgpu_mdev": {"name": "x"}, "vgpu_passthrough": {"addresses": ["0000:01:00.0"]},
            "vgpu_domain": {"name": "x"}, "vgpu_pool": {"name": "x"},
            "vgpu_layout": {"path": "/nonexistent.yaml"}, "vgpu_host": {"reason": "x"}}[name]
    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        mod.main()
    res = json.loads(out.getvalue())
    assert res["failed"] is True
    assert "Failed to import the required Python library (vgpuvirt)" in res["msg"]


def test_missing_libvirt_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from vgpuvirt.errors import MissingDependency

    run = Runner("vgpu_domain", sim("t4x2"))

    def no_libvirt(module: Any) -> Any:
        raise MissingDependency("libvirt", "libvirt", "talking to libvirt")

    run.mod.open_libvirt = no_libvirt
    res = run(name="desk", gpus=[{"type": "nvidia-231"}])
    assert res["failed"] is True
    assert "Failed to import the required Python library (libvirt)" in res["msg"]
    assert "vgpuvirt[libvirt]" in res["msg"]


# ------------------------------------------------------------------------------------------ vgpu_info


def test_info_returns_the_inventory_as_facts_and_never_changes() -> None:
    host = sim("t4x2")
    run = Runner("vgpu_info", host)
    for check in (True, False):
        res = run(check=check)
        assert res["changed"] is False
        facts = res["ansible_facts"]["vgpuvirt"]
        assert facts == json.loads(json.dumps(inventory(host, use_nvml=False).to_dict()))
        assert [p["address"] for p in facts["mdev_parents"]] == ["0000:3b:00.0", "0000:d8:00.0"]


def test_info_names_the_domain_using_each_mdev(conn: Any) -> None:
    host = sim("t4x2")
    Runner("vgpu_domain", host, conn)(name="desk-1", gpus=[{"type": "nvidia-231"}], uri="test:///default")
    info = Runner("vgpu_info", host)
    info.mod.domain_pairs = lambda uri: list(conn.domain_xml_pairs())
    facts = info(uri="test:///default")["ansible_facts"]["vgpuvirt"]
    assert [(m["uuid"], m["domain"]) for m in facts["mdevs"]] == [(str(mdev_uuid_for("desk-1", 0)), "desk-1")]


# ------------------------------------------------------------------------------------------ vgpu_mdev


def test_mdev_by_need_check_then_create_then_converge_then_remove() -> None:
    host = sim("t4x2")
    run = Runner("vgpu_mdev", host)
    u = str(mdev_uuid_for("desk-1", 0))
    args = {"name": "desk-1", "need": {"min_framebuffer_mib": 2048, "series": "Q"}}

    res = run(check=True, **args)
    assert res["changed"] is True and res["vgpu"]["uuid"] == u
    assert res["diff"]["before"]["state"] == "absent" and res["diff"]["after"]["state"] == "present"
    assert res["ops"], "check mode lists the writes it would do"
    assert mdevs(host) == {}, "check mode changed the host"

    res = run(**args)
    assert res["changed"] is True
    parent, type_id = res["vgpu"]["parent"], res["vgpu"]["type"]
    assert mdevs(host) == {u: (parent, type_id)}
    # the smallest Q type with >= 2048 MiB, computed here from the host's own type table
    types = {t.id: t for p in inventory(host, use_nvml=False).mdev_parents for t in p.types}
    fitting = [t for t in types.values() if t.name.endswith("Q") and (t.framebuffer_mib or 0) >= 2048]
    assert types[type_id].framebuffer_mib == min(t.framebuffer_mib or 0 for t in fitting)

    res = run(**args)
    assert res["changed"] is False and res["ops"] == []
    assert res["diff"]["before"] == res["diff"]["after"]
    assert mdevs(host) == {u: (parent, type_id)}

    res = run(check=True, name="desk-1", state="absent")
    assert res["changed"] is True and res["diff"]["before"]["state"] == "present"
    assert mdevs(host) == {u: (parent, type_id)}, "check mode removed the mdev"
    assert run(name="desk-1", state="absent")["changed"] is True
    assert mdevs(host) == {}
    assert run(name="desk-1", state="absent")["changed"] is False


def test_mdev_by_type_name_on_a_given_parent() -> None:
    host = sim("t4x2")
    run = Runner("vgpu_mdev", host)
    u = "e55bf865-6983-4d53-967f-51e8a3bb0f57"
    res = run(uuid=u, type="GRID T4-4Q", parent="d8:00.0")
    assert res["changed"] is True
    assert mdevs(host)[u][0] == "0000:d8:00.0"
    assert res["vgpu"]["type"] == mdevs(host)[u][1]
    assert run(uuid=u, type="GRID T4-4Q", parent="0000:d8:00.0")["changed"] is False
    # the existing device satisfies a request without type too: kept as it is
    assert run(uuid=u)["changed"] is False


def test_mdev_existing_uuid_of_another_type_is_refused_and_left_alone() -> None:
    host = sim("t4x2")
    run = Runner("vgpu_mdev", host)
    u = "e55bf865-6983-4d53-967f-51e8a3bb0f57"
    run(uuid=u, type="nvidia-231", parent="0000:3b:00.0")
    before = mdevs(host)
    res = run(uuid=u, type="GRID T4-8Q", parent="0000:3b:00.0")
    assert res["failed"] is True and res["error"] == "AlreadyExists"
    assert "different type" in res["msg"] and u in res["msg"]
    assert mdevs(host) == before


def test_mdev_no_capacity_is_a_clear_failure() -> None:
    host = sim("t4x2")
    run = Runner("vgpu_mdev", host)
    res = run(name="big", need={"min_framebuffer_mib": 10 ** 6})
    assert res["failed"] is True and res["error"] == "NoCapacity"
    assert mdevs(host) == {}


@pytest.mark.parametrize("args,fragment", [
    ({"uuid": "not-a-uuid; rm -rf /", "type": "nvidia-231"}, "invalid"),
    ({"name": "x", "parent": "0000:3b:00.0/../../..", "type": "nvidia-231"}, "invalid"),
    ({"name": "x", "uuid": "e55bf865-6983-4d53-967f-51e8a3bb0f57"}, "mutually exclusive"),
    ({"type": "nvidia-231"}, "one of the following is required"),
    ({"name": "x"}, "vGPU type or need"),
])
def test_mdev_bad_input_is_refused_before_anything_changes(args: dict[str, Any], fragment: str) -> None:
    host = sim("t4x2")
    res = Runner("vgpu_mdev", host)(**args)
    assert res["failed"] is True and fragment in res["msg"]
    assert mdevs(host) == {}


def test_mdev_vendor_vf_type_by_name_converges_and_resets() -> None:
    host = sim("l40s-vgpu17")
    run = Runner("vgpu_mdev", host)
    vf = "0000:3d:00.4"
    res = run(check=True, vf=vf, type="NVIDIA L40S-2Q")
    assert res["changed"] is True and vf_types(host)[vf] == 0
    res = run(vf=vf, type="NVIDIA L40S-2Q")
    assert res["changed"] is True and res["vgpu"]["kind"] == "vendor-vf"
    set_to = vf_types(host)[vf]
    assert set_to != 0 and res["vgpu"]["type"] == str(set_to)
    assert all(t == 0 for a, t in vf_types(host).items() if a != vf), "another VF was touched"
    again = run(vf=vf, type="NVIDIA L40S-2Q")
    assert again["changed"] is False and again["diff"]["before"] == again["diff"]["after"]
    assert run(vf=vf, state="absent")["changed"] is True
    assert vf_types(host)[vf] == 0
    assert run(vf=vf, state="absent")["changed"] is False


def test_mdev_persistent_without_mdevctl_says_so() -> None:
    host = sim("t4x2")
    res = Runner("vgpu_mdev", host)(name="p", type="nvidia-231", persistent=True)
    assert res["failed"] is True and "mdevctl" in res["msg"]
    assert mdevs(host) == {}


# ------------------------------------------------------------------------------------------ vgpu_passthrough


def test_passthrough_check_prepare_release_cycle() -> None:
    host = sim("desktop")
    run = Runner("vgpu_passthrough", host)
    devs = ["0000:01:00.0", "0000:01:00.1"]
    start = drivers(host)

    res = run(addresses=devs)
    assert res["changed"] is False and res["assignable"] is True
    assert {d["address"] for d in res["report"]["devices"]} == set(devs)

    res = run(check=True, addresses=devs, state="prepared")
    assert res["changed"] is True and set(res["diff"]["after"].values()) == {"vfio-pci"}
    assert drivers(host) == start, "check mode rebound a device"

    prep = run(addresses=devs, state="prepared")
    assert prep["changed"] is True
    now = drivers(host)
    assert {now[a] for a in devs} == {"vfio-pci"}
    assert {b["address"]: b["original_driver"] for b in prep["binding"]["bindings"]} == {a: start[a] for a in devs}
    assert run(addresses=devs, state="prepared")["changed"] is False

    res = run(check=True, addresses=devs, state="released", binding=prep["binding"])
    assert res["changed"] is True and drivers(host) == now
    res = run(addresses=devs, state="released", binding=prep["binding"])
    assert res["changed"] is True and res["diff"]["after"] == {a: start[a] for a in devs}
    assert drivers(host) == start
    assert run(addresses=devs, state="released", binding=prep["binding"])["changed"] is False


def test_passthrough_not_assignable_fails_with_the_report() -> None:
    host = sim("l40s-vgpu17")
    start = drivers(host)
    # a PF whose SR-IOV VFs are enabled cannot be passed through whole
    for state in ("checked", "prepared"):
        res = Runner("vgpu_passthrough", host)(addresses=["0000:3d:00.0"], state=state)
        assert res["failed"] is True and res["assignable"] is False and res["error"] == "NotAssignable"
        assert res["report"]["reasons"], "the failure carries the report's reasons"
        assert all(r in res["msg"] for r in res["report"]["reasons"])
    assert drivers(host) == start


def test_passthrough_companion_function_is_reported_and_bound_along() -> None:
    host = sim("desktop")
    res = Runner("vgpu_passthrough", host)(addresses=["0000:01:00.0"])
    assert res["assignable"] is True
    assert res["report"]["devices"][0]["must_include"] == ["0000:01:00.1"]
    prep = Runner("vgpu_passthrough", host)(addresses=["0000:01:00.0"], state="prepared")
    assert {b["address"] for b in prep["binding"]["bindings"]} == {"0000:01:00.0", "0000:01:00.1"}
    assert {drivers(host)[a] for a in ("0000:01:00.0", "0000:01:00.1")} == {"vfio-pci"}


# ------------------------------------------------------------------------------------------ vgpu_domain


@pytest.mark.parametrize("profile,gpu", [
    ("t4x2", {"min_framebuffer_mib": 2048, "series": "Q"}),
    ("l40s-vgpu17", {"type": "NVIDIA L40S-2Q"}),
])
def test_domain_check_run_converge_stop_absent(conn: Any, profile: str, gpu: dict[str, Any]) -> None:
    host = sim(profile)
    run = Runner("vgpu_domain", host, conn)
    args = {"name": "desk-1", "gpus": [gpu], "uri": "test:///default", "memory_mib": 1024}
    names0 = {d.name for d in conn.domains()}
    mdevs0, vfs0 = mdevs(host), vf_types(host)

    res = run(check=True, **args)
    assert res["changed"] is True and any(s.startswith("define domain") for s in res["plan"])
    assert res["diff"]["before"]["state"] == "absent" and res["diff"]["after"]["state"] == "running"
    assert {d.name for d in conn.domains()} == names0 and mdevs(host) == mdevs0 and vf_types(host) == vfs0

    res = run(**args)
    assert res["changed"] is True
    assert conn.is_active("desk-1")
    assert (mdevs(host), vf_types(host)) != (mdevs0, vfs0), "no vGPU was created"
    made = res["domain"]["gpus"]

    res = run(**args)
    assert res["changed"] is False and res["plan"] == []
    assert res["diff"]["before"] == res["diff"]["after"] and res["domain"]["gpus"] == made
    assert run(check=True, **args)["changed"] is False

    res = run(name="desk-1", state="stopped", uri="test:///default")
    assert res["changed"] is True and not conn.is_active("desk-1")
    assert run(name="desk-1", state="stopped", uri="test:///default")["changed"] is False

    res = run(check=True, name="desk-1", state="absent", uri="test:///default")
    assert res["changed"] is True and conn.exists("desk-1")
    assert run(name="desk-1", state="absent", uri="test:///default")["changed"] is True
    assert {d.name for d in conn.domains()} == names0
    assert mdevs(host) == mdevs0 and vf_types(host) == vfs0
    assert run(name="desk-1", state="absent", uri="test:///default")["changed"] is False


def test_domain_defined_then_running(conn: Any) -> None:
    host = sim("t4x2")
    run = Runner("vgpu_domain", host, conn)
    args = {"name": "d", "gpus": [{"type": "nvidia-231"}], "uri": "test:///default"}
    assert run(state="defined", **args)["changed"] is True
    assert conn.exists("d") and not conn.is_active("d")
    assert run(state="defined", **args)["changed"] is False
    res = run(state="running", **args)
    assert res["changed"] is True and res["plan"] == ["start domain d"]
    assert run(state="defined", **args)["changed"] is False, "defined leaves a running domain running"


def test_domain_refuses_a_foreign_domain_of_that_name(conn: Any) -> None:
    host = sim("t4x2")
    # libvirt's test driver comes with a domain named "test" that vgpuvirt did not create
    assert conn.exists("test")
    res = Runner("vgpu_domain", host, conn)(name="test", gpus=[{"type": "nvidia-231"}], uri="test:///default")
    assert res["failed"] is True and "not created by vgpuvirt" in res["msg"]
    assert mdevs(host) == {}
    res = Runner("vgpu_domain", host, conn)(name="test", state="absent", uri="test:///default")
    assert res["changed"] is False and conn.exists("test")


def test_domains_of_other_hosts_on_a_shared_libvirt_are_ignored(conn: Any) -> None:
    h1, h2 = sim("l40s-vgpu17", "hv1"), sim("l40s-vgpu17", "hv2")
    r1 = Runner("vgpu_domain", h1, conn)(name="a", gpus=[{"type": "NVIDIA L40S-2Q"}], uri="test:///default",
                                         host_name="hv1")
    # hv2 has the same VF addresses: hv1's domain must not make them look used on hv2
    r2 = Runner("vgpu_domain", h2, conn)(name="b", gpus=[{"type": "NVIDIA L40S-2Q"}], uri="test:///default",
                                         host_name="hv2")
    assert r1["domain"]["gpus"] == [dict(r2["domain"]["gpus"][0])], "both hosts use their first free VF"
    res = Runner("vgpu_domain", h2, conn)(name="a", state="absent", uri="test:///default", host_name="hv2")
    assert res["changed"] is False and conn.exists("a")


def test_domain_without_gpus_is_refused(conn: Any) -> None:
    res = Runner("vgpu_domain", sim("t4x2"), conn)(name="nogpu", uri="test:///default")
    assert res["failed"] is True and "at least one GPU" in res["msg"]
    assert not conn.exists("nogpu")


@pytest.mark.parametrize("options, fragment", [
    ({"bogus": True}, "invalid domain option 'bogus'"),
    ({"hugepages": "no"}, "domain option hugepages"),
    ({"evdev": 5}, "domain option evdev"),
])
def test_domain_options_unknown_or_of_a_wrong_type_fail_cleanly(conn: Any, options: dict[str, Any],
                                                                 fragment: str) -> None:
    host = sim("t4x2")
    res = Runner("vgpu_domain", host, conn)(name="opts", gpus=[{"type": "nvidia-231"}], uri="test:///default",
                                            domain_options=options)
    assert res["failed"] is True and fragment in res["msg"] and res.get("error") == "InvalidSpec", res
    assert "TypeError" not in res["msg"]
    assert not conn.exists("opts") and mdevs(host) == {}


# ------------------------------------------------------------------------------------------ vgpu_layout


@pytest.mark.parametrize("profile,layout", [
    ("t4x2", {"version": "v1", "configs": {"day": [{"devices": ["Tesla T4"], "mode": "vgpu",
                                                   "vgpu-devices": {"T4-2Q": 8}}]}}),
    ("t4x2", {"version": "v1", "configs": {"day": [{"devices": [0], "mode": "vgpu", "vgpu-devices": {"T4-4Q": 2}},
                                                  {"devices": [1], "mode": "passthrough"}]}}),
])
def test_layout_check_mode_diff_after_is_the_layout_the_apply_makes(profile: str, layout: dict[str, Any]) -> None:
    """Issue 28 item 10: check mode's diff "after" was a comment ("# planned: ..."), not a layout; now it is the
    layout the host exports once applied (explicit counts here; a "fill" stays "fill"), in the form of "before"."""
    from vgpuvirt.layout import parse_layout

    host = sim(profile)
    run = Runner("vgpu_layout", host)
    dry = run(check=True, layout=layout, config="day")
    assert dry["changed"] is True and not mdevs(host), dry
    predicted = dry["diff"]["after"]
    assert parse_layout(predicted, "after").config("day").entries   # a layout, not a comment
    real = run(layout=layout, config="day")
    assert real["changed"] is True, real
    assert predicted == real["diff"]["after"]
    assert dry["diff"]["before"] == real["diff"]["before"] != predicted


def test_layout_check_mode_diff_changes_only_the_gpus_that_change() -> None:
    """Issue 28 item 10: the diff's "after" comes from the library's diff_documents. The module's own prediction
    wrote every governed GPU in the config's words, so a GPU already in state ("fill", 8 made) showed as changing
    from "T4-2Q: 8" to "T4-2Q: fill"; now only the GPU that changes differs, the other is as the host exports it."""
    import yaml

    host = sim("t4x2")
    run = Runner("vgpu_layout", host)
    fill = {"mode": "vgpu", "vgpu-devices": {"T4-2Q": "fill"}}
    assert run(layout={"version": "v1", "configs": {"day": [{"devices": "all", **fill}]}}, config="day")["changed"]
    night = {"version": "v1", "configs": {"day": [{"devices": [0], **fill},
                                                  {"devices": [1], "mode": "vgpu", "vgpu-devices": {"T4-4Q": 2}}]}}
    dry = run(check=True, layout=night, config="day")
    assert dry["changed"] is True
    before, after = (yaml.safe_load(dry["diff"][k])["configs"]["day"] for k in ("before", "after"))
    assert after[0] == before[0] == {"devices": ["0000:3b:00.0"], "mode": "vgpu", "vgpu-devices": {"T4-2Q": 8}}
    assert after[1] == {"devices": ["0000:d8:00.0"], "mode": "vgpu", "vgpu-devices": {"T4-4Q": 2}}
    assert before[1]["vgpu-devices"] == {"T4-2Q": 8}


def test_playbooks_and_docs_call_the_modules_by_their_fqcn() -> None:
    """A short name (vgpu_pool:) resolves only where a library/ directory holds the module, which is gone."""
    short = re.compile(r"^\s*(?:-\s+)?(" + "|".join(MODULES) + r"):", re.M)
    files = [*sorted((REPO / "examples" / "ansible").glob("*.yml")), REPO / "README.md",
             *sorted((REPO / "docs").glob("*.md")), COLLECTION / "README.md"]
    assert len(files) > 10
    bad = [f"{f.relative_to(REPO)}: {m[1]}" for f in files for m in short.finditer(f.read_text())]
    assert not bad, bad
    assert all(f"{FQCN}." in f.read_text() for f in (REPO / "examples" / "ansible").glob("*.yml"))
