"""The mutating lifecycle paths through a real sshd against the FUSE-mounted simulator, the real
mdevctl in a mount namespace for persistence, and 8 processes racing for the last 4 instances.

The mdevctl wrapper: mdevctl has no fake-root option, so the service is given an argv prefix that
runs it in a private mount namespace with the FUSE mount bound over /sys and a temp dir over
/etc/mdevctl.d (``MdevService(host, mdevctl=[...])``). The script is a constant; the paths travel
as argv, never spliced into it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]
from conftest import Testbed, require_part  # type: ignore[import-not-found]

from vgpuvirt.change.driver import prepare_vfio
from vgpuvirt.change.mdev_service import MdevService
from vgpuvirt.change.sriov import set_vf_count
from vgpuvirt.errors import NoCapacity
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.services.iommu import api as iommu
from vgpuvirt.services.vgpu import gc
from vgpuvirt.services.vgpu.vendor import VendorVgpuService

pytestmark = pytest.mark.integration

NS_SCRIPT = 'mount --bind "$1/sys" /sys && mount --bind "$2" /etc/mdevctl.d && shift 2 && exec mdevctl "$@"'


def mdevctl_in_namespace(mount: str, etc_dir: str) -> list[str]:
    """argv prefix: the real mdevctl seeing ``mount``/sys as /sys and ``etc_dir`` as /etc/mdevctl.d."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", NS_SCRIPT, "mdevctl-ns", mount, etc_dir]


@pytest.fixture
def etc_dir() -> Iterator[str]:
    require_part("mdevctl", shutil.which("mdevctl") is not None, "apt-get install mdevctl")
    d = tempfile.mkdtemp(prefix="lc-mdevctl-")
    os.makedirs(os.path.join(d, "scripts.d", "callouts"))
    os.makedirs(os.path.join(d, "scripts.d", "notifiers"))
    yield d
    shutil.rmtree(d)


def _avail(host: SSHHost, parent: str, type_id: str) -> int:
    snap = host.read([f"/sys/class/mdev_bus/{parent}/mdev_supported_types/{type_id}/available_instances"])
    return snap.int(next(iter(snap))) or 0


def test_mdev_create_remove_idempotent_over_ssh(testbed: Testbed) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        svc = MdevService(host, mdevctl=None)
        u = str(uuid.uuid4())
        before = _avail(host, "0000:d8:00.0", "nvidia-231")
        rt = host.round_trips
        assert svc.create("0000:d8:00.0", "nvidia-231", u).changed
        assert host.round_trips - rt == 2, "one read + one batch, over ssh"
        assert not svc.create("0000:d8:00.0", "nvidia-231", u).changed
        assert os.path.islink(f"{mnt}/sys/bus/mdev/devices/{u}")
        assert _avail(host, "0000:d8:00.0", "nvidia-231") == before - 1
        assert [svc.remove(u).changed, svc.remove(u).changed] == [True, False]
        assert _avail(host, "0000:d8:00.0", "nvidia-231") == before


def test_persistence_with_the_real_mdevctl_survives_a_simulated_reboot(testbed: Testbed, etc_dir: str) -> None:
    u = str(uuid.uuid4())
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        svc = MdevService(host, mdevctl=mdevctl_in_namespace(mnt, etc_dir))
        ch = svc.create("0000:d8:00.0", "nvidia-231", u, persist="persistent")
        assert ch.changed and ch.ops[-1].argv is not None and "define" in ch.ops[-1].argv
        cfg = json.loads(Path(etc_dir, "0000:d8:00.0", u).read_text())
        assert cfg["mdev_type"] == "nvidia-231" and cfg["start"] == "auto"
        assert not svc.create("0000:d8:00.0", "nvidia-231", u, persist="persistent").changed
        rec = {str(r.uuid): r for r in svc.list(defined=True)}[u]
        assert rec.active and rec.defined and rec.start == "auto"
    # "reboot": a fresh simulated host (nothing active), the same /etc/mdevctl.d
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        svc = MdevService(host, mdevctl=mdevctl_in_namespace(mnt, etc_dir))
        assert not os.path.exists(f"{mnt}/sys/bus/mdev/devices/{u}")
        restored = svc.restore()
        assert restored.changed and restored.data["started"] == [u] and not restored.data["failed"]
        assert os.path.islink(f"{mnt}/sys/bus/mdev/devices/{u}")
        assert not svc.restore().changed
        # removal stops it and undefines it
        assert svc.remove(u).changed
        assert not Path(etc_dir, "0000:d8:00.0", u).exists()
        assert not svc.remove(u).changed and svc.list(defined=True) == []


def test_persistent_without_mdevctl_on_the_host_is_a_clear_error(testbed: Testbed) -> None:
    from vgpuvirt.errors import RemoteRequirementMissing
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        svc = MdevService(host, mdevctl=["/nonexistent/mdevctl"])
        with pytest.raises(RemoteRequirementMissing, match="mdevctl"):
            svc.create("0000:d8:00.0", "nvidia-231", persist="persistent")
        assert os.listdir(f"{mnt}/sys/bus/mdev/devices") == []


