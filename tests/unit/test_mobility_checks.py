"""Migration pre-checks on simulated hosts: each refusal with its reason, all of them at once, and the plan
(reservation steps, the XML rewritten for the destination) when nothing refuses."""

from __future__ import annotations

import uuid as _uuid
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.provision.mobility import HostFacts, MigrateDomain, plan_migration
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.sim import SimHost
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.refs import domain_device_refs
from vgpuvirt.xml.schema import validate

T4 = PciAddress.parse("0000:3b:00.0")
T4_B = PciAddress.parse("0000:d8:00.0")
T4_2Q = MdevTypeId.parse("nvidia-231")
NEW_QEMU, OLD_QEMU = 8_002_000, 7_002_000
NEW_LIBVIRT = 10_000_000


def _ok(outcomes: list) -> None:
    assert all(o.ok for o in outcomes), outcomes


def mdev_on(host: SimHost, vm: str, parent: PciAddress = T4, typ: MdevTypeId = T4_2Q, index: int = 0) -> MdevUuid:
    u = mdev_uuid_for(vm, index)
    _ok(apply_items(host, [CreateMdev(host.name, vm, u, parent, typ).item(5.0)]))
    return u


def domain(vm: str, *, mdevs: tuple[MdevUuid, ...] = (), pci: tuple[PciAddress, ...] = (), extra: str = "",
           machine: str = "pc-q35-8.2", hostdev_attrs: str = "", prov_host: str | None = None) -> str:
    devs = "".join(f"<hostdev mode='subsystem' type='mdev' model='vfio-pci' display='off'{hostdev_attrs}>"
                   f"<source><address uuid='{u}'/></source></hostdev>" for u in mdevs)
    devs += "".join(f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{a.domain:04x}' "
                    f"bus='0x{a.bus:02x}' slot='0x{a.slot:02x}' function='0x{a.function:x}'/></source></hostdev>"
                    for a in pci)
    meta = ""
    if prov_host is not None:
        from lxml import etree
        prov = Provenance.of(prov_host, [{"kind": "mdev", "uuid": str(u), "parent": str(T4), "type": str(T4_2Q)}
                                         for u in mdevs])
        meta = f"<metadata>{etree.tostring(prov.to_element(), encoding='unicode')}</metadata>"
    return (f"<domain type='kvm'><name>{vm}</name><uuid>{_uuid.uuid4()}</uuid>{meta}<memory unit='MiB'>1024</memory>"
            f"<vcpu>1</vcpu><os><type arch='x86_64' machine='{machine}'>hvm</type></os>"
            f"<devices><emulator>/usr/bin/qemu-system-x86_64</emulator>{devs}{extra}</devices></domain>")


def facts(host: SimHost, domains: dict[str, str], *, active: tuple[str, ...] = (), qemu: int = NEW_QEMU,
          libvirt: int = NEW_LIBVIRT, cordon: str | None = None) -> HostFacts:
    inv = inventory(host, domains=list(domains.items()))
    return HostFacts(host.name, inv, libvirt, qemu, str(_uuid.uuid5(_uuid.NAMESPACE_URL, host.name)), domains,
                     frozenset(active), cordon)


@pytest.fixture
def pair() -> tuple[SimHost, SimHost]:
    return SimHost.from_profile("t4x2", name="src"), SimHost.from_profile("t4x2", name="dst")


def test_a_vgpu_vm_plans_its_reservation_and_keeps_its_uuid(pair: tuple[SimHost, SimHost]) -> None:
    a, b = pair
    u = mdev_on(a, "desk-1")
    xml = domain("desk-1", mdevs=(u,), prov_host=a.name)
    plan = plan_migration("desk-1", facts(a, {"desk-1": xml}, active=("desk-1",)), facts(b, {}))
    assert plan.ok, plan.refusals
    create, move = plan.steps
    assert isinstance(create, CreateMdev) and create.host == b.name and create.uuid == u and create.type == T4_2Q
    assert isinstance(move, MigrateDomain) and move.host == b.name
    assert plan.max_downtime_ms == 5000
    prov = Provenance.read(plan.dest_xml)
    assert prov is not None and prov.host == b.name and prov.gpus[0]["parent"] == str(create.parent)
    validate(plan.dest_xml)


