"""Provisioning through real parts: real sshd -> the FUSE-mounted simulator, and the real libvirtd
(qemu:///system). Domains are defined there; starting a domain with a vGPU needs VFIO, which this
kernel lacks, so "start" is exactly the step that fails for real (libvirt error 67).

Faults, each injected at its own step, with a foreign mdev and a foreign domain that must survive:
vGPU creation (capacity taken by someone else between plan and apply), define (a foreign domain
takes the name between plan and apply), start (libvirtd refuses: no VFIO), and the SSH
connection cut in the middle of the device batch (the real transport closed once the batch's
effect is visible). After each failure the host holds exactly what it held before; a rerun
converges without duplicates.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]
from conftest import Testbed, require_part  # type: ignore[import-not-found]

from vgpuvirt.errors import AlreadyExists, LibvirtError, ProvisioningError, TransportError
from vgpuvirt.host.base import Op
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan, provision, teardown
from vgpuvirt.provision.plan import mdev_uuid_for
from vgpuvirt.provision.run import gather
from vgpuvirt.services.inventory.read import inventory

pytestmark = pytest.mark.integration

libvirt = pytest.importorskip("libvirt")
Q2 = VgpuRequest(type="nvidia-231")
FOREIGN_UUID = "0badc0de-0000-4000-8000-0000000000e2"


# Every domain this test process makes carries RUN in its name: cleanup and state comparisons look at
# those only, so another process running the suite against the same libvirtd is neither seen nor touched.
RUN = uuid.uuid4().hex[:4]
MINE = ("e2e" + RUN, "foreign-e2e" + RUN)


@pytest.fixture
def conn(testbed: Testbed) -> Iterator[LibvirtConnection]:
    c = LibvirtConnection(testbed.libvirt_uri)
    try:
        c.domains()
    except LibvirtError as exc:
        require_part("libvirtd", False, str(exc))
    made_before = {d.name for d in c.domains()}
    yield c
    for d in c.domains():
        if d.name not in made_before and d.name.startswith(MINE):
            c.destroy(d.name)
            c.undefine(d.name)
    c.close()


# The testbed's libvirtd has no network (no iptables for one): the plan's pre-flight refuses a VM on the
# templates' network 'default' there, so these VMs have no NIC (test_vdi_preflight_libvirtd.py checks that).
NO_NIC: dict[str, object] = {"virtio_nics": []}


def _names(n: int) -> list[VmRequest]:
    return VmRequest.pool("e2e" + RUN + uuid.uuid4().hex[:4], n, gpu=Q2, start=False, memory_mib=256, vcpus=1,
                          options=NO_NIC)


def _state(host: SSHHost, conn: LibvirtConnection) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    inv = inventory(host)
    return (frozenset(str(m.uuid) for m in inv.mdevs),
            frozenset(str(v.address) for v in inv.vendor_vgpu if v.current_type),
            frozenset(d.name for d in conn.domains() if d.name.startswith(MINE)))


def _foreign(host: SSHHost, conn: LibvirtConnection, parent: str = "0000:3b:00.0") -> str:
    assert host.apply([Op.write(f"/sys/class/mdev_bus/{parent}/mdev_supported_types/nvidia-231/create",
                                FOREIGN_UUID)]).ok
    name = "foreign-e2e" + RUN + uuid.uuid4().hex[:4]
    conn.define(f"<domain type='kvm'><name>{name}</name><memory unit='MiB'>64</memory>"
                "<os><type arch='x86_64'>hvm</type></os></domain>")
    return name


@pytest.mark.parametrize(("profile", "gpu"), [
    ("t4x2", VgpuRequest(min_framebuffer_mib=2048, series="Q")),
    ("a100-sriov", VgpuRequest(series="C")),
    ("l40s-vgpu17", VgpuRequest(min_framebuffer_mib=4096)),
    ("gvtg", VgpuRequest(vendor="intel")),
    ("mixed", VgpuRequest(vendor="nvidia")),
])
def test_define_rerun_teardown_over_ssh_and_libvirtd(testbed: Testbed, conn: LibvirtConnection, profile: str,
                                                     gpu: VgpuRequest) -> None:
    with sim_mount(testbed.mnt_dir, profile) as mnt, testbed.ssh(mnt) as host:
        vms = [v.__class__(**{**v.__dict__, "gpus": (gpu,)}) for v in _names(3)]
        before = _state(host, conn)
        rt = host.round_trips
        r = provision(host, conn, vms)
        assert r.applied is not None
        assert host.round_trips - rt == 2, "one inventory + one device batch, however many VMs"
        after = _state(host, conn)
        assert {v.name for v in vms} <= after[2]
        assert len(after[0] - before[0]) + len(after[1] - before[1]) == 3
        for a in r.plan.assignments:
            if a.kind == "mdev":
                assert os.path.islink(f"{mnt}/sys/bus/mdev/devices/{mdev_uuid_for(a.vm, a.index)}")
            assert str(a.slot).split(":", 1)[1][:2] in conn.xml(a.vm) or a.kind == "mdev"
        again = provision(host, conn, vms)
        assert again.plan.empty and _state(host, conn) == after
        assert teardown(host, conn, [v.name for v in vms]).ok
        assert _state(host, conn) == before


def test_passthrough_gaming_vm_defined_on_libvirtd(testbed: Testbed, conn: LibvirtConnection) -> None:
    with sim_mount(testbed.mnt_dir, "desktop") as mnt, testbed.ssh(mnt) as host:
        vm = VmRequest("e2e" + RUN + uuid.uuid4().hex[:4], gpus=(VgpuRequest(mode="passthrough"),), template="gaming",
                       memory_mib=256, vcpus=2, start=False,
                       options={"disable_arch_capabilities": True, **NO_NIC})
        r = provision(host, conn, [vm])
        a = r.plan.assignments[0]
        xml = conn.xml(vm.name)
        assert a.kind == "whole" and len(a.functions) >= 1
        assert f"bus='0x{a.slot.bus:02x}'" in xml or f'bus="0x{a.slot.bus:02x}"' in xml
        assert teardown(host, conn, [vm.name]).ok and not conn.exists(vm.name)


def test_start_fails_for_real_without_vfio_and_everything_is_rolled_back(testbed: Testbed,
                                                                         conn: LibvirtConnection) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        foreign = _foreign(host, conn)
        vms = [VmRequest(v.name, gpus=(Q2,), memory_mib=256, vcpus=1, start=True, options=NO_NIC)
               for v in _names(3)]
        before = _state(host, conn)
        with pytest.raises(ProvisioningError) as ei:
            provision(host, conn, vms)
        cause = ei.value.cause
        assert isinstance(cause, LibvirtError) and cause.domain == vms[0].name
        assert sum("undefined domain" in r for r in ei.value.rollback) == 3
        assert sum("removed vGPU" in r for r in ei.value.rollback) == 3
        assert _state(host, conn) == before and FOREIGN_UUID in before[0] and foreign in before[2]
        # Rerun without starting: converges, foreign things untouched.
        vms = [VmRequest(v.name, gpus=(Q2,), memory_mib=256, vcpus=1, start=False, options=NO_NIC)
               for v in vms]
        provision(host, conn, vms)
        now = _state(host, conn)
        assert now[0] == before[0] | {str(mdev_uuid_for(v.name, 0)) for v in vms}
        assert teardown(host, conn, [v.name for v in vms]).ok
        assert _state(host, conn) == before


def test_vgpu_creation_fails_when_capacity_is_taken_after_the_plan(testbed: Testbed, conn: LibvirtConnection) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host, testbed.ssh(mnt) as other:
        foreign = _foreign(host, conn)
        vms = _names(5)
        invs, doms = gather({host.name: host}, {host.name: conn})
        p = plan(invs, vms, domains=doms)
        taken = [str(uuid.uuid4()) for _ in range(5)]   # 7 were free on GPU0: 2 remain for our 5
        assert other.apply([Op.write("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create", u)
                            for u in taken]).ok
        before = _state(host, conn)
        with pytest.raises(ProvisioningError) as ei:
            apply(p, host, conn)
        assert sum("removed vGPU" in r for r in ei.value.rollback) == 2
        assert _state(host, conn) == before and foreign in before[2]
        assert other.apply([Op.write(f"/sys/bus/mdev/devices/{u}/remove", "1") for u in taken]).ok
        provision(host, conn, vms)
        assert len(_state(host, conn)[0]) == 1 + 5
        assert teardown(host, conn, [v.name for v in vms]).ok


def test_define_fails_when_a_foreign_domain_takes_the_name(testbed: Testbed, conn: LibvirtConnection) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        vms = _names(3)
        invs, doms = gather({host.name: host}, {host.name: conn})
        p = plan(invs, vms, domains=doms)
        squatter = vms[1].name   # same name, another UUID: libvirtd refuses our define
        conn.define(f"<domain type='kvm'><name>{squatter}</name><memory unit='MiB'>64</memory>"
                    "<os><type arch='x86_64'>hvm</type></os></domain>")
        before = _state(host, conn)
        with pytest.raises(ProvisioningError) as ei:
            apply(p, host, conn)
        assert isinstance(ei.value.cause, LibvirtError) and ei.value.cause.domain == squatter
        assert _state(host, conn) == before and conn.exists(squatter)
        with pytest.raises(AlreadyExists):      # a rerun refuses to adopt a domain it did not make
            provision(host, conn, vms)
        assert _state(host, conn) == before
        conn.undefine(squatter)
        provision(host, conn, vms)
        assert teardown(host, conn, [v.name for v in vms]).ok


class CuttingSSHHost(SSHHost):
    """Real SSH through a 400 ms RTT delay proxy; on the first writing batch the TCP connection is
    closed as soon as the batch's last device shows up in the FUSE tree: the host did the work, and
    the answer (200 ms behind) never arrives."""

    watch: str | None = None
    cut_done = False

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        writes = any(o.get("op") == "write" for o in request.get("ops") or ())
        if self.watch and not self.cut_done and writes:
            self.cut_done = True
            watch = self.watch

            def cutter() -> None:
                deadline = time.monotonic() + 10
                while not os.path.lexists(watch) and time.monotonic() < deadline:
                    time.sleep(0.001)
                client = self._client
                t = client.get_transport() if client is not None else None
                if t is not None:
                    # shutdown (not just close) wakes paramiko's reader thread blocked in recv()
                    t.sock.shutdown(socket.SHUT_RDWR)
                    t.sock.close()

            threading.Thread(target=cutter, daemon=True).start()
        return super()._exchange(request, idempotent=idempotent)


# `slow`: 7-8 s, mostly round trips of the 400 ms RTT link (the inner loop cuts a batch over SSH in
# test_audit_ssh.py)
@pytest.mark.slow
def test_ssh_connection_cut_mid_batch(testbed: Testbed, conn: LibvirtConnection) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as observer:
        foreign = _foreign(observer, conn)
        vms = _names(4)
        from vgpuvirt.testing.delayproxy import DelayProxy

        proxy = DelayProxy((testbed.ssh_host, testbed.ssh_port), rtt_ms=400).start()
        port = proxy.address[1]
        real = f"[{testbed.ssh_host}]:{testbed.ssh_port}"
        known = Path(mnt + ".known_hosts")
        known.write_text("".join(f"[{testbed.ssh_host}]:{port} {line.split(' ', 1)[1]}\n"
                                 for line in Path(testbed.known_hosts).read_text().splitlines()
                                 if line.split(" ", 1)[0].split(",").count(real)))
        host = CuttingSSHHost(testbed.ssh_host, port=port, username="root", key_filename=testbed.identity,
                              known_hosts=str(known), sysfs_root=mnt)
        host.watch = f"{mnt}/sys/bus/mdev/devices/{mdev_uuid_for(vms[-1].name, 0)}"
        before = _state(observer, conn)
        try:
            with pytest.raises(ProvisioningError) as ei:
                provision(host, conn, vms)
            # The batch's outcome is unknown to us: a lost connection, never "the command failed".
            assert isinstance(ei.value.cause, TransportError)
            assert all("outcome unknown" in c for c in ei.value.completed)
            # The rollback reconnected, looked, and removed the 4 devices the lost batch had made.
            assert sum("removed vGPU" in r for r in ei.value.rollback) == 4
            assert _state(observer, conn) == before and FOREIGN_UUID in before[0] and foreign in before[2]
            provision(host, conn, vms)
            assert len(_state(observer, conn)[0]) == 1 + 4
            assert teardown(host, conn, [v.name for v in vms]).ok
            assert _state(observer, conn) == before
        finally:
            host.close()
            proxy.stop()
            known.unlink()


def test_libvirt_connection_hotplug_config_and_errors_on_libvirtd(conn: LibvirtConnection) -> None:
    """attach/detach (persistent config of an inactive domain) and error translation on the qemu driver."""
    name = "e2e" + RUN + uuid.uuid4().hex[:4]
    conn.define(f"<domain type='kvm'><name>{name}</name><memory unit='MiB'>64</memory>"
                "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>")
    assert conn.supports_hotplug and conn.driver == "qemu"
    u = str(uuid.uuid4())
    dev = (f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/></source>"
           "</hostdev>")
    conn.attach(name, dev, live=False)
    assert u in conn.xml(name, inactive=True)
    conn.detach(name, dev, live=False)
    assert u not in conn.xml(name, inactive=True)
    with pytest.raises(LibvirtError) as ei:
        conn.attach(name, dev.replace("vfio-pci", "bogus"), live=False)
    assert ei.value.domain == name and ei.value.code not in (None, 0) and ei.value.uri == conn.uri
    assert conn.undefine(name) == [] and not conn.exists(name)
