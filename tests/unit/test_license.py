"""Licensed desktops (issue 26): the token and the feature type reach the guest on a seed CD-ROM, read back here
with an ISO reader (pycdlib, and blkid for the volume label) and checked file by file; the plan mounts it
read-only in a domain libvirt's schema and parser accept; the token is never shown, only its SHA-256.

The upload itself needs a libvirt driver with storage streams: tests/integration/test_license_libvirtd.py."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pycdlib
import pytest
import yaml
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.cli import main
from vgpuvirt.errors import InvalidSpec, PreflightFailed
from vgpuvirt.libvirt_storage import LibvirtFacts, PoolFacts
from vgpuvirt.provision import VmRequest, plan
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.provision.license import License, seed_iso
from vgpuvirt.provision.steps_license import CreateLicenseSeed
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost
from vgpuvirt.xml import CdRom, Domain
from vgpuvirt.xml.provenance import Provenance
from vgpuvirt.xml.schema import validate

TOKEN = b"eyJhbGciOiJSUzI1NiJ9.vgpuvirt-test-client-configuration-token.c2lnbmF0dXJl\n"
SHA = hashlib.sha256(TOKEN).hexdigest()
VM_UUID = "6f1c2a58-2d4e-4f0b-9a63-0c2b5e7d9a10"


def read_iso(image: bytes) -> tuple[str, dict[str, bytes], dict[str, bytes]]:
    """(volume label, files by Rock Ridge path, files by Joliet path): what Linux and Windows see."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    label = iso.pvd.volume_identifier.decode().strip()
    views: list[dict[str, bytes]] = []
    for kind in ("rr_path", "joliet_path"):
        files: dict[str, bytes] = {}
        for root, _dirs, names in iso.walk(**{kind: "/"}):
            for n in names:
                path = f"{root.rstrip('/')}/{n}"
                buf = io.BytesIO()
                iso.get_file_from_iso_fp(buf, **{kind: path})
                files[path.lstrip("/")] = buf.getvalue()
        views.append(files)
    iso.close()
    return label, views[0], views[1]


# -- the seed's files ------------------------------------------------------------------------------------------


def test_linux_seed_holds_exactly_the_token_and_gridd_conf(tmp_path: Path) -> None:
    image = seed_iso(License(TOKEN), "desk-001", VM_UUID)
    label, rr, joliet = read_iso(image)
    assert label == "cidata" and rr == joliet and sorted(rr) == ["meta-data", "user-data"]
    assert yaml.safe_load(rr["meta-data"]) == {"instance-id": VM_UUID, "local-hostname": "desk-001"}
    text = rr["user-data"].decode()
    assert text.startswith("#cloud-config\n")          # what cloud-init needs on the first line
    doc = yaml.safe_load(text)
    files = {f["path"]: f for f in doc["write_files"]}
    assert sorted(files) == ["/etc/nvidia/ClientConfigToken/client_configuration_token.tok", "/etc/nvidia/gridd.conf"]
    tok = files["/etc/nvidia/ClientConfigToken/client_configuration_token.tok"]
    assert tok["encoding"] == "b64" and base64.b64decode(tok["content"]) == TOKEN
    conf = [ln for ln in files["/etc/nvidia/gridd.conf"]["content"].splitlines() if not ln.startswith("#")]
    assert conf == ["FeatureType=1"]
    assert doc["runcmd"] == [["systemctl", "restart", "nvidia-gridd"]]
    # a second, independent reader: the kernel's own probe sees an ISO 9660 volume labelled cidata
    blkid = shutil.which("blkid")
    require_part("blkid", blkid is not None, "util-linux")
    (tmp_path / "seed.iso").write_bytes(image)
    out = subprocess.run([str(blkid), "-p", "-o", "export", str(tmp_path / "seed.iso")], capture_output=True,
                         text=True, check=True).stdout
    assert "TYPE=iso9660" in out and "LABEL=cidata" in out


