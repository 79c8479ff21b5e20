"""Licensed desktops on the real libvirtd (qemu:///system), issue 26: the seed ISO is uploaded into a storage pool
through libvirt's stream API, read back from the pool's directory and checked file by file; the domain libvirtd
keeps mounts it read-only and passes libvirt's schema; teardown deletes it; a failed run deletes it; the token
is in no log line, no audit record and no CLI output (its SHA-256 is). The VMs have no vGPU started (no VFIO
in this kernel): the library test uses none, the CLI test defines an mdev VM from the simulator without
starting it."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lxml import etree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from conftest import require_part  # type: ignore[import-not-found]
from test_license import read_iso  # type: ignore[import-not-found]

from vgpuvirt.cli import main
from vgpuvirt.errors import LibvirtError, ProvisioningError
from vgpuvirt.host.local import LocalHost
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VmRequest, apply, plan, provision, teardown
from vgpuvirt.provision.license import License
from vgpuvirt.provision.run import gather
from vgpuvirt.xml import CdRom, Domain
from vgpuvirt.xml.schema import validate
from vgpuvirt.xml.storage import StoragePool
from vgpuvirt.xml.templates import template_path

pytestmark = pytest.mark.integration
NO_NIC: dict[str, object] = {"virtio_nics": [], "hyperv": False, "disable_arch_capabilities": True}


def _token() -> bytes:
    # unique per test: a hit in a shared log can only come from this test
    return f"vgpuvirt-it-token.{uuid.uuid4().hex}.{uuid.uuid4().hex}".encode()


def _leaks(token: bytes, *texts: str) -> list[str]:
    """Which of the token's forms (raw, base64) appear in ``texts``."""
    forms = {"raw": token.decode(), "base64": base64.b64encode(token).decode()}
    return [k for k, v in forms.items() if any(v in t for t in texts)]


@pytest.fixture
def conn(testbed: Any) -> Iterator[LibvirtConnection]:
    c = LibvirtConnection(testbed.libvirt_uri)
    try:
        assert c.driver
    except LibvirtError as exc:
        require_part("libvirtd", False, f"cannot connect to {testbed.libvirt_uri}: {exc}")
    yield c
    c.close()


@pytest.fixture
def pool(conn: LibvirtConnection, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    tag = "vgpuvirt-it-lic-" + uuid.uuid4().hex[:6]
    d = tmp_path / "pool"
    conn.define_pool(StoragePool(tag, target=str(d)))
    try:
        yield tag, d
    finally:
        for dom in conn.domains():
            if dom.name.startswith(tag):
                conn.destroy(dom.name)
                conn.undefine(dom.name)
        for f in d.glob("*"):
            with contextlib.suppress(LibvirtError):
                conn.delete_volume(tag, f.name)
        conn.remove_pool(tag)


def test_seed_is_uploaded_mounted_and_removed(conn: LibvirtConnection, pool: tuple[str, Path], tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tag, pool_dir = pool
    audit_log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(audit_log))
    caplog.set_level(logging.DEBUG)
    token = _token()
    vm = VmRequest(tag, gpus=(), memory_mib=128, vcpus=1, start=False, options=NO_NIC,
                   license=License(token, feature="vws", pool=tag))
    result = provision(LocalHost(), conn, [vm])

    iso = pool_dir / f"{tag}-license-seed.iso"
    label, files, _ = read_iso(iso.read_bytes())
    assert label == "cidata" and sorted(files) == ["meta-data", "user-data"]
    doc = yaml.safe_load(files["user-data"])
    written = {f["path"]: f for f in doc["write_files"]}
    assert base64.b64decode(written["/etc/nvidia/ClientConfigToken/client_configuration_token.tok"]["content"]) \
        == token
    assert "FeatureType=2" in written["/etc/nvidia/gridd.conf"]["content"].splitlines()
    vol_xml = conn.raw.storageVolLookupByPath(str(iso)).XMLDesc(0)   # libvirtd probes it: raw or iso
    assert "<format type='iso'/>" in vol_xml or "<format type='raw'/>" in vol_xml

    xml = conn.xml(tag, inactive=True)                 # as libvirtd keeps it
    validate(xml)
    (cd,) = Domain.from_xml(xml).root.iterfind("devices/disk[@device='cdrom']")
    assert CdRom.from_element(cd) == CdRom(str(iso), "sdb", "sata") and cd.find("readonly") is not None

    down = teardown(LocalHost(), conn, [tag])           # disks kept by default, the seed is not
    assert f"{LocalHost().name}: deleted license seed {tag}/{iso.name}" in down.removed, down.removed
    assert not iso.exists() and not conn.exists(tag)

    sha = hashlib.sha256(token).hexdigest()
    records = audit_log.read_text()
    assert sha in records and "create license seed" in records
    assert _leaks(token, caplog.text, records, json.dumps(result.to_dict()), json.dumps(down.to_dict())) == []


def test_a_failed_run_deletes_the_seed_it_made(conn: LibvirtConnection, pool: tuple[str, Path]) -> None:
    tag, pool_dir = pool
    host = LocalHost()
    vm = VmRequest(f"{tag}-x", gpus=(), memory_mib=128, vcpus=1, start=False, options=NO_NIC,
                   license=License(_token(), pool=tag))
    facts: dict[str, Any] = {}
    invs, doms = gather({host.name: host}, {host.name: conn}, facts)
    p = plan(invs, [vm], domains=doms, libvirt=facts)
    # another client takes the name after the plan: the define fails after the seed was uploaded
    conn.define(f"<domain type='kvm'><name>{vm.name}</name><uuid>{uuid.uuid4()}</uuid>"
                "<memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>")
    with pytest.raises(ProvisioningError) as ei:
        apply(p, host, conn)
    assert any("deleted license seed" in line for line in ei.value.rollback), ei.value.rollback
    assert list(pool_dir.glob("*.iso")) == []


def test_cli_provision_and_teardown_print_the_digest_only(conn: LibvirtConnection, pool: tuple[str, Path],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    tag, pool_dir = pool
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    token = _token()
    tok = tmp_path / "client_configuration_token.tok"
    tok.write_bytes(token)
    name = f"{tag}-cli"
    # the vdi template without its NIC: the testbed's libvirtd has no 'default' network
    tpl = etree.parse(str(template_path("vdi")))
    for nic in tpl.getroot().iterfind("devices/interface"):
        nic.getparent().remove(nic)
    tpl.write(str(tmp_path / "vdi-no-nic.xml"))
    outs: list[str] = []
    for argv in (["provision", "--name", name, "--no-start", "--license-token", str(tok), "--license-pool", tag,
                  "--template", str(tmp_path / "vdi-no-nic.xml"), "-vv"],
                 ["teardown", name, "-vv"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["--host", "sim:t4x2", "--json", *argv[:1], "--connect", conn.uri, *argv[1:]])
        assert rc == 0, capfd.readouterr().err
        outs.append(out.getvalue())
    made, gone = (json.loads(o) for o in outs)
    (seed,) = [s for s in made["plan"]["steps"] if s["action"] == "create-license-seed"]
    assert seed["token_sha256"] == hashlib.sha256(token).hexdigest()
    assert any("deleted license seed" in line for line in gone["removed"]), gone
    assert list(pool_dir.glob("*.iso")) == [] and not conn.exists(name)
    err = capfd.readouterr()
    assert _leaks(token, *outs, err.out, err.err, (tmp_path / "audit.jsonl").read_text()) == []
