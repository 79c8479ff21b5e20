"""vgpu_host in-process (main() with patched module args, as AnsiballZ runs it) against simulated hosts and
libvirt's test driver: the cordon's check mode, diff and honest ``changed``; a drain's plan in check mode and its
refusal. A drain that really moves VMs needs a libvirtd per host: tests/integration/test_ansible_rolling_upgrade.py.
"""

from __future__ import annotations

import uuid as _uuid
from typing import Any

import pytest
from lxml import etree
from test_ansible_modules import Runner, conn, sim  # type: ignore[import-not-found]

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.services.cordon import CORDON_FILE, read_cordon
from vgpuvirt.xml.provenance import Provenance

__all__ = ["conn"]      # the fixture, imported for the tests below


def test_cordon_check_mode_then_cordon_then_rerun_then_uncordon() -> None:
    host = sim("t4x2")
    run = Runner("vgpu_host", host)
    res = run(check=True, state="cordoned", reason="vGPU manager upgrade")
    assert res["changed"] is True and res["diff"] == {"before": {"cordon": None},
                                                      "after": {"cordon": "vGPU manager upgrade"}}
    assert read_cordon(host) is None and not host.model.state_files          # check mode wrote nothing
    res = run(state="cordoned", reason="vGPU manager upgrade")
    assert res["changed"] is True and res["cordon"]["reason"] == "vGPU manager upgrade" and res["cordon"]["by"]
    mark = read_cordon(host)
    assert mark is not None and mark.reason == "vGPU manager upgrade"
    assert any(r.get("op") == "replace_file" and r.get("path") == CORDON_FILE for r in host.read_audit().records)
    again = run(state="cordoned", reason="vGPU manager upgrade")
    assert again["changed"] is False and again["cordon"]["since"] == res["cordon"]["since"]   # not rewritten
    other = run(state="cordoned", reason="fan swap")
    assert other["changed"] is True and read_cordon(host).reason == "fan swap"  # type: ignore[union-attr]
    assert run(check=True, state="uncordoned")["changed"] is True and read_cordon(host) is not None
    assert run(state="uncordoned")["changed"] is True and read_cordon(host) is None
    assert run(state="uncordoned")["changed"] is False


@pytest.mark.parametrize("args", [{"state": "cordoned"}, {"state": "cordoned", "reason": "two\nlines"},
                                  {"state": "drained", "reason": "x"}])
def test_bad_input_fails_and_writes_nothing(args: dict[str, Any]) -> None:
    host = sim("t4x2")
    res = Runner("vgpu_host", host)(**args)
    assert res["failed"] is True and res["msg"]
    assert read_cordon(host) is None and not host.model.state_files


def _vgpu_domain(c: LibvirtConnection, host: str, name: str) -> None:
    """A running VM whose ownership record holds a T4 vGPU on ``host`` (what a drain moves)."""
    u = mdev_uuid_for(name, 0)
    prov = Provenance.of(host, [{"kind": "mdev", "uuid": str(u), "parent": "0000:3b:00.0", "type": "nvidia-231"}])
    c.raw.defineXML(f"<domain type='test'><name>{name}</name><uuid>{_uuid.uuid4()}</uuid><metadata>"
                    f"{etree.tostring(prov.to_element(), encoding='unicode')}</metadata><memory>65536</memory>"
                    "<os><type>hvm</type></os></domain>").create()


def _drain_runner(src: Any, dst: Any, c: LibvirtConnection) -> Runner:
    run = Runner("vgpu_host", src, c)
    run.mod.open_libvirt = lambda uri: c
    run.mod.open_destination = lambda module, to: dst
    return run


def test_drain_check_mode_shows_each_vms_fate_and_the_real_run_fails_on_what_cannot_move(conn: Any) -> None:
    # Both "hosts" answer from one test driver: the destination already holds a domain of that name, and the
    # pre-check refuses the move; the plan, its diff and the failure still show their form.
    src, dst = sim("t4x2", "hv1"), sim("t4x2", "hv2")
    name = f"desk-{_uuid.uuid4().hex[:6]}"
    _vgpu_domain(conn, "hv1", name)
    run = _drain_runner(src, dst, conn)
    args = dict(state="drained", reason="upgrade", uri="test:///default",
                to=[{"name": "hv2", "host": "local", "uri": "test:///default"}])
    res = run(check=True, **args)
    assert res["changed"] is True, res
    (move,) = [m for m in res["plan"] if m["vm"] == name]
    assert move["dest"] is None and f"a domain named {name} already exists on hv2" in move["refusals"]["hv2"]
    assert res["diff"]["before"] == {"cordon": None, "vms": {m["vm"]: "hv1" for m in res["plan"]}}
    assert res["diff"]["after"]["cordon"] == "upgrade"
    assert read_cordon(src) is None                                  # check mode cordons nothing
    res = run(**args)
    assert res["failed"] is True and f"{name}: stays (hv2: a domain named {name} already exists" in res["msg"]
    assert read_cordon(src) is not None and conn.is_active(name)     # cordoned; the VM still runs, untouched
    res = run(shutdown_unmovable=True, **args)
    fate = next(f for f in res["fates"] if f["vm"] == name)
    assert fate["fate"] == "shut-down" and not conn.is_active(name)  # stopped only because it was asked


def test_drain_refuses_the_host_itself_as_a_destination(conn: Any) -> None:
    src = sim("t4x2", "hv1")
    res = _drain_runner(src, src, conn)(state="drained", uri="test:///default",
                                        to=[{"name": "hv1", "host": "local", "uri": "test:///default"}])
    assert res["failed"] is True and "distinct hosts other than hv1" in res["msg"]
    assert read_cordon(src) is None


def test_a_destination_that_is_no_ssh_or_local_host_is_refused() -> None:
    from vgpuvirt.errors import InvalidSpec

    mod = Runner("vgpu_host", sim("t4x2")).mod

    class Params:
        params = {"identity": None, "known_hosts": None}

    with pytest.raises(InvalidSpec, match="ssh://"):
        mod.open_destination(Params(), {"name": "x", "host": "sim:t4x2", "sysfs_root": "/"})