@pytest.mark.parametrize("feature,value", [("vgpu", 1), ("vws", 2), ("vcs", 4)])
def test_windows_config_drive_for_cloudbase_init(feature: str, value: int) -> None:
    label, rr, joliet = read_iso(seed_iso(License(TOKEN, feature, "windows"), "desk-w", VM_UUID))
    assert label == "config-2" and rr == joliet
    assert sorted(joliet) == ["openstack/latest/meta_data.json", "openstack/latest/user_data"]
    assert json.loads(joliet["openstack/latest/meta_data.json"])["uuid"] == VM_UUID
    script = joliet["openstack/latest/user_data"].decode()
    lines = script.split("\r\n")
    assert lines[0] == "#ps1_sysnative"
    b64 = next(ln for ln in lines if "FromBase64String" in ln).split("FromBase64String('")[1].split("'")[0]
    assert base64.b64decode(b64) == TOKEN
    assert r"NVIDIA Corporation\vGPU Licensing\ClientConfigToken" in script
    assert f"-Name FeatureType -PropertyType DWord -Value {value} " in script
    assert r"'HKLM:\SYSTEM\CurrentControlSet\Services\nvlddmkm\Global\GridLicensing'" in script
    assert "Restart-Service -Name 'NVDisplay.ContainerLocalSystem'" in script


@pytest.mark.parametrize("kw,match", [
    ({"token": b""}, "empty"), ({"token": b"  \n"}, "empty"), ({"token": b"x" * 70000}, "70000 bytes"),
    ({"token": b"ab\0cd"}, "binary"), ({"feature": "grid"}, "vgpu | vws | vcs"),
    ({"guest": "macos"}, "linux | windows"), ({"pool": "../x"}, "license seed storage pool")])
def test_bad_license_values_are_refused_without_showing_the_token(kw: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"token": TOKEN, **kw}
    with pytest.raises(InvalidSpec, match=match) as ei:
        License(**args)
    assert "vgpuvirt-test" not in str(ei.value) and "ab\\x00" not in str(ei.value)


def test_the_token_is_never_in_repr_and_a_missing_file_names_the_file(tmp_path: Path) -> None:
    lic = License(TOKEN)
    assert TOKEN.decode().strip() not in repr(lic) and lic.to_dict()["token_sha256"] == SHA
    with pytest.raises(InvalidSpec, match=r"license token file .*nope\.tok"):
        License.from_file(tmp_path / "nope.tok")
    with pytest.raises(InvalidSpec, match="a License"):
        VmRequest("v", license=TOKEN)  # type: ignore[arg-type]
    # what an Ansible module passes: its option mapping
    tok = tmp_path / "t.tok"
    tok.write_bytes(TOKEN)
    assert License.from_mapping({"token_file": str(tok), "feature": "vcs", "pool": "p"}) == \
        License(TOKEN, "vcs", "linux", "p")
    with pytest.raises(InvalidSpec, match="token_file and optionally"):
        License.from_mapping({"token": "x"})


# -- the plan ------------------------------------------------------------------------------------------------


def _facts(*pools: tuple[str, bool]) -> dict[str, LibvirtFacts]:
    return {"sim:t4x2": LibvirtFacts({}, {n: PoolFacts(n, active, f"/srv/{n}", {}) for n, active in pools})}