def test_a_uuid_taken_on_the_destination_is_replaced_in_the_xml(pair: tuple[SimHost, SimHost]) -> None:
    a, b = pair
    u = mdev_on(a, "desk-1")
    mdev_on(b, "desk-1")                  # the same UUID already exists on b (a stale copy, say)
    xml = domain("desk-1", mdevs=(u,))
    plan = plan_migration("desk-1", facts(a, {"desk-1": xml}, active=("desk-1",)), facts(b, {}))
    assert plan.ok, plan.refusals
    create = plan.steps[0]
    assert isinstance(create, CreateMdev) and create.uuid == mdev_uuid_for("desk-1", 1) != u
    assert domain_device_refs(plan.dest_xml).mdevs == frozenset({create.uuid})


def test_the_rewritten_xml_defines_on_libvirts_test_driver(pair: tuple[SimHost, SimHost]) -> None:
    libvirt = pytest.importorskip("libvirt")
    a, b = pair
    u = mdev_on(a, "desk-td")
    mdev_on(b, "desk-td")
    plan = plan_migration("desk-td", facts(a, {"desk-td": domain("desk-td", mdevs=(u,))}), facts(b, {}),
                          live=False)
    assert plan.ok and isinstance(plan.steps[-1], DefineDomain)
    conn = libvirt.open("test:///default")
    try:
        dom = conn.defineXML(plan.dest_xml)
        assert domain_device_refs(dom.XMLDesc(0)).mdevs == domain_device_refs(plan.dest_xml).mdevs
        dom.undefine()
    finally:
        conn.close()


def test_a_vgpu17_vf_moves_to_a_free_vf_of_the_same_board() -> None:
    a, b = SimHost.from_profile("l40s-vgpu17", name="src"), SimHost.from_profile("l40s-vgpu17", name="dst")
    inv = inventory(a)
    vf = inv.vendor_vgpu[0]
    typ = VgpuTypeId.parse(str(vf.creatable_types[2].id))
    _ok(apply_items(a, [SetVfType(a.name, "cad-1", vf.address, typ).item(5.0)]))
    taken = inventory(b).vendor_vgpu[0]       # the same VF is busy on b: another one must be chosen
    _ok(apply_items(b, [SetVfType(b.name, "other", taken.address, typ).item(5.0)]))
    xml = domain("cad-1", pci=(vf.address,))
    plan = plan_migration("cad-1", facts(a, {"cad-1": xml}, active=("cad-1",)), facts(b, {}))
    assert plan.ok, plan.refusals
    step = plan.steps[0]
    assert isinstance(step, SetVfType) and step.type == typ and step.vf != taken.address
    assert domain_device_refs(plan.dest_xml).pci == frozenset({step.vf})


