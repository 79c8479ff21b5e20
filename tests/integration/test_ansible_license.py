"""Licensed desktops and the provisioning options through real ansible-playbook (issues 26 item 3 and 28 item
3): vgpu_domain and vgpu_pool, run from the installed collection against a FUSE-simulated GPU host and the
testbed's real libvirtd. The seed ISO the modules upload is read back from the pool's directory, the domain
libvirtd keeps carries the seed read-only, the TPM, secure boot and graphics asked for; a rerun changes nothing;
``state: absent`` deletes the seed; a missing network is refused with no change. The token appears nowhere in
the playbook's output at -vvv with --diff (only its SHA-256 does).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_ansible_examples import local_ansible  # type: ignore[import-not-found]
from test_ansible_fleet import (  # type: ignore[import-not-found]
    FleetHost,
    host_snapshot,
    mount_sim,
    require_fleet_parts,
    unmount_sim,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_license import read_iso  # type: ignore[import-not-found]

from vgpuvirt.errors import LibvirtError
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.xml import Domain
from vgpuvirt.xml.storage import StoragePool

pytestmark = [pytest.mark.integration, pytest.mark.slow]   # real ansible-playbook runs

PLAY = """
- hosts: hypervisors
  gather_facts: false
  vars:
    quote: "'"
    common: &common
      uri: "{{ vgpu_uri }}"
      sysfs_root: "{{ vgpu_sysfs_root }}"
      host_name: "{{ inventory_hostname }}"
  tasks:
    - name: A licensed desktop with a TPM, secure boot and VNC (check mode first)
      vgpuvirt.kvm_gpu.vgpu_domain: &desk
        <<: *common
        name: "{{ tag }}"
        state: defined
        gpus: [{type: GRID T4-2Q}]
        memory_mib: 256
        vcpus: 1
        tpm: true
        secure_boot: true
        graphics: vnc
        domain_options: {virtio_nics: []}
        license: {token_file: "{{ token_file }}", feature: vws, pool: "{{ tag }}"}
      check_mode: true
      register: dry
    - name: Made
      vgpuvirt.kvm_gpu.vgpu_domain: *desk
      register: made
    - name: Again
      vgpuvirt.kvm_gpu.vgpu_domain: *desk
      register: again
    - name: Survey for the pool
      vgpuvirt.kvm_gpu.vgpu_info:
        <<: *common
        survey: true
    - name: A licensed pool member on the same options (placed on the controller, licensed on the host)
      vgpuvirt.kvm_gpu.vgpu_pool: &pool
        <<: *common
        name: "{{ tag }}p"
        count: 1
        gpus: [{type: GRID T4-2Q}]
        memory_mib: 256
        vcpus: 1
        tpm: true
        graphics: none
        domain_options: {virtio_nics: []}
        license: {token_file: "{{ token_file }}", guest: windows, pool: "{{ tag }}"}
      register: pool
    - name: A network the host lacks is refused
      vgpuvirt.kvm_gpu.vgpu_domain:
        <<: *common
        name: "{{ tag }}-bad"
        state: defined
        gpus: [{type: GRID T4-2Q}]
        networks:
          - "nosuch-{{ tag }}"
      register: bad
      ignore_errors: true
    - name: Verify
      ansible.builtin.assert:
        that:
          - dry is changed
          - made is changed
          - again is not changed
          - pool is changed
          - bad is failed
          - "'does not exist' in bad.msg"
          - "('libvirt network ' ~ quote ~ 'nosuch-' ~ tag) in bad.msg"
"""

REMOVE = """
- hosts: hypervisors
  gather_facts: false
  tasks:
    - name: Remove the desktop
      vgpuvirt.kvm_gpu.vgpu_domain:
        name: "{{ tag }}"
        state: absent
        uri: "{{ vgpu_uri }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
        host_name: "{{ inventory_hostname }}"
    - name: Remove the pool
      vgpuvirt.kvm_gpu.vgpu_pool:
        name: "{{ tag }}p"
        state: absent
        uri: "{{ vgpu_uri }}"
        sysfs_root: "{{ vgpu_sysfs_root }}"
        host_name: "{{ inventory_hostname }}"