def test_the_plan_mounts_the_seed_read_only_and_records_it() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    vms = VmRequest.pool("lic", 2, gpu=(), options={"virtio_nics": []}, license=License(TOKEN, pool="seeds"))
    p = plan([inv], vms, libvirt=_facts(("seeds", True)))
    seeds = [s for s in p.steps if isinstance(s, CreateLicenseSeed)]
    defines = [s for s in p.steps if isinstance(s, DefineDomain)]
    assert [s.target for s in seeds] == ["seeds/lic-001-license-seed.iso", "seeds/lic-002-license-seed.iso"]
    assert p.steps.index(seeds[0]) < p.steps.index(defines[0])        # the volume exists before its domain
    assert read_iso(seeds[0].image)[0] == "cidata"
    dom = Domain.from_xml(defines[0].xml)
    (cd,) = dom.root.iterfind("devices/disk[@device='cdrom']")
    assert CdRom.from_element(cd) == CdRom("/srv/seeds/lic-001-license-seed.iso", "sdb", "sata")
    assert cd.find("readonly") is not None
    prov = Provenance.of_domain(dom)
    assert prov is not None and [dict(g) for g in prov.gpus] == [
        {"kind": "license-seed", "pool": "seeds", "volume": "lic-001-license-seed.iso", "token_sha256": SHA}]
    validate(dom)                                                    # libvirt's RelaxNG schema
    printed = p.format() + json.dumps(p.to_dict()) + repr(p.steps)
    assert SHA in printed and TOKEN.decode().strip() not in printed
    assert base64.b64encode(TOKEN).decode() not in printed


def test_the_seed_goes_to_the_clones_pool_and_a_missing_pool_is_refused() -> None:
    inv = inventory(SimHost.from_profile("t4x2"))
    vm = VmRequest("lic-c", gpus=(), disk=ClonedDisk("vdi", "/srv/vdi/golden.qcow2"), options={"virtio_nics": []},
                   license=License(TOKEN))
    facts = _facts(("vdi", True))
    facts["sim:t4x2"].pools["vdi"].volumes["golden.qcow2"] = "/srv/vdi/golden.qcow2"
    p = plan([inv], [vm], libvirt=facts)
    assert [s.target for s in p.steps if isinstance(s, CreateLicenseSeed)] == ["vdi/lic-c-license-seed.iso"]
    with pytest.raises(PreflightFailed, match="storage pool 'default' for the license seed does not exist"):
        plan([inv], [VmRequest("lic-d", gpus=(), license=License(TOKEN))], libvirt=_facts(("other", True)))
    with pytest.raises(PreflightFailed, match="pool 'seeds' for the license seed is not active"):
        plan([inv], [VmRequest("lic-e", gpus=(), license=License(TOKEN, pool="seeds"))],
             libvirt=_facts(("seeds", False)))


def test_the_domain_with_its_seed_is_defined_by_libvirts_parser() -> None:
    from xmlcheck import check_create  # type: ignore[import-not-found]

    inv = inventory(SimHost.from_profile("t4x2"))
    vm = VmRequest("lic-x", options={"virtio_nics": []}, license=License(TOKEN, guest="windows", pool="seeds"))
    p = plan([inv], [vm], libvirt=_facts(("seeds", True)))
    (define,) = [s for s in p.steps if isinstance(s, DefineDomain)]
    back = check_create(define.xml)
    (cd,) = back.root.iterfind("devices/disk[@device='cdrom']")
    assert cd.find("readonly") is not None and cd.find("source").get("file").endswith("lic-x-license-seed.iso")


# -- the CLI -------------------------------------------------------------------------------------------------


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def test_cli_plan_shows_the_digest_only(tmp_path: Path) -> None:
    pytest.importorskip("libvirt")
    tok = tmp_path / "client_configuration_token.tok"
    tok.write_bytes(TOKEN)
    rc, out, err = _cli("--host", "sim:t4x2", "--json", "plan", "--connect", "test:///default", "--name", "lic-cli",
                        "--license-token", str(tok), "--license-feature", "vws", "--license-pool", "default-pool")
    assert rc == 0, err
    steps = json.loads(out)["plan"]["steps"]
    (seed,) = [s for s in steps if s["action"] == "create-license-seed"]
    assert seed["token_sha256"] == SHA and seed["target"] == "default-pool/lic-cli-license-seed.iso"
    assert TOKEN.decode().strip() not in out + err


def test_cli_refuses_license_options_without_a_token() -> None:
    rc, out, err = _cli("--host", "sim:t4x2", "plan", "--name", "x", "--license-feature", "vcs")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--license-token" in err
