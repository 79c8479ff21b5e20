"""The real mdevctl (Debian package) against the live FUSE simulator, in a mount namespace where the
mount's sys/ is bound over /sys (TESTBED.md): it must see the profile's parents, types and counts, and its
start/stop must create/remove devices in the simulator exactly like an in-process SimHost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.host.base import Op
from vgpuvirt.host.local import LocalHost
from vgpuvirt.sim import SimHost

pytestmark = pytest.mark.integration


# Fixed script: binds the tree and the config dir, then runs mdevctl with the remaining argv.
NS_SCRIPT = 'mount --bind "$1/sys" /sys && mount --bind "$2" /etc/mdevctl.d && shift 2 && exec mdevctl "$@"'
AVAIL = "/sys/class/mdev_bus/*/mdev_supported_types/*/available_instances"


@pytest.fixture(scope="module")
def etc_dir() -> Iterator[str]:
    require_part("mdevctl", shutil.which("mdevctl") is not None and shutil.which("unshare") is not None
                 and os.path.isdir("/etc/mdevctl.d"), "apt-get install mdevctl (util-linux for unshare)")
    d = tempfile.mkdtemp(prefix="mdevctl-etc-")
    # mdevctl refuses to run without its callout/notifier dirs (normally shipped under /etc/mdevctl.d).
    os.makedirs(os.path.join(d, "scripts.d", "callouts"))
    os.makedirs(os.path.join(d, "scripts.d", "notifiers"))
    yield d
    shutil.rmtree(d)


def mdevctl(mount: str, etc: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", NS_SCRIPT, "sh", mount, etc,
                           *args], capture_output=True, text=True, check=False, timeout=60)


def expected_types(host: SimHost) -> dict[str, dict[str, dict[str, Any]]]:
    """What mdevctl should print, computed from an in-process SimHost of the same profile."""
    snap = host.read(["/sys/class/mdev_bus/*/mdev_supported_types/*/*"])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p in snap.glob(AVAIL):
        parts = p.split("/")
        parent, t = parts[4], parts[6]
        base = "/".join(parts[:-1])
        info: dict[str, Any] = {"available_instances": int(snap.text(p) or "-1"),
                                "device_api": snap.text(f"{base}/device_api"), "name": snap.text(f"{base}/name")}
        desc = snap.text(f"{base}/description")
        if desc:
            info["description"] = ", ".join(desc.splitlines())
        out.setdefault(parent, {})[t] = info
    return out


def mdevctl_types(mount: str, etc: str) -> dict[str, dict[str, dict[str, Any]]]:
    r = mdevctl(mount, etc, "types", "--dumpjson")
    assert r.returncode == 0, r.stderr
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in json.loads(r.stdout):
        for parent, types in obj.items():
            for entry in types:
                out.setdefault(parent, {}).update(entry)
    return out


@pytest.mark.parametrize("profile", ["t4x2", "gvtg", "a100-sriov"])
def test_mdevctl_types_lists_the_profile(testbed: Any, etc_dir: str, profile: str) -> None:
    with sim_mount(testbed.mnt_dir, profile) as mount:
        got = mdevctl_types(mount, etc_dir)
    want = expected_types(SimHost.from_profile(profile))
    assert sorted(got) == sorted(want)
    assert got == want
    assert sum(len(t) for t in got.values()) > 0


def test_mdevctl_start_stop_change_the_simulator_like_a_create_write(testbed: Any, etc_dir: str,
                                                                    tmp_path: Any) -> None:
    uuid = "a1b2c3d4-0000-4000-8000-0000000000aa"
    gpu = "0000:3b:00.0"
    twin = SimHost.from_profile("t4x2")       # the same create, done in-process: the expected counts
    assert twin.apply([Op.write(f"/sys/class/mdev_bus/{gpu}/mdev_supported_types/nvidia-231/create", uuid)]).ok
    fresh = SimHost.from_profile("t4x2").read([AVAIL])
    with sim_mount(testbed.mnt_dir, "t4x2") as mount:
        local = LocalHost(mount, lock_path=str(tmp_path / "lock"))
        r = mdevctl(mount, etc_dir, "start", "-u", uuid, "-p", gpu, "-t", "nvidia-231")
        assert r.returncode == 0, r.stderr
        after = local.read([AVAIL, "/sys/bus/mdev/devices/*"])
        want = twin.read([AVAIL])
        assert {p: after.int(p) for p in want} == {p: want.int(p) for p in want}
        assert after.has(f"/sys/bus/mdev/devices/{uuid}")
        listed = mdevctl(mount, etc_dir, "list", "--dumpjson")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == [{gpu: [{uuid: {"mdev_type": "nvidia-231", "start": "manual",
                                                            "attrs": []}}]}]
        refused = mdevctl(mount, etc_dir, "start", "-u", "a1b2c3d4-0000-4000-8000-0000000000ab", "-p", gpu,
                          "-t", "nvidia-232")
        assert refused.returncode != 0
        assert f"No available instances of nvidia-232 on {gpu}" in refused.stderr
        r = mdevctl(mount, etc_dir, "stop", "-u", uuid)
        assert r.returncode == 0, r.stderr
        back = local.read([AVAIL, "/sys/bus/mdev/devices/*"])
        assert {p: back.int(p) for p in fresh} == {p: fresh.int(p) for p in fresh}
        assert not back.glob("/sys/bus/mdev/devices/*")
        assert mdevctl(mount, etc_dir, "list", "--dumpjson").stdout.strip() in ("", "[]")
