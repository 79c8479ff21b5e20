"""Collection over simulated hosts: one round trip per host, values that move with time (pinned by the clock),
absent readings as None, the join with libvirt domains, XIDs since the previous collection, hosts that fail."""

from __future__ import annotations

import json
import uuid

import pytest

from vgpuvirt.errors import HostError
from vgpuvirt.host.base import Op
from vgpuvirt.observe.collect import Collector, collect
from vgpuvirt.services.metrics_model import MetricsSnapshot
from vgpuvirt.sim import SimHost

T4A, T4B = "0000:3b:00.0", "0000:d8:00.0"
NOW = 1_700_100_000.0


def _sim(profile: str = "t4x2", now: float = NOW) -> SimHost:
    h = SimHost.from_profile(profile)
    h.model.telemetry.clock = lambda: now
    return h


def _mdev(h: SimHost, parent: str, type_id: str, params: str | None = None, u: str | None = None) -> str:
    u = u or str(uuid.uuid4())
    ops = [Op.write(f"/sys/class/mdev_bus/{parent}/mdev_supported_types/{type_id}/create", u)]
    if params is not None:
        ops.append(Op.write(f"/sys/bus/mdev/devices/{u}/nvidia/vgpu_params", params))
    assert h.apply(ops).ok
    return u


def _domain(name: str, vm_uuid: str, *, mdev: str | None = None, pci: str | None = None) -> str:
    dev = (f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{mdev}'/></source>"
           "</hostdev>") if mdev else ""
    if pci:
        dom, bus, rest = pci.split(":")
        slot, fn = rest.split(".")
        dev += (f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{dom}' "
                f"bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/></source></hostdev>")
    return (f"<domain type='kvm'><name>{name}</name><uuid>{vm_uuid}</uuid><memory>1048576</memory>"
            f"<os><type arch='x86_64'>hvm</type></os><devices>{dev}</devices></domain>")


@pytest.mark.parametrize("profile", ["t4x2", "large"])
def test_one_round_trip_per_collection_whatever_the_size(profile):
    h = _sim(profile)
    before = h.round_trips
    m = collect(h)
    assert h.round_trips - before == 1 and m.round_trips == 1 and m.up
    assert m.sources["nvidia_smi"] == "ok" and m.sources["vgpu_query"] == "ok" and m.sources["kernel_log"] == "ok"
    assert len(m.gpus) == (2 if profile == "t4x2" else 8)


def test_readings_move_with_time_and_are_pinned_by_the_clock():
    a, b, later = _sim(now=NOW), _sim(now=NOW), _sim(now=NOW + 17)
    for h in (a, b, later):   # readings are a function of time, seed and the vGPU: same UUID everywhere
        _mdev(h, T4A, "nvidia-231", u="0c0ffee0-0000-4000-8000-000000000001")
    ga, gb, gl = (collect(h).gpus[0] for h in (a, b, later))
    assert ga.sm_util_pct == gb.sm_util_pct and ga.vgpus[0].fb_used_mib == gb.vgpus[0].fb_used_mib
    assert (ga.sm_util_pct, ga.vgpus[0].encoder_fps) != (gl.sm_util_pct, gl.vgpus[0].encoder_fps)
    assert ga.sm_util_pct is not None and 0 <= ga.sm_util_pct <= 100


def test_gpu_and_vgpu_readings_and_capacity():
    h = _sim()
    # a fixed UUID: the sim's readings are a function of (clock, seed, vGPU), and a random one put the encoder
    # in its idle trough about one run in twelve (0 sessions)
    u = _mdev(h, T4A, "nvidia-231", u="0c0ffee0-0000-4000-8000-000000000002")
    g, idle = collect(h).gpus
    assert g.address == T4A and g.name == "Tesla T4" and g.mode == "mdev-vgpu" and g.fb_total_mib == 16384
    assert g.fb_used_mib == 2048 and g.vgpu_fb_used_mib == 2048 and g.performance_state == "P0"
    q2 = next(t for t in g.types if t.id == "nvidia-231")
    assert (q2.name, q2.framebuffer_mib, q2.fits_now, q2.in_use) == ("GRID T4-2Q", 2048, 7, 1)
    assert next(t for t in g.types if t.id == "nvidia-232").fits_now == 0     # equal-size mode
    assert g.temperature_c is not None and g.power_w is not None and g.power_limit_w == 70
    assert g.pcie.gen_current == g.pcie.gen_max == 3 and g.pcie.width_current == 16
    assert g.scheduler.policy == "best-effort"
    (v,) = g.vgpus
    assert (v.id, v.kind, v.parent, v.type_id, v.type_name) == (u, "mdev", T4A, "nvidia-231", "GRID T4-2Q")
    assert v.fb_total_mib == 2048 and 0 < (v.fb_used_mib or 0) < 2048
    assert v.sm_util_pct == g.sm_util_pct                 # the only vGPU on the GPU
    assert (v.encoder_util_pct or 0) > 0 and v.encoder_sessions == 1
    assert (v.frl_enabled, v.frame_rate_limit_fps) == (True, 60)
    assert v.vm_name is None and v.vm_uuid is None        # no domain, no VM name from the driver
    # the idle GPU: nothing running, readings zero where the driver says 0, link down to gen 1 (not a fault)
    assert idle.vgpus == () and idle.sm_util_pct == 0 and idle.pcie.gen_current == 1 and idle.health.healthy


