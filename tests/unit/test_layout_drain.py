"""The drain on libvirt's test driver: a VM whose mdev a layout retypes is refused by name, or drained,
re-targeted to a device of its type and started again; one that no longer fits stays defined, stopped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.errors import DeviceBusy, MissingDependency
from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.layout.drain import apply_with_drain
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.sim.host import SimHost

LAY = parse_layout("""\
version: v1
configs:
  two-q:
    - {devices: all, mode: vgpu, vgpu-devices: {T4-2Q: 2}}
  one-q:
    - {devices: all, mode: vgpu, vgpu-devices: {T4-1Q: 2}}
  four-q:
    - {devices: all, mode: vgpu, vgpu-devices: {T4-4Q: 2}}
  whole:
    - {devices: all, mode: passthrough}
""", "drain.yaml")
RUN = uuid.uuid4().hex[:6]


def _vm(conn: LibvirtConnection, name: str, mdev: str) -> None:
    conn.define(f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
                "<os><type arch='x86_64'>hvm</type></os><devices>"
                "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
                f"<source><address uuid='{mdev}'/></source></hostdev></devices></domain>")
    conn.start(name)


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    c = LibvirtConnection("test:///default")
    try:
        c.domains()
    except MissingDependency as exc:
        require_part("libvirt-python", False, str(exc))
    yield c
    for d in c.domains():
        if d.name.startswith("ldrain" + RUN):
            c.destroy(d.name)
            c.undefine(d.name)
    c.close()


def _setup(conn: LibvirtConnection) -> tuple[SimHost, str, str]:
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, LAY.config("two-q"))
    used = next(v.uuid for g in verbs.read_gpus(host)[1] for v in g.vgpus if v.uuid)
    assert used is not None
    vm = "ldrain" + RUN + "a"
    _vm(conn, vm, used)
    return host, vm, used


def test_refused_by_default_naming_the_vm(conn: LibvirtConnection) -> None:
    host, vm, used = _setup(conn)
    before = verbs.export(host)
    with pytest.raises(DeviceBusy, match=vm) as exc:
        apply_with_drain([host], LAY.config("one-q"), conns={host.name: conn})
    assert used in str(exc.value)
    assert verbs.export(host) == before and conn.is_active(vm)


def test_drain_shutdown_moves_and_restarts(conn: LibvirtConnection) -> None:
    host, vm, used = _setup(conn)
    report = apply_with_drain([host], LAY.config("four-q"), conns={host.name: conn}, drain="shutdown", timeout=5)
    assert report.drained[host.name] == [vm] and report.restarted[host.name] == [vm] and report.ok
    assert verbs.check(host, LAY.config("four-q"), list(conn.domain_xml_pairs())) == []
    new = report.moved[host.name][vm].split(" -> ")[1].split()[0]
    assert new != used and new in conn.xml(vm, inactive=True) and conn.is_active(vm)
    gpus = verbs.read_gpus(host, list(conn.domain_xml_pairs()))[1]
    assert any(v.uuid == new and v.domain == vm and v.type_id == "nvidia-232" for g in gpus for v in g.vgpus)


@pytest.mark.parametrize("config", ["whole", "one-q"])     # no vGPU left; only smaller ones left
def test_what_no_longer_fits_stays_defined_and_stopped(conn: LibvirtConnection, config: str) -> None:
    host, vm, _ = _setup(conn)
    report = apply_with_drain([host], LAY.config(config), conns={host.name: conn}, drain="shutdown", timeout=5)
    assert not report.ok and vm in report.unfit[host.name]
    assert conn.exists(vm) and not conn.is_active(vm)
    assert any("no longer fits" in line for line in report.lines())