def test_vendor_vgpu_sriov_iommu_and_gc_mutations_over_ssh(testbed: Testbed) -> None:
    with sim_mount(testbed.mnt_dir, "l40s-vgpu17") as mnt, testbed.ssh(mnt) as host:
        vendor = VendorVgpuService(host)
        ch = vendor.assign(1155, pf="0000:3d:00.0")
        vf = ch.data["vf"]
        assert ch.changed and not vendor.assign(1155, vf=vf).changed
        assert Path(f"{mnt}/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type").read_text().strip() == "1155"
        assert [o["kind"] for o in gc.collect(host, []).data["orphans"]] == ["vf"]
        assert gc.collect(host, [], dry_run=False).changed and not gc.collect(host, [], dry_run=False).changed
        assert Path(f"{mnt}/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type").read_text().strip() == "0"
        assert not vendor.release(vf).changed
    with sim_mount(testbed.mnt_dir, "desktop") as mnt, testbed.ssh(mnt) as host:
        assert [set_vf_count(host, "0000:05:00.0", 4)[0].changed,
                set_vf_count(host, "0000:05:00.0", 4)[0].changed] == [True, False]
        assert sorted(os.listdir(f"{mnt}/sys/bus/pci/devices/0000:05:00.0")).count("virtfn3") == 1
        assert [set_vf_count(host, "0000:05:00.0", 0)[0].changed,
                set_vf_count(host, "0000:05:00.0", 0)[0].changed] == [True, False]
        change, record, _ = prepare_vfio(host, ["0000:01:00.0"])
        assert change.changed and not prepare_vfio(host, ["0000:01:00.0"])[0].changed
        drv = os.readlink(f"{mnt}/sys/bus/pci/devices/0000:01:00.1/driver")
        assert drv.endswith("/vfio-pci")
        assert iommu.release(host, record).changed and not iommu.release(host, record).changed
        assert os.readlink(f"{mnt}/sys/bus/pci/devices/0000:01:00.0/driver").endswith("/nvidia")
        assert os.readlink(f"{mnt}/sys/bus/pci/devices/0000:01:00.1/driver").endswith("/snd_hda_intel")


RACER = """
import json, sys
from vgpuvirt.errors import NoCapacity
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.change.mdev_service import MdevService
p = json.loads(sys.argv[1])
host = SSHHost(p["ssh_host"], port=p["ssh_port"], username="root", key_filename=p["identity"],
               known_hosts=p["known_hosts"], sysfs_root=p["mnt"])
sys.stdin.readline()   # the start line: every racer is connected and waiting
host.read(["/sys/bus/mdev/devices/*"])
try:
    ch = MdevService(host, mdevctl=None).create(p["gpu"], p["type"], p["uuid"])
    print(json.dumps({"uuid": p["uuid"], "ok": ch.changed}))
except NoCapacity as exc:
    print(json.dumps({"uuid": p["uuid"], "ok": False, "error": "NoCapacity", "msg": str(exc)}))
"""


@pytest.mark.slow
def test_eight_processes_race_for_the_last_four_instances(testbed: Testbed) -> None:
    gpu, type_id = "0000:d8:00.0", "nvidia-231"          # T4-2Q: 8 per GPU
    with sim_mount(testbed.mnt_dir, "t4x2") as mnt, testbed.ssh(mnt) as host:
        svc = MdevService(host, mdevctl=None)
        first = [str(uuid.uuid4()) for _ in range(4)]
        for u in first:
            svc.create(gpu, type_id, u)
        assert _avail(host, gpu, type_id) == 4
        racers = [str(uuid.uuid4()) for _ in range(8)]
        endpoint = {"ssh_host": testbed.ssh_host, "ssh_port": testbed.ssh_port, "identity": testbed.identity,
                    "known_hosts": testbed.known_hosts}
        procs = []
        for u in racers:
            args = json.dumps({**endpoint, "mnt": mnt, "gpu": gpu, "type": type_id, "uuid": u})
            procs.append(subprocess.Popen([sys.executable, "-c", RACER, args], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        won = {r["uuid"] for r in results if r["ok"]}
        lost = [r for r in results if not r["ok"]]
        assert len(won) == 4 and len(lost) == 4
        assert all(r["error"] == "NoCapacity" for r in lost)
        on_gpu = [r for r in svc.list() if r.parent == gpu]
        uuids = [str(r.uuid) for r in on_gpu]
        assert len(uuids) == len(set(uuids)) == 8, "no UUID twice"
        assert set(uuids) == set(first) | won, "the losers leaked nothing"
        assert _avail(host, gpu, type_id) == 0
        with pytest.raises(NoCapacity):
            svc.create(gpu, type_id)