def test_frame_rate_limiter_off_through_vgpu_params():
    h = _sim()
    _mdev(h, T4A, "nvidia-231", params="frame_rate_limiter=0")
    (v,) = collect(h).gpus[0].vgpus
    assert (v.frl_enabled, v.frame_rate_limit_fps) == (False, None)


def test_owner_joined_through_the_domain_xml():
    h = _sim()
    u = _mdev(h, T4A, "nvidia-231")
    vm_uuid = "5e0b7c1a-1111-4222-8333-444455556666"
    h.model.telemetry.vms[u] = ("qemu-name-differs", vm_uuid)
    (v,) = collect(h, domains=[("desk-01", _domain("desk-01", vm_uuid, mdev=u))]).gpus[0].vgpus
    assert (v.vm_name, v.vm_uuid) == ("desk-01", vm_uuid)
    # without libvirt's list: the driver's own words for the VM
    (v,) = collect(h).gpus[0].vgpus
    assert (v.vm_name, v.vm_uuid) == ("qemu-name-differs", vm_uuid)


def test_vendor_vf_vgpus_joined_by_vm_uuid_to_the_domain_holding_the_vf():
    h = _sim("l40s-vgpu17")
    vfs = ["0000:3d:00.4", "0000:3d:00.5"]
    for vf in vfs:
        assert h.apply([Op.write(f"/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type", "1155")]).ok
    uuids = ["aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"]
    for vf, vu in zip(vfs, uuids, strict=True):
        h.model.telemetry.vms[vf] = (f"q-{vu[-1]}", vu)
    doms = [(f"vm{i}", _domain(f"vm{i}", vu, pci=vf)) for i, (vf, vu) in enumerate(zip(vfs, uuids, strict=True))]
    g = next(g for g in collect(h, domains=doms).gpus if g.address == "0000:3d:00.0")
    got = {v.id: (v.kind, v.type_id, v.vm_name, v.vm_uuid, v.fb_total_mib) for v in g.vgpus}
    assert got == {vfs[0]: ("vendor-vf", "nvidia-1155", "vm0", uuids[0], 24576),
                   vfs[1]: ("vendor-vf", "nvidia-1155", "vm1", uuids[1], 24576)}
    assert all(v.sm_util_pct is not None for v in g.vgpus)
    assert g.mode == "vf-vgpu"


def test_mig_backed_vgpu():
    h = _sim("a30-mig")
    inv_types = h.read(["/sys/class/mdev_bus/*/mdev_supported_types/*/name"])
    path = next(p for p in sorted(inv_types) if "-1-6" in (inv_types.text(p) or ""))
    parent, type_id = path.split("/")[4], path.split("/")[6]
    u = _mdev(h, parent, type_id)
    (v,) = collect(h).gpus[0].vgpus
    assert v.id == u and v.mig_backed is True and v.gpu_instance_id is not None


def test_xids_since_the_previous_collection():
    h = _sim()
    c = Collector()
    assert collect(h).gpus[0].xids == ()
    c.collect(h)
    h.model.telemetry.inject_xid(T4A, 13)
    first = c.collect(h).gpus[0]
    assert [x.code for x in first.xids or ()] == [13] and first.health.healthy   # XID 13: an application fault
    h.model.telemetry.clock = lambda: NOW + 5
    second = c.collect(h).gpus[0]
    assert second.xids == () and second.xids_since_boot == (13,)
    h.model.telemetry.inject_xid(T4A, 79)
    third = c.collect(h).gpus[0]
    assert [x.code for x in third.xids or ()] == [79]
    assert not third.health.healthy and third.health.reasons == ("GPU has fallen off the bus (XID 79)",)