@pytest.mark.parametrize(("change", "reason"), [
    ("board", "no such board"),
    ("ecc", "ECC is Enabled on src, Disabled on dst"),
    ("driver", "vGPU manager versions differ: src runs 550.90.05, dst runs 535.54.06"),
    ("viommu", "virtual IOMMU"),
    ("postcopy", "post-copy"),
    ("ramfb", "ramfb='on' on machine type pc-q35-7.2"),
    ("passthrough", "0000:d8:00.0 is plain PCI passthrough"),
    ("capacity", "no capacity on dst"),
    ("qemu", "dst: QEMU 7.2.0 < 8.1.0"),
    ("libvirt", "src: libvirt 8.0.0 < 8.6.0"),
    ("cordon", "dst is cordoned: kernel update"),
    ("not-running", "is not running on src: move it with --offline"),
    ("same-host", "are the same host"),
])
def test_each_precheck_refuses_with_its_reason(change: str, reason: str) -> None:
    a = SimHost.from_profile("t4x2", name="src")
    b = SimHost.from_profile("l40s-vgpu17" if change == "board" else "t4x2", name="dst")
    u = mdev_on(a, "vm1")
    kw: dict = {}
    extra, machine, attrs, pci = "", "pc-q35-8.2", "", ()
    src_kw: dict = {"active": ("vm1",)}
    dst_kw: dict = {}
    if change == "ecc":
        b.model.ecc_enabled = False
    elif change == "driver":
        b.model.driver_version = "535.54.06"     # older on the destination (newer is allowed: see below)
    elif change == "viommu":
        extra = "<iommu model='intel'/>"
    elif change == "postcopy":
        kw["postcopy"] = True
    elif change == "ramfb":
        machine, attrs = "pc-q35-7.2", " ramfb='on'"
    elif change == "passthrough":
        pci = (T4_B,)
    elif change == "capacity":
        for gpu in (T4, T4_B):              # a 16A on each T4 leaves no room for a 2Q (one type per GPU)
            mdev_on(b, f"big-{gpu.bus}", parent=gpu, typ=MdevTypeId.parse("nvidia-229"))
    elif change == "qemu":
        dst_kw["qemu"] = OLD_QEMU
    elif change == "libvirt":
        src_kw["libvirt"] = 8_000_000
    elif change == "cordon":
        dst_kw["cordon"] = "kernel update"
    elif change == "not-running":
        src_kw["active"] = ()
        kw["live"] = True
    xml = domain("vm1", mdevs=(u,), pci=pci, extra=extra, machine=machine, hostdev_attrs=attrs)
    src, dst = facts(a, {"vm1": xml}, **src_kw), facts(b, {}, **dst_kw)
    if change == "same-host":
        dst = HostFacts(dst.name, dst.inventory, dst.libvirt, dst.hypervisor, src.host_uuid, dst.domains)
    plan = plan_migration("vm1", src, dst, **kw)
    assert not plan.ok
    assert any(reason in r for r in plan.refusals), plan.refusals
    assert not plan.steps and not plan.dest_xml


def test_a_newer_vgpu_manager_on_the_destination_is_allowed_an_older_one_not() -> None:
    """A rolling upgrade moves VMs from hosts not yet upgraded onto those already upgraded, never back."""
    a, b = SimHost.from_profile("t4x2", name="src"), SimHost.from_profile("t4x2", name="dst")
    b.model.driver_version = "550.127.05"        # newer than the profile's 550.90.05
    u = mdev_on(a, "vm1")
    plan = plan_migration("vm1", facts(a, {"vm1": domain("vm1", mdevs=(u,))}, active=("vm1",)), facts(b, {}))
    assert plan.ok, plan.refusals
    back = mdev_on(b, "vm2")
    plan = plan_migration("vm2", facts(b, {"vm2": domain("vm2", mdevs=(back,))}, active=("vm2",)), facts(a, {}))
    assert plan.refusals == ["vGPU manager versions differ: dst runs 550.127.05, src runs 550.90.05 (a vGPU moves "
                             "to the same or a newer vGPU manager: upgrade src first)"]


def test_refusals_come_all_at_once() -> None:
    a, b = SimHost.from_profile("t4x2", name="src"), SimHost.from_profile("t4x2", name="dst")
    b.model.ecc_enabled = False
    b.model.driver_version = "535.54.06"
    u = mdev_on(a, "vm1")
    xml = domain("vm1", mdevs=(u,), pci=(T4_B,), extra="<iommu model='intel'/>")
    plan = plan_migration("vm1", facts(a, {"vm1": xml}, active=("vm1",)), facts(b, {}, qemu=OLD_QEMU,
                                                                                    cordon="repair"),
                          postcopy=True)
    text = "\n".join(plan.refusals)
    for reason in ("cordoned", "plain PCI passthrough", "virtual IOMMU", "post-copy", "QEMU 7.2.0",
                   "versions differ", "ECC"):
        assert reason in text, text
    assert "refused: " in plan.format()


def test_a_vm_without_gpus_needs_no_vfio_versions_and_gets_libvirts_downtime(pair: tuple[SimHost, SimHost]) -> None:
    a, b = pair
    plan = plan_migration("plain", facts(a, {"plain": domain("plain")}, active=("plain",), qemu=OLD_QEMU),
                          facts(b, {}, qemu=OLD_QEMU))
    assert plan.ok and plan.max_downtime_ms is None and len(plan.steps) == 1


def test_an_unknown_vm_is_bad_input(pair: tuple[SimHost, SimHost]) -> None:
    a, b = pair
    with pytest.raises(InvalidSpec, match="a domain on src"):
        plan_migration("ghost", facts(a, {}), facts(b, {}))


