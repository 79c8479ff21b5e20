"""A rerun of ``provision`` after a reboot (issue 28 items 2 and 7): a kept VM's vanished vGPU is made again
through the capacity model, with its own UUID; where the GPU has no room it is refused before anything is
written, with the counts (it used to be planned blindly and the apply blamed "a concurrent caller")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from vgpuvirt.errors import NoCapacity
from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost

pytest.importorskip("libvirt")
T4_2Q = VgpuRequest(type="nvidia-231")


@pytest.fixture
def pool() -> Iterator[tuple[SimHost, LibvirtConnection, list[VmRequest]]]:
    host = SimHost.from_profile("t4x2")
    conn = LibvirtConnection("test:///default")
    reqs = VmRequest.pool("w28p" + uuid.uuid4().hex[:6], 4, gpu=T4_2Q, start=False, memory_mib=256, vcpus=1,
                          options={"virtio_nics": []})
    provision(host, conn, reqs)
    try:
        yield host, conn, reqs
    finally:
        teardown(host, conn, patterns=[reqs[0].name.rsplit("-", 1)[0] + "-*"])
        conn.close()


def _mdevs(host: SimHost) -> set[str]:
    return {str(m.uuid) for m in inventory(host).mdevs}


def test_a_rerun_after_a_reboot_makes_each_vms_own_vgpu_again(pool: tuple) -> None:
    host, conn, reqs = pool
    before = _mdevs(host)
    host.reboot()
    assert _mdevs(host) == set()
    again = provision(host, conn, reqs)
    assert _mdevs(host) == before                        # the same UUIDs: each desktop's own
    assert len([s for s in again.plan.steps if s.kind == "create-mdev"]) == 4
    assert provision(host, conn, reqs).plan.steps == []  # and then nothing to do


def test_a_vanished_vgpu_with_no_room_left_is_refused_with_the_counts(pool: tuple) -> None:
    host, conn, reqs = pool
    gpu = {str(m.parent) for m in inventory(host).mdevs}
    assert len(gpu) == 1
    host.reboot()
    # 8 vGPUs no VM names fill that T4 (a layout applied after the reboot with its own UUIDs)
    fill = parse_layout(f"version: v1\nconfigs:\n  f: [{{devices: ['{gpu.pop()}'], mode: vgpu, "
                        "vgpu-devices: {T4-2Q: 8}}]\n", "fill.yaml").config()
    verbs.apply_host(host, fill)
    orphans = _mdevs(host)
    assert len(orphans) == 8
    with pytest.raises(NoCapacity) as info:
        provision(host, conn, reqs)
    assert info.value.fit == 0 and info.value.wanted == 1
    msg = str(info.value)
    assert "is missing and cannot be made again" in msg and "0 of 1 fit" in msg and "gc --apply" in msg, msg
    assert "concurrent" not in msg
    assert _mdevs(host) == orphans                       # refused before anything was written


def test_the_rerun_summary_shows_kept_vms_gpus_and_never_says_started_for_no_start(pool: tuple) -> None:
    host, conn, reqs = pool
    theirs = {str(m.uuid): str(m.parent) for m in inventory(host).mdevs}
    rows = provision(host, conn, reqs).rows()
    assert {r["device"] for r in rows} == set(theirs) and len(rows) == 4
    assert all(r["type"] == "nvidia-231" and r["gpu"] == theirs[r["device"]] and r["status"] == "kept"
               for r in rows), rows
    host.reboot()
    again = provision(host, conn, reqs)                  # --no-start VMs (start=False): made again, not started
    assert {r["status"] for r in again.rows()} == {"re-created"}
    assert {r["vm"] for r in again.to_dict()["vms"]} == {vm.name for vm in reqs}


def test_a_vm_without_gpus_has_a_created_row_in_the_summary() -> None:
    host, conn = SimHost.from_profile("t4x2"), LibvirtConnection("test:///default")
    try:
        vm = VmRequest("w28n" + uuid.uuid4().hex[:6], gpus=(), start=False, memory_mib=256, vcpus=1,
                       options={"virtio_nics": []})
        rows = provision(host, conn, [vm], dry_run=True).rows()
        assert rows == [{"vm": vm.name, "host": host.name, "gpu": None, "type": None, "type_name": None,
                         "device": None, "numa_node": None, "status": "created"}]
    finally:
        conn.close()