"""


@pytest.fixture
def sim_host(tmp_path: Path) -> Iterator[FleetHost]:
    require_fleet_parts()
    mp, pid_file = mount_sim("t4x2", tmp_path, uuid.uuid4().hex[:6])
    try:
        yield FleetHost(f"lic{uuid.uuid4().hex[:6]}", "localhost", 0, "t4x2", mp, pid_file)
    finally:
        unmount_sim(mp, pid_file)


@pytest.fixture
def seed_pool(testbed: Any, tmp_path: Path) -> Iterator[tuple[LibvirtConnection, str, Path]]:
    """A storage pool of this test's own (unique name, its directory under tmp_path) on the real libvirtd."""
    conn = LibvirtConnection(testbed.libvirt_uri)
    tag = "vgpuvirt-it-alic-" + uuid.uuid4().hex[:6]
    d = tmp_path / "pool"
    conn.define_pool(StoragePool(tag, target=str(d)))
    try:
        yield conn, tag, d
    finally:
        for dom in conn.domains():
            if dom.name.startswith(tag):
                conn.destroy(dom.name)
                conn.undefine(dom.name)
        for f in d.glob("*"):
            with contextlib.suppress(LibvirtError):
                conn.delete_volume(tag, f.name)
        conn.remove_pool(tag)
        conn.close()


def _leaks(token: str, *texts: str) -> list[str]:
    forms = {"raw": token, "base64": base64.b64encode(token.encode()).decode()}
    return [k for k, v in forms.items() if any(v in t for t in texts)]


def test_licensed_desktop_and_pool_through_ansible_playbook(testbed: Any, tmp_path: Path, sim_host: FleetHost,
                                                            seed_pool: tuple[LibvirtConnection, str, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    conn, tag, pool_dir = seed_pool
    # Ansible's own log and vgpuvirt's audit log (the modules inherit the environment: connection local)
    ansible_log, audit_log = tmp_path / "ansible.log", tmp_path / "audit.jsonl"
    monkeypatch.setenv("ANSIBLE_LOG_PATH", str(ansible_log))
    monkeypatch.setenv("VGPUVIRT_AUDIT_LOG", str(audit_log))
    token = f"vgpuvirt-it-ansible-token.{uuid.uuid4().hex}.{uuid.uuid4().hex}"
    token_file = tmp_path / "client_configuration_token.tok"
    token_file.write_text(token)
    token_file.chmod(0o600)
    before = host_snapshot(sim_host)
    extra = {"vgpu_uri": testbed.libvirt_uri, "tag": tag, "token_file": str(token_file)}
    ansible = local_ansible(tmp_path, sim_host, extra)
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "remove.yml").write_text(REMOVE)

    run = ansible.playbook(tmp_path / "play.yml", "-vvv", "--diff")
    assert run.rc == 0, run.explain()
    member = f"{tag}p-01"

    # the desktop, as libvirtd keeps it: TPM, secure boot, VNC, no NIC, the seed read-only
    dom = Domain.from_xml(conn.xml(tag, inactive=True))
    assert dom.root.find("devices/tpm/backend").get("type") == "emulator"
    assert dom.root.find("os/firmware/feature[@name='secure-boot']").get("enabled") == "yes"
    assert [g.get("type") for g in dom.root.iterfind("devices/graphics")] == ["vnc"]
    assert dom.root.find("devices/interface") is None
    iso = pool_dir / f"{tag}-license-seed.iso"
    (cd,) = dom.root.iterfind("devices/disk[@device='cdrom']")
    assert cd.find("source").get("file") == str(iso) and cd.find("readonly") is not None
    label, files, _ = read_iso(iso.read_bytes())
    assert label == "cidata"
    written = {f["path"]: f for f in yaml.safe_load(files["user-data"])["write_files"]}
    assert base64.b64decode(written["/etc/nvidia/ClientConfigToken/client_configuration_token.tok"]["content"]) \
        == token.encode()
    assert "FeatureType=2" in written["/etc/nvidia/gridd.conf"]["content"].splitlines()

    # the pool's member: its own seed (a Windows config drive), a TPM, no remote display
    mdom = Domain.from_xml(conn.xml(member, inactive=True))
    assert mdom.root.find("devices/tpm") is not None and mdom.root.find("devices/graphics") is None
    label, files, _ = read_iso((pool_dir / f"{member}-license-seed.iso").read_bytes())
    assert label == "config-2" and base64.b64encode(token.encode()) in files["openstack/latest/user_data"]

    gone = ansible.playbook(tmp_path / "remove.yml", "-vvv", "--diff")
    assert gone.rc == 0, gone.explain()
    assert not conn.exists(tag) and not conn.exists(member) and not conn.exists(f"{tag}-bad")
    assert sorted(p.name for p in pool_dir.iterdir()) == []          # both seeds deleted
    assert host_snapshot(sim_host) == before                          # the vGPUs too

    # the token: nowhere in what ansible-playbook printed or logged, its digest is (the plan lines, the audit)
    out = [run.stdout, run.stderr, gone.stdout, gone.stderr, ansible_log.read_text(), audit_log.read_text()]
    assert _leaks(token, *out) == []
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert digest in run.stdout and digest in audit_log.read_text()
    assert json.dumps(str(token_file))[1:-1] in run.stdout            # the file's path is no secret
