"""The drain's choreography on the real libvirtd (qemu:///system): VMs that carry no host device (no VFIO
here) are tied to the simulated host's mdevs through ``users``; a layout that retypes those mdevs refuses,
then with ``--drain shutdown`` shuts the running VM down (its guest has no OS to answer ACPI, so the
timeout passes and ``force`` destroys it), applies, and starts it again; the stopped one stays stopped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from conftest import Testbed, require_part  # type: ignore[import-not-found]

from vgpuvirt.errors import DeviceBusy, LibvirtError
from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.layout.drain import apply_with_drain
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.sim.host import SimHost

RUN = "lqd" + uuid.uuid4().hex[:6]
LAY = parse_layout("""\
version: v1
configs:
  two-q: [{devices: all, mode: vgpu, vgpu-devices: {T4-2Q: 2}}]
  one-q: [{devices: all, mode: vgpu, vgpu-devices: {T4-1Q: 2}}]
""")


@pytest.fixture
def conn(testbed: Testbed) -> Iterator[LibvirtConnection]:
    c = LibvirtConnection(testbed.libvirt_uri)
    try:
        c.domains()
    except LibvirtError as exc:
        require_part("libvirtd", False, str(exc))
    yield c
    for d in c.domains():
        if d.name.startswith(RUN):
            c.destroy(d.name)
            c.undefine(d.name)
    c.close()


def _tiny(conn: LibvirtConnection, name: str) -> None:
    conn.define(f"<domain type='kvm'><name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>"
                "<os><type arch='x86_64'>hvm</type></os><devices><emulator>/usr/bin/qemu-system-x86_64</emulator>"
                "</devices></domain>")


# `slow`: 5-7 s, mostly QEMU starting and the shutdown timeouts passing (the inner loop starts QEMU in
# test_xml_libvirtd.py)
@pytest.mark.slow
def test_drain_choreography_on_libvirtd(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, LAY.config("two-q"))
    mdevs = [v.uuid for g in verbs.read_gpus(host)[1] for v in g.vgpus if v.uuid]
    up, down, idle = RUN + "-up", RUN + "-down", RUN + "-idle"
    for n in (up, down, idle):
        _tiny(conn, n)
    conn.start(up)
    users = {host.name: {up: [mdevs[0]], down: [mdevs[1]]}}
    conns = {host.name: conn}
    with pytest.raises(DeviceBusy, match=f"{down}.*{up}|{up}.*{down}"):
        apply_with_drain([host], LAY.config("one-q"), conns=conns, users=users)
    assert conn.is_active(up) and verbs.check(host, LAY.config("two-q")) == []
    with pytest.raises(DeviceBusy, match="still running"):        # no --force: stops nothing for good
        apply_with_drain([host], LAY.config("one-q"), conns=conns, users=users, drain="shutdown", timeout=0.5)
    assert conn.is_active(up) and verbs.check(host, LAY.config("two-q")) == []
    report = apply_with_drain([host], LAY.config("one-q"), conns=conns, users=users, drain="shutdown",
                              timeout=0.5, force=True)
    assert report.drained[host.name] == [up] and report.restarted[host.name] == [up]
    assert conn.is_active(up) and not conn.is_active(down) and not conn.is_active(idle)
    assert verbs.check(host, LAY.config("one-q")) == []
