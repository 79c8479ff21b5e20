"""A VM's vGPUs survive a host reboot by design (issue 28 item 2): a layout applied after the reboot makes
again the mdevs defined VMs name, with their UUIDs (it used to make its own: orphans filled the GPU and the
desktops' vGPUs stayed missing), and ``layout assert`` fails while a defined VM names a missing vGPU."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from vgpuvirt.layout import verbs
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.xml.provenance import Provenance

pytest.importorskip("libvirt")
T4_2Q = VgpuRequest(type="nvidia-231")


@pytest.fixture
def desktops() -> Iterator[tuple[SimHost, LibvirtConnection, str, list[tuple[str, str]]]]:
    """4 desktops provisioned on a simulated T4 host (test driver): the host, its libvirt, their prefix and XML."""
    host = SimHost.from_profile("t4x2")
    conn = LibvirtConnection("test:///default")
    prefix = "w28r" + uuid.uuid4().hex[:6]
    provision(host, conn, VmRequest.pool(prefix, 4, gpu=T4_2Q, start=False, memory_mib=256, vcpus=1,
                                         options={"virtio_nics": []}))
    pairs = [(n, x) for n, x in conn.domain_xml_pairs() if n.startswith(prefix)]
    try:
        yield host, conn, prefix, pairs
    finally:
        teardown(host, conn, patterns=[prefix + "*"])
        conn.close()


def _vm_uuids(pairs: list[tuple[str, str]]) -> set[str]:
    out = set()
    for _, xml in pairs:
        prov = Provenance.read(xml)
        assert prov is not None
        out |= {g["uuid"] for g in prov.gpus if g.get("kind") == "mdev"}
    return out


def _host_uuids(host: SimHost) -> set[str]:
    return {str(m.uuid) for m in inventory(host).mdevs}


def test_after_a_reboot_the_layout_makes_the_vms_own_vgpus(desktops: tuple) -> None:
    host, _, _, pairs = desktops
    theirs = _vm_uuids(pairs)
    assert len(theirs) == 4 and _host_uuids(host) == theirs
    cfg = verbs.export(host).config("exported")
    host.reboot()
    assert _host_uuids(host) == set()
    diffs = verbs.check(host, cfg, pairs)
    assert sum("which is not on the host" in d for d in diffs) == 4, diffs
    assert any("T4-2Q on 0000:" in d for d in diffs)
    steps = [s.text for s in verbs.plan(host, cfg, pairs).steps]
    assert len(steps) == 4 and all(" for VM " in t for t in steps), steps
    verbs.apply_host(host, cfg, domains=pairs)
    assert _host_uuids(host) == theirs                   # each desktop's own vGPU, no orphan
    assert verbs.check(host, cfg, pairs) == []
    assert verbs.plan(host, cfg, pairs).empty            # a rerun changes nothing


def test_a_layout_that_made_its_own_vgpus_is_a_difference_and_apply_swaps_them(desktops: tuple) -> None:
    host, _, _, pairs = desktops
    theirs = _vm_uuids(pairs)
    cfg = verbs.export(host).config("exported")
    host.reboot()
    verbs.apply_host(host, cfg)                          # no domains known: the layout's own UUIDs (the bug)
    orphans = _host_uuids(host)
    assert len(orphans) == 4 and not orphans & theirs
    assert verbs.check(host, cfg) == []                  # counts alone say ok ...
    diffs = verbs.check(host, cfg, pairs)                # ... the VMs say otherwise
    assert sum("which is not on the host" in d for d in diffs) == 4, diffs
    verbs.apply_host(host, cfg, domains=pairs)           # idle ones give way to the VMs' own
    assert _host_uuids(host) == theirs
    assert verbs.check(host, cfg, pairs) == []


def test_a_missing_vgpu_the_config_cannot_make_is_a_note_not_a_difference() -> None:
    # a domain with no vgpuvirt metadata names only a UUID: its parent and type are unknown
    host = SimHost.from_profile("t4x2")
    cfg = verbs.export(host).config("exported")
    u = "5b4d3e52-3c8c-4c1e-9d6a-0e7c1f6a2b10"
    xml = (f"<domain type='kvm'><name>foreign</name><devices><hostdev mode='subsystem' type='mdev' "
           f"model='vfio-pci'><source><address uuid='{u}'/></source></hostdev></devices></domain>")
    diffs, notes = verbs.check_notes(host, cfg, [("foreign", xml)])
    assert diffs == []
    assert notes == [f"VM foreign names vGPU {u} (parent and type unknown: no vgpuvirt metadata), which is not "
                     "on the host: this config does not make it"]


def test_a_missing_vgpu_of_a_type_the_config_drops_is_a_note(desktops: tuple) -> None:
    host, _, _, pairs = desktops
    host.reboot()
    cfg = verbs.export(host).config("exported")          # after the reboot: no vGPUs at all
    diffs, notes = verbs.check_notes(host, cfg, pairs)
    assert diffs == [] and len(notes) == 4 and all("this config does not make it" in n for n in notes), notes


def test_another_hosts_vm_is_not_this_hosts_missing_vgpu() -> None:
    # hosts that share one libvirt (the testbed's) see each other's domains: a VM is its provenance host's
    host = SimHost.from_profile("t4x2")
    cfg = verbs.export(host).config("exported")
    u = "5b4d3e52-3c8c-4c1e-9d6a-0e7c1f6a2b11"
    xml = ("<domain type='kvm'><name>elsewhere</name><metadata><vgpuvirt:provision "
           "xmlns:vgpuvirt='https://vgpuvirt.dev/xmlns/provision/1' host='ssh://root@gpu2'><vgpuvirt:gpu "
           f"kind='mdev' uuid='{u}' parent='0000:3b:00.0' type='nvidia-231'/></vgpuvirt:provision></metadata>"
           f"<devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/>"
           "</source></hostdev></devices></domain>")
    assert verbs.check_notes(host, cfg, [("elsewhere", xml)]) == ([], [])
