"""Issue 28, items 3, 9 (pre-flight wording), 10 (bridge, pool space) and 11 (repeated items): provisioning takes
the network or bridge, TPM, secure boot and graphics a real host needs (CLI and Python), and the pre-flight checks
each against the host's libvirt (simulator + libvirt's test driver)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from provision_fixtures import drop_test_domains

from vgpuvirt.cli import main
from vgpuvirt.errors import InvalidSpec, PreflightFailed, ProvisioningError
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.libvirt_storage import LibvirtFacts, PoolFacts
from vgpuvirt.provision import VgpuRequest, VmRequest, plan, provision, provisioning_options
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.xml import Domain
from vgpuvirt.xml.storage import FirmwareCaps

pytest.importorskip("libvirt")
Q2 = VgpuRequest(type="nvidia-231")
OVMF = frozenset({"/usr/share/OVMF/OVMF_CODE_4M.fd"})


def _name() -> str:
    return "po" + uuid.uuid4().hex[:6]


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    c = LibvirtConnection("test:///default")
    yield c
    drop_test_domains(c)


@pytest.fixture
def bridge(conn: LibvirtConnection) -> Iterator[str]:
    """A host bridge on the test driver's (per-process) host, under a unique name."""
    name = "br" + uuid.uuid4().hex[:6]
    iface = conn.raw.interfaceDefineXML(
        f"<interface type='bridge' name='{name}'><start mode='onboot'/><bridge stp='off'>"
        f"<interface type='ethernet' name='e{name}'/></bridge></interface>", 0)
    yield name
    iface.undefine()


