"""Health-aware placement: a GPU with a lost-GPU XID, uncorrectable ECC errors, pending page retirement / row
remapping or a degraded PCIe link is skipped, with the reason in --explain; inventory warns. Faults are injected
into the simulator (its API, and ``vgpuvirt sim fault`` through the faults file)."""

from __future__ import annotations

import json

import pytest

from vgpuvirt.cli import main
from vgpuvirt.errors import NoCapacity
from vgpuvirt.provision.by_need import place_one
from vgpuvirt.provision.placement import place
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.provision.state import host_states
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost

T4A, T4B = "0000:3b:00.0", "0000:d8:00.0"
Q2 = VgpuRequest(type="nvidia-231")


def _faulty(inject) -> SimHost:
    h = SimHost.from_profile("t4x2")
    h.model.telemetry.clock = lambda: 1_700_100_000.0
    inject(h.model.telemetry)
    return h


FAULTS = {
    "xid 79": (lambda t: t.inject_xid(T4A, 79), "GPU has fallen off the bus (XID 79)"),
    "xid 48": (lambda t: t.inject_xid(T4A, 48), "double-bit ECC error (XID 48)"),
    "ecc": (lambda t: t.inject_ecc(T4A, 2), "2 uncorrectable ECC error(s) since the driver loaded"),
    "pending": (lambda t: t.inject_pending_repair(T4A), "retired pages pending"),
    "link": (lambda t: t.degrade_link(T4A, width=8), "PCIe link degraded: x8 of x16"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_unhealthy_gpu_is_skipped_with_its_reason(fault):
    inject, reason = FAULTS[fault]
    h = _faulty(inject)
    before = h.round_trips
    inv = inventory(h)
    assert h.round_trips - before == 1                      # health came with the inventory's one round trip
    assert any(w.startswith(f"GPU {T4A} is unhealthy") and reason in w for w in inv.warnings)
    assert inv.gpu(T4A).health is not None and not inv.gpu(T4A).health.healthy
    assert inv.gpu(T4B).health is not None and inv.gpu(T4B).health.healthy
    got, why, _ = place(VmRequest.pool("vdi", 2, gpu=Q2), host_states([inv]))
    assert {str(a.gpu) for a in got} == {T4B}
    skipped = [c for c in why if c.gpu == T4A and c.verdict == "skipped"]
    assert skipped and all(c.reason.startswith("unhealthy: ") and reason in c.reason for c in skipped)
    assert str(place_one(inv, Q2).gpu) == T4B


def test_healthy_host_places_on_the_first_gpu():
    inv = inventory(_faulty(lambda t: t.inject_xid(T4A, 13)))   # an application's XID is no fault of the GPU
    assert not any("unhealthy" in w for w in inv.warnings)
    got, _, _ = place(VmRequest.pool("vdi", 1, gpu=Q2), host_states([inv]))
    assert str(got[0].gpu) == T4A


def test_every_gpu_unhealthy_is_no_capacity_naming_each_reason():
    h = _faulty(lambda t: (t.inject_xid(T4A, 79), t.degrade_link(T4B, width=4)))
    with pytest.raises(NoCapacity) as ei:
        place(VmRequest.pool("vdi", 1, gpu=Q2), host_states([inventory(h)]))
    assert "fallen off the bus" in str(ei.value) and "x4 of x16" in str(ei.value)


def test_link_generation_drop_counts_only_while_busy():
    idle = inventory(_faulty(lambda t: t.degrade_link(T4A, gen=1)))
    assert idle.gpu(T4A).health.healthy                      # an idle GPU runs gen 1 anyway (power saving)


def test_cli_fault_file_reaches_inventory_and_plan_explain(tmp_path, monkeypatch, capsys):
    faults = tmp_path / "faults.json"
    monkeypatch.setenv("VGPUVIRT_SIM_FAULTS", str(faults))
    assert main(["sim", "fault", "t4x2", T4A, "ecc", "3"]) == 0
    assert json.loads(faults.read_text())["t4x2"][T4A]["ecc_uncorrected"] == 3
    capsys.readouterr()
    assert main(["--host", "sim:t4x2", "inventory", "--json"]) == 0
    inv = json.loads(capsys.readouterr().out)
    health = {g["address"]: g["health"] for g in inv["gpus"]}
    assert health[T4A]["healthy"] is False and health[T4B]["healthy"] is True
    assert main(["--json", "--host", "sim:t4x2", "plan", "--connect", "test:///default", "--count", "1", "--gpu",
                 "type=nvidia-231", "--explain"]) == 0
    plan = json.loads(capsys.readouterr().out)
    why = {c["gpu"]: c for c in plan["plan"]["explain"]}
    assert why[T4A]["verdict"] == "skipped" and "3 uncorrectable ECC error(s)" in why[T4A]["reason"]
    assert why[T4B]["verdict"] == "chosen"
    assert main(["sim", "fault", "t4x2", "ALL", "--clear"]) == 0
    assert json.loads(faults.read_text()) == {"t4x2": {}}


@pytest.mark.parametrize(("argv", "needle"), [
    (["sim", "fault", "t4x2", "0000:99:00.0", "xid", "79"], "GPU"),
    (["sim", "fault", "t4x2", T4A, "xid"], "xid"),
    (["sim", "fault", "t4x2", T4A], "fault"),
    (["sim", "fault", "nosuch", T4A, "ecc"], "nosuch"),
])
def test_cli_fault_refuses_bad_input_and_writes_nothing(argv, needle, tmp_path, monkeypatch, capsys):
    faults = tmp_path / "faults.json"
    monkeypatch.setenv("VGPUVIRT_SIM_FAULTS", str(faults))
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not faults.exists()
