"""Host cordon: the mark on the host (written by the agent, audited), read by every controller's inventory, and
placement skipping the host with the reason; drain planning around cordons and capacity."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid as _uuid
from pathlib import Path

import pytest

from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.provision.mobility import HostFacts
from vgpuvirt.provision.mobility.drain import plan_drain
from vgpuvirt.provision.plan import plan
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.services.cordon import CORDON_FILE, parse_cordon, read_cordon, set_cordon
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost, materialize

REPO = Path(__file__).resolve().parents[2]
VM = VmRequest("vm1", gpus=(VgpuRequest(type="nvidia-231"),))


def test_cordon_is_written_in_an_audited_batch_and_read_by_the_inventory() -> None:
    h = SimHost.from_profile("t4x2", name="gpu1")
    assert read_cordon(h) is None and inventory(h).cordon is None
    before, after = set_cordon(h, "vGPU manager upgrade", by="ops@ctl")
    assert before is None and after is not None and after.reason == "vGPU manager upgrade" and after.by == "ops@ctl"
    assert inventory(h).to_dict()["cordon"]["reason"] == "vGPU manager upgrade"
    records = [r for r in h.read_audit().records if r.get("event") == "op" and r.get("op") == "replace_file"]
    assert records and records[-1]["path"] == CORDON_FILE and "vGPU manager upgrade" in records[-1]["value"]
    set_cordon(h, None)
    assert read_cordon(h) is None and inventory(h).cordon is None


def test_a_cordon_survives_a_reboot_of_the_host() -> None:
    h = SimHost.from_profile("t4x2", name="gpu1")
    set_cordon(h, "repair")
    h.reboot()
    c = read_cordon(h)
    assert c is not None and c.reason == "repair"


def test_placement_skips_a_cordoned_host_with_the_reason() -> None:
    a, b = SimHost.from_profile("t4x2", name="a"), SimHost.from_profile("t4x2", name="b")
    set_cordon(a, "kernel update")
    p = plan([inventory(a), inventory(b)], [VM])
    assert {s.host for s in p.steps} == {"b"}
    assert any(c.host == "a" and c.reason == "host a is cordoned: kernel update" for c in p.explain)
    set_cordon(b, "repair")
    with pytest.raises(NoCapacity, match="host b is cordoned: repair"):
        plan([inventory(a), inventory(b)], [VM])


@pytest.mark.parametrize("reason", ["", "two\nlines", "x" * 201])
def test_a_bad_reason_is_refused_and_nothing_is_written(reason: str) -> None:
    h = SimHost.from_profile("t4x2")
    with pytest.raises(InvalidSpec, match="cordon reason"):
        set_cordon(h, reason)
    assert read_cordon(h) is None and not h.model.state_files


def test_a_damaged_mark_still_cordons() -> None:
    c = parse_cordon("{not json")
    assert c is not None and "unreadable" in c.reason
    assert parse_cordon("{}\n") is None and parse_cordon("") is None


@pytest.mark.slow
def test_another_controller_sees_the_cordon_and_its_plan_says_why(tmp_path: Path) -> None:
    """Two CLI processes (two controllers) on one host tree: one cordons, the other's plan skips the host."""
    materialize("t4x2", str(tmp_path / "tree"))
    base = [sys.executable, "-m", "vgpuvirt", "--host", "local", "--sysfs-root", str(tmp_path / "tree")]

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *argv], capture_output=True, text=True, check=False, cwd=REPO, timeout=120)

    r = cli("host", "cordon", "--reason", "fan swap")
    assert r.returncode == 0, r.stderr
    st = cli("--json", "host", "status", "--connect", "test:///default")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["cordon"]["reason"] == "fan swap"
    pl = cli("plan", "--connect", "test:///default", "--count", "1", "--gpu", "nvidia-231")
    assert pl.returncode != 0 and "host local is cordoned: fan swap" in pl.stderr
    assert len(pl.stderr.strip().splitlines()) == 1
    assert cli("host", "uncordon").returncode == 0
    ok = cli("plan", "--connect", "test:///default", "--count", "1", "--gpu", "nvidia-231")
    assert ok.returncode == 0, ok.stderr


def _facts(host: SimHost, domains: dict[str, str], active: tuple[str, ...] = ()) -> HostFacts:
    inv = inventory(host, domains=list(domains.items()))
    return HostFacts(host.name, inv, 10_000_000, 8_002_000, str(_uuid.uuid5(_uuid.NAMESPACE_URL, host.name)),
                     domains, frozenset(active), inv.cordon.reason if inv.cordon else None)


def _vgpu_vm(host: SimHost, vm: str) -> str:
    from vgpuvirt.change.identity import mdev_uuid_for
    from vgpuvirt.change.mdev import CreateMdev
    from vgpuvirt.model import MdevTypeId, PciAddress
    from vgpuvirt.services.mutation import apply_items

    u = mdev_uuid_for(vm, 0)
    outcomes = apply_items(host, [CreateMdev(host.name, vm, u, PciAddress.parse("0000:3b:00.0"),
                                             MdevTypeId.parse("nvidia-231")).item(5.0)])
    assert all(o.ok for o in outcomes)
    return (f"<domain type='kvm'><name>{vm}</name><memory unit='MiB'>1024</memory><os><type arch='x86_64' "
            f"machine='pc-q35-8.2'>hvm</type></os><devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
            f"<source><address uuid='{u}'/></source></hostdev></devices></domain>")


def test_drain_plan_spreads_over_the_hosts_and_skips_the_cordoned_one() -> None:
    src = SimHost.from_profile("t4x2", name="src")
    doms = {f"vm{i}": _vgpu_vm(src, f"vm{i}") for i in range(4)}
    b, c, d = (SimHost.from_profile("t4x2", name=n) for n in ("b", "c", "d"))
    set_cordon(d, "also in maintenance")
    plan_ = plan_drain(_facts(src, doms, tuple(doms)), [_facts(b, {}), _facts(c, {}), _facts(d, {})])
    dests = [m.dest for m in plan_.moves]
    assert sorted(dests) == ["b", "b", "c", "c"]                 # least loaded first, never the cordoned d
    assert all("d is cordoned: also in maintenance" in m.refusals["d"][0] for m in plan_.moves)
    assert "live-migrate vm0 -> b" in plan_.format()


def test_drain_plan_names_a_vm_no_host_can_take() -> None:
    src = SimHost.from_profile("t4x2", name="src")
    doms = {"vm0": _vgpu_vm(src, "vm0")}
    other = SimHost.from_profile("l40s-vgpu17", name="l40s")
    plan_ = plan_drain(_facts(src, doms, ("vm0",)), [_facts(other, {})])
    assert plan_.unmovable and "no such board" in plan_.format()