def test_the_cli_builds_the_network_bridge_tpm_secure_boot_and_graphics(conn: LibvirtConnection, bridge: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    name = _name()
    rc = main(["--host", "sim:t4x2", "--json", "provision", "--connect", "test:///default", "--name", name,
               "--gpu", "T4-2Q", "--network", "default", "--bridge", bridge, "--tpm", "--secure-boot",
               "--graphics", "vnc", "--no-start"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["vms"][0]["vm"] == name
    dom = Domain.from_xml(conn.raw.lookupByName(name).XMLDesc(0))
    nics = [(i.get("type"), i.find("source").attrib) for i in dom.root.iterfind("devices/interface")]
    assert nics == [("network", {"network": "default"}), ("bridge", {"bridge": bridge})]
    assert dom.root.find("devices/tpm/backend").get("type") == "emulator"
    assert dom.root.find("os/firmware/feature[@name='secure-boot']").get("enabled") == "yes"
    assert [g.get("type") for g in dom.root.iterfind("devices/graphics")] == ["vnc"]


def test_the_python_options_define_on_libvirt(conn: LibvirtConnection, bridge: str) -> None:
    vm = VmRequest(_name(), gpus=(Q2,), start=False,
                   options=provisioning_options(bridges=[bridge], tpm=True, graphics="none"))
    provision(SimHost.from_profile("t4x2"), conn, [vm])
    dom = Domain.from_xml(conn.raw.lookupByName(vm.name).XMLDesc(0))
    assert [i.get("type") for i in dom.root.iterfind("devices/interface")] == ["bridge"]
    assert dom.root.find("devices/tpm") is not None and dom.root.find("devices/graphics") is None
    with pytest.raises(InvalidSpec, match="graphics"):
        provisioning_options(graphics="rdp")
    with pytest.raises(InvalidSpec, match="bridges"):
        provisioning_options(bridges="br0")      # a string is not a list of names (it would be 3 bridges)


def test_a_missing_bridge_or_an_interface_that_is_no_bridge_is_refused(conn: LibvirtConnection, bridge: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--count", "2", "--gpu", "T4-2Q",
               "--bridge", "nobr0"])
    err = capsys.readouterr().err
    assert rc != 0 and f"host bridge 'nobr0' does not exist (bridges: {bridge})" in err
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--gpu", "T4-2Q", "--bridge", "eth1"])
    assert rc != 0 and "host interface 'eth1' is not a bridge but ethernet" in capsys.readouterr().err


def test_the_missing_default_network_names_the_options_once_for_all_vms(conn: LibvirtConnection,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's repro: 8 desktops on a host without 'default' gave the same problem 8 times in one line."""
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--count", "8", "--gpu", "T4-2Q",
               "--prefix", "grp", "--network", "lan9"])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("does not exist") == 1
    assert ("sim:t4x2: grp-001, grp-002, ... grp-008 (8 VMs): libvirt network 'lan9' does not exist "
            "(networks: default; choose one with --network NAME or a host bridge with --bridge NAME)") in err


def test_tpm_and_secure_boot_libvirt_cannot_give_are_refused() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    vm = VmRequest("fw", gpus=(Q2,), options=provisioning_options(tpm=True, secure_boot=True))
    efi = frozenset({"efi"})
    poor = LibvirtFacts({"default": True}, {}, FirmwareCaps(efi, OVMF, False, frozenset({"passthrough"})))
    with pytest.raises(PreflightFailed) as ei:
        plan([inv], [vm], libvirt={inv.host: poor})
    msg = str(ei.value)
    assert "secure boot: libvirt offers no secure-boot capable UEFI loader here" in msg
    assert "TPM backend 'emulator' is not one libvirt can give here (offered: passthrough; the emulator needs" in msg
    rich = LibvirtFacts({"default": True}, {}, FirmwareCaps(efi, OVMF, True, frozenset({"emulator"})))
    assert plan([inv], [vm], libvirt={inv.host: rich}).steps


def test_domain_capabilities_say_secure_boot_and_tpm() -> None:
    xml = """<domainCapabilities><os supported='yes'><enum name='firmware'><value>efi</value></enum>
      <loader supported='yes'><value>/usr/share/OVMF/OVMF_CODE_4M.secboot.fd</value>
      <enum name='secure'><value>yes</value><value>no</value></enum></loader></os>
      <devices><tpm supported='yes'><enum name='backendModel'><value>passthrough</value><value>emulator</value>
      </enum></tpm></devices></domainCapabilities>"""
    caps = FirmwareCaps.from_xml(xml)
    assert caps.secure_boot is True and caps.tpm_backends == {"passthrough", "emulator"}
    old = FirmwareCaps.from_xml("<domainCapabilities><os supported='yes'/></domainCapabilities>")
    assert old.secure_boot is None and old.tpm_backends is None      # not said: not checked


def test_linked_clones_are_refused_when_their_pool_lacks_the_space() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    pool = PoolFacts("vdi", True, "/vdi", {"golden.qcow2": "/vdi/golden.qcow2"}, available_bytes=5 * 1024**3 + 1)
    facts = {inv.host: LibvirtFacts({"default": True}, {"vdi": pool})}
    disk = ClonedDisk("vdi", "/vdi/golden.qcow2", reserve_gib=2)
    vms = VmRequest.pool("cl", 3, gpu=Q2, disk=disk)
    with pytest.raises(PreflightFailed) as ei:
        plan([inv], vms, libvirt=facts)
    assert ei.value.problems == [
        "sim:t4x2: cl-003: storage pool 'vdi' has 5.0 GiB free, and each linked clone reserves 2 GiB "
        "(ClonedDisk reserve_gib): 2 already promised to this plan's other VMs (free space in the pool's "
        "directory, or another --pool)"]
    assert plan([inv], vms[:2], libvirt=facts).steps                   # two fit
    # A clone an earlier run made is adopted: it needs no new room.
    made = PoolFacts("vdi", True, "/vdi", {**pool.volumes, "cl-001.qcow2": "/vdi/cl-001.qcow2"}, 5 * 1024**3 + 1)
    assert plan([inv], vms, libvirt={inv.host: LibvirtFacts({"default": True}, {"vdi": made})}).steps


def test_the_pool_space_is_read_from_libvirt(conn: LibvirtConnection) -> None:
    pool = conn.facts().pools["default-pool"]
    assert pool.available_bytes is not None and pool.available_bytes > 0


def test_a_preflight_refusal_after_enabling_vfs_does_not_say_nothing_was_changed(conn: LibvirtConnection) -> None:
    host = SimHost.from_profile("a10-sriov")                        # SR-IOV off: the plan enables the VFs first
    vm = VmRequest(_name(), gpus=(VgpuRequest(min_framebuffer_mib=2048, series="Q"),),
                   options=provisioning_options(networks=["nonet"]))
    with pytest.raises(ProvisioningError) as ei:
        provision(host, conn, [vm])
    msg = str(ei.value)
    assert "nothing was changed" not in msg
    assert msg.startswith("after enabling SR-IOV: pre-flight refused the plan: sim:a10-sriov: ")
    assert "rolled back: sim:a10-sriov: set 0 SR-IOV VFs on 0000:41:00.0 again" in msg
    assert not inventory(host).gpus[0].sriov_numvfs


def test_the_cli_names_its_own_flag_for_the_clone_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    avail = LibvirtConnection("test:///default").facts().pools["default-pool"].available_bytes
    assert avail is not None
    gib = avail // 1024**3
    rc = main(["--host", "sim:t4x2", "plan", "--connect", "test:///default", "--count", "2", "--gpu", "T4-2Q",
               "--network", "default", "--clone", "/default-pool/golden-none.qcow2", "--pool", "default-pool",
               "--clone-reserve", str(gib // 2 + 1), "--prefix", "rsv"])
    err = capsys.readouterr().err
    assert rc != 0 and "rsv-002: storage pool 'default-pool' has" in err and "(--clone-reserve GIB)" in err
    assert "rsv-001: storage pool" not in err and "reserve_gib" not in err


def test_prepared_domain_options_are_taken_anything_else_in_their_place_is_refused() -> None:
    from vgpuvirt.xml import DomainOptions
    ok = VmRequest("w-dopts", options={"domain_options": DomainOptions(graphics="vnc")})
    assert ok.options["domain_options"].graphics == "vnc"
    with pytest.raises(InvalidSpec, match="a DomainOptions"):
        VmRequest("w-dopts", options={"domain_options": {"graphics": "vnc"}})
