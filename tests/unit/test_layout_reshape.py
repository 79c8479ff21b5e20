"""A layout that changes the vGPU size on a GPU holding vGPUs is planned as a reshape (issue 28 item 4): drain,
remove, then create once the GPU offers the new size. A vGPU 17+ VF lists only its current size, so the
new type used to be refused as an invalid name ("expected one it offers: L40S-8A, L40S-8Q")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from vgpuvirt.errors import DeviceBusy, InvalidSpec
from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.layout.drain import apply_with_drain
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.sim import SimHost

LAY = parse_layout("""\
version: v1
configs:
  big: [{devices: all, mode: vgpu, vgpu-devices: {L40S-8Q: 2}}]
  small: [{devices: all, mode: vgpu, vgpu-devices: {L40S-2Q: 4}}]
  other-board: [{devices: all, mode: vgpu, vgpu-devices: {A10-2Q: 4}}]
""", "reshape.yaml")


def _types(host: SimHost) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for g in verbs.read_gpus(host)[1]:
        out[str(g.address)] = sorted(g.short_name(v.type_id) for v in g.vgpus)
    return out


def test_a_size_change_is_a_reshape_planned_and_applied() -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    verbs.apply_host(host, LAY.config("big"))
    p = verbs.plan(host, LAY.config("small"))
    diffs = [d.format() for d in p.diffs]
    assert all("reshape: L40S-2Q offered once the vGPUs of another size are gone" in d for d in diffs), diffs
    assert all(s.text.startswith("clear vGPU type L40S-8Q") for s in p.steps) and len(p.steps) == 4
    assert len(p.pending) == 2                          # made on the re-read, once the GPUs offer 2Q
    verbs.apply_host(host, LAY.config("small"))
    assert set(map(tuple, _types(host).values())) == {("L40S-2Q",) * 4}
    assert verbs.check(host, LAY.config("small")) == []
    assert verbs.plan(host, LAY.config("small")).empty


def test_another_boards_type_is_still_refused_before_anything_changes() -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    verbs.apply_host(host, LAY.config("big"))
    before = _types(host)
    with pytest.raises(InvalidSpec, match=r"A10-2Q.*one it offers"):
        verbs.apply_host(host, LAY.config("other-board"))
    assert _types(host) == before


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    pytest.importorskip("libvirt")
    c = LibvirtConnection("test:///default")
    yield c
    c.close()


def test_a_reshape_that_takes_a_vms_vgpu_is_refused_naming_it_or_drained(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    verbs.apply_host(host, LAY.config("big"))
    vf = next(str(v.place) for g in verbs.read_gpus(host)[1] for v in g.vgpus)
    vm = "w28s" + uuid.uuid4().hex[:6]
    users = {host.name: {vm: [vf]}}                     # the test driver cannot hold a VF hostdev's VM running
    conn.define(f"<domain type='test'><name>{vm}</name><memory unit='MiB'>64</memory>"
                "<os><type arch='x86_64'>hvm</type></os></domain>")
    try:
        with pytest.raises(DeviceBusy, match=f"{vm} \\({vf}\\)"):
            apply_with_drain([host], LAY.config("small"), conns={host.name: conn}, users=users)
        assert set(map(tuple, _types(host).values())) == {("L40S-8Q",) * 2}     # nothing changed
        report = apply_with_drain([host], LAY.config("small"), conns={host.name: conn}, users=users,
                                  drain="shutdown", timeout=1)
        assert report.ok, report.lines()
        assert set(map(tuple, _types(host).values())) == {("L40S-2Q",) * 4}
    finally:
        conn.undefine(vm)