def test_sim_renders_ecc_and_driver_version_as_nvidia_smi_does() -> None:
    # a real nvidia-smi -q -x (L4, R555) has <ecc_mode><current_ecc>; the parser reads it from there
    from vgpuvirt.services.nvidia.smi import parse_nvidia_smi_xml
    real = Path(__file__).resolve().parents[1] / "fixtures/nvidia-smi/readings_l4_555.xml"
    assert parse_nvidia_smi_xml(real.read_bytes()).gpus[0].ecc_mode_current == "Enabled"
    h = SimHost.from_profile("t4x2")
    h.model.ecc_enabled = False
    h.model.driver_version = "580.65.06"
    inv = inventory(h)
    assert inv.nvidia_driver_version == "580.65.06"
    assert {g.nvidia.ecc_mode_current for g in inv.gpus if g.nvidia} == {"Disabled"}


# -- NVML's own verdict (the agent's nvml op; the simulator answers it as NVML would) ------------------------


def _nvml(a: SimHost, b: SimHost, live: bool = True, after_plan: Any = None) -> tuple[list[str], list[str]]:
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision.mobility import Side
    from vgpuvirt.provision.mobility.nvml_check import nvml_verdicts

    u = mdev_on(a, "vm1")
    src = facts(a, {"vm1": domain("vm1", mdevs=(u,))}, active=("vm1",) if live else ())
    dst = facts(b, {})
    plan = plan_migration("vm1", src, dst, live=live)
    assert plan.ok, plan.refusals
    if after_plan is not None:
        after_plan()
    unused = LibvirtConnection("test:///default")           # never opened: NVML goes through the Host
    return nvml_verdicts(Side(a, unused), Side(b, unused), dst, plan)


def test_nvml_says_live_for_twin_hosts(pair: tuple[SimHost, SimHost]) -> None:
    assert _nvml(*pair) == ([], [])


def test_nvml_refuses_an_older_vgpu_manager_on_the_destination(pair: tuple[SimHost, SimHost]) -> None:
    a, b = pair
    def older() -> None:                      # after the plan: only NVML's answer can refuse it here
        b.model.driver_version = "535.54.06"

    refusals, notes = _nvml(a, b, after_plan=older)
    assert not notes and len(refusals) == 1
    assert "NVML allows none migration, not live; limited by host driver (vGPU manager 535.54.06)" in refusals[0]


@pytest.mark.parametrize(("side", "reason"), [("source", "NVML_VGPU_VIRTUALIZATION_CAP_MIGRATION is off"),
                                              ("dest", "NVML_VGPU_PGPU_VIRTUALIZATION_CAP_MIGRATION is off")])
def test_nvml_capability_bits_refuse(pair: tuple[SimHost, SimHost], side: str, reason: str) -> None:
    a, b = pair
    (a if side == "source" else b).model.vgpu_migration = False
    refusals, _ = _nvml(a, b)
    assert any(reason in r for r in refusals), refusals


def test_a_host_without_nvml_is_noted_not_refused(tmp_path: Path) -> None:
    """A tree read by the real agent (no libnvidia-ml on this machine): NVML does not answer, nothing refused."""
    from vgpuvirt.host.local import LocalHost
    from vgpuvirt.libvirt_conn import LibvirtConnection
    from vgpuvirt.provision.mobility import Side
    from vgpuvirt.provision.mobility.nvml_check import nvml_verdicts
    from vgpuvirt.sim import materialize

    a, b = SimHost.from_profile("t4x2", name="src"), SimHost.from_profile("t4x2", name="dst")
    u = mdev_on(a, "vm1")
    plan = plan_migration("vm1", facts(a, {"vm1": domain("vm1", mdevs=(u,))}, active=("vm1",)), facts(b, {}))
    materialize("t4x2", str(tmp_path / "t"))
    real = LocalHost(sysfs_root=str(tmp_path / "t"))
    unused = LibvirtConnection("test:///default")
    refusals, notes = nvml_verdicts(Side(real, unused), Side(b, unused), facts(b, {}), plan)
    assert refusals == [] and len(notes) == 1 and "compatibility not checked" in notes[0]