def test_absent_is_none_never_zero_without_an_nvidia_driver():
    m = collect(_sim("gvtg"))
    assert m.sources["nvidia_smi"].startswith("failed") and m.sources["vgpu_query"].startswith("failed")
    (g,) = m.gpus
    for value in (g.sm_util_pct, g.temperature_c, g.power_w, g.fb_used_mib, g.ecc.uncorrected_volatile,
                  g.pcie.width_current, g.memory_repair.retired_pending):
        assert value is None
    assert g.xids == () and g.types and g.mode == "gvtg"


class _Down(SimHost):
    def _exchange(self, request, *, idempotent):
        raise HostError(self.name, "connection refused")


def test_a_host_that_fails_is_down_and_the_others_are_collected():
    good, bad = _sim(), _Down.from_profile("t4x2", name="dead")
    snap = Collector().collect_many([bad, good])
    assert [(h.host, h.up) for h in snap.hosts] == [("dead", False), ("sim:t4x2", True)]
    assert "connection refused" in (snap.hosts[0].error or "") and snap.hosts[0].gpus == ()


def test_snapshot_json_round_trip():
    h = _sim()
    u = _mdev(h, T4A, "nvidia-231")
    h.model.telemetry.inject_xid(T4B, 48)
    snap = Collector().collect_many([h])
    data = json.loads(json.dumps(snap.to_dict()))
    assert data["schema"] == 1 and data["hosts"][0]["gpus"][0]["vgpus"][0]["id"] == u
    assert data["hosts"][0]["gpus"][1]["health"]["healthy"] is False
    assert MetricsSnapshot.from_dict(data) == snap


class _Slow(SimHost):
    def __init__(self, *a, gate, **kw):
        super().__init__(*a, **kw)
        self.gate = gate

    def _exchange(self, request, *, idempotent):
        self.gate.wait(10)
        return super()._exchange(request, idempotent=idempotent)


def test_a_host_that_does_not_answer_in_time_is_down_and_does_not_hold_up_the_others():
    import threading

    from vgpuvirt.sim import load_profile
    gate = threading.Event()
    slow = _Slow(load_profile("t4x2"), name="slow", gate=gate)
    try:
        snap = Collector().collect_many([slow, _sim()], timeout=1.0)
    finally:
        gate.set()
    assert [(h.host, h.up) for h in snap.hosts] == [("slow", False), ("sim:t4x2", True)]
    assert snap.hosts[0].error == "no answer within 1.0 s"


def test_readings_survive_a_non_zero_nvidia_smi_exit():
    from dataclasses import replace

    from vgpuvirt.observe.build import build_host_metrics
    from vgpuvirt.services.inventory.read import INVENTORY_GLOBS, build_inventory

    h = _sim()
    batch = h.apply([Op.exec(("nvidia-smi", "-q", "-x"), read_only=True)], lock=False, reads_after=INVENTORY_GLOBS)
    # what a host with a lost GPU answers: exit 15 (NVML_ERROR_GPU_IS_LOST), the other GPUs still printed
    smi = replace(batch[0], ok=False, rc=15, stderr="Unable to determine the device handle for GPU: GPU is lost\n")
    inv = build_inventory(batch.after, host="x", nvidia_smi=smi)
    m = build_host_metrics(inv, smi=smi, vgpu_query=None, klog=None, cursor=None, domains=(), sources={},
                           collected_at=0.0, duration_s=None, round_trips=1)
    assert all(g.temperature_c is not None for g in m.gpus)


def test_a_passed_through_gpu_names_its_vm():
    """Issue 28 item 9: a gaming VM's whole GPU named no VM, so its use could not be told per VM."""
    from vgpuvirt.observe.prometheus import families

    h = _sim("desktop")
    vm_uuid = "6f1c2d3e-1111-4222-8333-444455556666"
    doms = [("rig-01", _domain("rig-01", vm_uuid, pci="0000:01:00.0"))]
    snap = collect(h, domains=doms)
    g = next(g for g in snap.gpus if g.address == "0000:01:00.0")
    assert (g.vm_name, g.vm_uuid) == ("rig-01", vm_uuid) and not g.vgpus
    assert all(x.vm_name is None for x in snap.gpus if x.address != "0000:01:00.0")
    from vgpuvirt.services.metrics_model import MetricsSnapshot as Snap
    fams = {f.name: f for f in families(Snap(NOW, (snap,)))}
    (s,) = fams["vgpuvirt_gpu_vm_info"].samples
    assert s.labels == {"host": "sim:desktop", "gpu": "0000:01:00.0", "vm": "rig-01", "vm_uuid": vm_uuid}
