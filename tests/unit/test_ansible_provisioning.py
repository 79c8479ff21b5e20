"""Issues 26 item 3 and 28 item 3, "the same in Python and Ansible": vgpu_domain and vgpu_pool take the
provisioning options (networks, bridges, tpm, secure_boot, graphics) and a licensed desktop's ``license``,
run in-process against a simulated host and libvirt's test driver (the modules' main(), as AnsiballZ calls it).

Each option is checked in the domain XML libvirt keeps; bad values are refused with the pre-flight's or
Ansible's one-line message and leave neither a domain nor a vGPU behind; the token never appears in a result.
The licensed apply itself (a volume upload, which the test driver lacks) runs on the real libvirtd in
tests/integration/test_ansible_license.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ansible")
pytest.importorskip("libvirt")
from test_ansible_modules import Runner, mdevs, sim  # type: ignore[import-not-found]

from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision.license import FEATURES, GUESTS
from vgpuvirt.provision.request import provisioning_options
from vgpuvirt.xml import Domain

T4_2Q = [{"type": "nvidia-231"}]
URI = "test:///default"


def _name(prefix: str = "ao") -> str:
    return prefix + uuid.uuid4().hex[:6]


@pytest.fixture
def conn() -> Iterator[LibvirtConnection]:
    """One connection kept open for the test (test:///default keeps its state per process while one is open);
    the domains this test defined (unique names) are removed after it."""
    c = LibvirtConnection(URI)
    before = {d.name for d in c.domains()}
    shared = c.close
    c.close = lambda: None  # type: ignore[method-assign]   # the modules close their connection; keep it
    yield c
    for d in c.domains():
        if d.name not in before:
            c.destroy(d.name)
            c.undefine(d.name)
    shared()


@pytest.fixture
def bridge(conn: LibvirtConnection) -> Iterator[str]:
    """A host bridge on the test driver's (per-process) host, under a unique name."""
    name = "br" + uuid.uuid4().hex[:6]
    iface = conn.raw.interfaceDefineXML(
        f"<interface type='bridge' name='{name}'><start mode='onboot'/><bridge stp='off'>"
        f"<interface type='ethernet' name='e{name}'/></bridge></interface>", 0)
    yield name
    iface.undefine()


@pytest.fixture
def token(tmp_path: Path) -> tuple[Path, str]:
    """A token file under a unique value: a hit anywhere can only come from this test."""
    value = f"vgpuvirt-ansible-token.{uuid.uuid4().hex}"
    path = tmp_path / "client_configuration_token.tok"
    path.write_text(value)
    return path, value


def _dom(conn: LibvirtConnection, name: str) -> Domain:
    return Domain.from_xml(conn.raw.lookupByName(name).XMLDesc(0))


def _nics(dom: Domain) -> list[tuple[str | None, dict[str, str]]]:
    return [(i.get("type"), dict(i.find("source").attrib)) for i in dom.root.iterfind("devices/interface")]


# ------------------------------------------------------------------------------------------ the options reach the XML


def test_domain_networks_bridges_tpm_secure_boot_graphics_reach_the_domain_xml(conn: LibvirtConnection,
                                                                               bridge: str) -> None:
    name = _name()
    res = Runner("vgpu_domain", sim("t4x2"), conn)(
        name=name, state="defined", gpus=T4_2Q, uri=URI, networks=["default"], bridges=[bridge], tpm=True,
        secure_boot=True, graphics="vnc")
    assert res.get("failed") is not True and res["changed"] is True, res
    dom = _dom(conn, name)
    assert _nics(dom) == [("network", {"network": "default"}), ("bridge", {"bridge": bridge})]
    assert dom.root.find("devices/tpm/backend").get("type") == "emulator"
    assert dom.root.find("os/firmware/feature[@name='secure-boot']").get("enabled") == "yes"
    assert [g.get("type") for g in dom.root.iterfind("devices/graphics")] == ["vnc"]


def test_domain_without_the_options_keeps_the_templates_choices(conn: LibvirtConnection) -> None:
    """The other side of the test above: nothing asked, nothing added (the template's default network,
    no TPM, UEFI with secure boot off)."""
    name = _name()
    res = Runner("vgpu_domain", sim("t4x2"), conn)(name=name, state="defined", gpus=T4_2Q, uri=URI)
    assert res["changed"] is True, res
    dom = _dom(conn, name)
    assert _nics(dom) == [("network", {"network": "default"})]
    assert dom.root.find("devices/tpm") is None
    assert dom.root.find("os/firmware/feature[@name='secure-boot']").get("enabled") == "no"


def test_graphics_none_leaves_only_the_vgpus_display(conn: LibvirtConnection, bridge: str) -> None:
    name = _name()
    res = Runner("vgpu_domain", sim("t4x2"), conn)(name=name, state="defined", gpus=T4_2Q, uri=URI,
                                                   bridges=[bridge], graphics="none")
    assert res["changed"] is True, res
    dom = _dom(conn, name)
    assert dom.root.find("devices/graphics") is None
    assert _nics(dom) == [("bridge", {"bridge": bridge})]


def test_pool_members_get_the_options(conn: LibvirtConnection, bridge: str) -> None:
    """vgpu_pool's module half (what runs on each host) builds each member with the options."""
    prefix = _name("ap")
    host = sim("t4x2")
    res = Runner("vgpu_pool", host, conn)(
        name=prefix, count=2, placed=[f"{prefix}-01", f"{prefix}-02"], host_name=host.name, gpus=T4_2Q, uri=URI,
        bridges=[bridge], tpm=True, graphics="spice")
    assert res.get("failed") is not True and res["changed"] is True, res
    for n in (f"{prefix}-01", f"{prefix}-02"):
        dom = _dom(conn, n)
        assert _nics(dom) == [("bridge", {"bridge": bridge})]
        assert dom.root.find("devices/tpm") is not None
        assert [g.get("type") for g in dom.root.iterfind("devices/graphics")] == ["spice"]


# ------------------------------------------------------------------------------------------ refused, nothing changed


@pytest.mark.parametrize("args, fragment", [
    ({"networks": ["nosuch-net"]}, "libvirt network 'nosuch-net' does not exist (networks: default"),
    ({"bridges": ["nobr0"]}, "host bridge 'nobr0' does not exist"),
    ({"graphics": "rdp"}, "graphics must be one of: spice, vnc, none"),
    ({"tpm": "maybe"}, "argument 'tpm' is of type"),
    ({"networks": "default"}, None),      # Ansible reads a string as a one-element list: not refused
    ({"tpm": True, "domain_options": {"tpm": False}}, "invalid domain_options 'tpm': expected none of the keys"),
    ({"bridges": ["br0"], "domain_options": {"virtio_nics": []}}, "option(s) bridges set"),
    ({"license": {"feature": "vgpu"}}, "missing required arguments: token_file"),
    ({"license": {"token_file": "/nonexistent/t.tok"}}, "invalid license token file '/nonexistent/t.tok'"),
    ({"license": {"token_file": "TOKEN", "feature": "grid"}}, "feature must be one of: vgpu, vws, vcs"),
    ({"license": {"token_file": "TOKEN", "guest": "macos"}}, "guest must be one of: linux, windows"),
    ({"license": {"token_file": "TOKEN", "pool": "no-such-pool"}},
     "storage pool 'no-such-pool' for the license seed does not exist"),
    ({"license": {"token_file": "TOKEN", "pool": "bad/pool"}}, "license seed storage pool"),
])
@pytest.mark.parametrize("module", ["vgpu_domain", "vgpu_pool"])
def test_bad_values_are_refused_with_a_clear_message_and_no_change(conn: LibvirtConnection, module: str,
                                                                    args: dict[str, Any], fragment: str | None,
                                                                    token: tuple[Path, str]) -> None:
    if "license" in args and args["license"].get("token_file") == "TOKEN":
        args = {**args, "license": {**args["license"], "token_file": str(token[0])}}
    name = _name()
    host = sim("t4x2")
    call = dict(name=name, gpus=T4_2Q, uri=URI, state="defined", **args)
    if module == "vgpu_pool":
        call.update(count=1, placed=[f"{name}-01"], host_name=host.name)
    before = {d.name for d in conn.domains()}
    res = Runner(module, host, conn)(**call)
    if fragment is None:
        assert res.get("failed") is not True, res
        return
    assert res.get("failed") is True and fragment in res["msg"], res
    assert "\n" not in res["msg"] and "Traceback" not in res["msg"]
    assert {d.name for d in conn.domains()} == before and mdevs(host) == {}
    assert token[1] not in json.dumps(res)


# ------------------------------------------------------------------------------------------ the license


@pytest.mark.parametrize("module", ["vgpu_domain", "vgpu_pool"])
def test_license_check_mode_plans_the_seed_and_shows_only_the_tokens_digest(conn: LibvirtConnection, module: str,
                                                                            token: tuple[Path, str]) -> None:
    import hashlib

    path, value = token
    name = _name()
    host = sim("t4x2")
    call = dict(name=name, gpus=T4_2Q, uri=URI, state="defined",
                license={"token_file": str(path), "feature": "vws", "pool": "default-pool"})
    vm = name
    if module == "vgpu_pool":
        vm = f"{name}-01"
        call.update(count=1, placed=[vm], host_name=host.name)
    res = Runner(module, host, conn)(check=True, **call)
    assert res["changed"] is True, res
    digest = hashlib.sha256(value.encode()).hexdigest()
    seed = [s for s in res["plan"] if s.startswith("create license seed")]
    assert seed == [f"create license seed default-pool/{vm}-license-seed.iso (linux guest, token sha256 {digest}) "
                    f"for {vm}"], res["plan"]
    assert value not in json.dumps(res)
    assert not conn.exists(vm) and mdevs(host) == {}


def test_a_failed_seed_upload_rolls_back_and_never_shows_the_token(conn: LibvirtConnection,
                                                                   token: tuple[Path, str]) -> None:
    """libvirt's test driver cannot upload a volume: the apply fails after creating the vGPU, which is rolled
    back; the error (the one line Ansible prints) names the volume, not the token."""
    name = _name()
    host = sim("t4x2")
    res = Runner("vgpu_domain", host, conn)(name=name, gpus=T4_2Q, uri=URI, state="defined",
                                            license={"token_file": str(token[0]), "pool": "default-pool"})
    assert res["failed"] is True and f"upload license seed {name}-license-seed.iso failed" in res["msg"], res
    assert res["rollback"] and not conn.exists(name) and mdevs(host) == {}
    assert token[1] not in json.dumps(res)


def test_the_specs_choices_are_the_librarys() -> None:
    """module_utils/common.py cannot import vgpuvirt unguarded, so it writes the choices out: keep them equal."""
    from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import LICENSE_SPEC, PROVISIONING_SPEC

    assert LICENSE_SPEC["feature"]["choices"] == list(FEATURES)
    assert LICENSE_SPEC["guest"]["choices"] == list(GUESTS)
    for g in PROVISIONING_SPEC["graphics"]["choices"]:
        assert provisioning_options(graphics=g) == {"graphics": g}


def test_the_pools_controller_half_never_reads_the_token_file() -> None:
    """The action plugin places the pool on the controller; the token file is on the target. Placing must not
    read (or need) it, while the host's half does."""
    from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.pool import member_request
    from vgpuvirt.errors import InvalidSpec

    p = {"name": "lic", "gpus": T4_2Q, "template": "vdi", "memory_mib": 1024, "vcpus": 1, "disk": None,
         "clone": None, "state": "defined", "domain_options": None, "networks": None, "bridges": None,
         "tpm": True, "secure_boot": False, "graphics": None,
         "license": {"token_file": "/only/on/the/target.tok", "feature": "vgpu", "guest": "linux", "pool": None}}
    req = member_request(p, "lic-01", on_target=False)
    assert req.license is None and req.options == {"tpm": True}
    with pytest.raises(InvalidSpec, match=r"license token file '/only/on/the/target\.tok'"):
        member_request(p, "lic-01")
