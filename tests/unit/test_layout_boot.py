"""Across reboots: apply -> simulated reboot -> the boot unit's command -> ``layout assert`` passes; the unit
passes the real ``systemd-analyze verify``; the installed script works from its own directory."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.host import layout_boot
from vgpuvirt.host.local import LocalHost
from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.layout.boot import LIB_DIR, PROGRAM, UNIT_PATH, boot_program, install_boot, unit_text
from vgpuvirt.sim.host import SimHost

LAY = parse_layout("""\
version: v1
configs:
  day: [{devices: all, mode: vgpu, vgpu-devices: {A10-4Q: 6}}]
  night: [{devices: all, mode: passthrough}]
  t4: [{devices: all, mode: vgpu, vgpu-devices: {T4-2Q: 3}}]
  l40s: [{devices: all, mode: vgpu, vgpu-devices: {L40S-8Q: 2, L40S-16Q: 1}, sizing: mixed}]
  train: [{devices: all, mode: mig, mig-devices: {"3g.40gb": 2}}]
  seven: [{devices: all, mode: mig-vgpu, mig-devices: {"1g.10gb": 7}, vgpu-devices: {A100D-1-10C: 7}}]
""", "boot.yaml")


@pytest.mark.parametrize(("profile", "config"), [("a10-sriov", "day"), ("a10-sriov", "night"), ("t4x2", "t4"),
                                                 ("l4-hetero", "l40s"), ("l40s-vgpu17", "l40s"),
                                                 ("a100-sriov", "train"), ("a100-sriov", "seven")])
def test_apply_reboot_boot_command_assert(profile: str, config: str) -> None:
    if profile == "l4-hetero":
        config = "l4"
    cfg = LAY.config(config) if config != "l4" else parse_layout(
        "version: v1\nconfigs:\n  l4: [{devices: all, mode: vgpu, vgpu-devices: {L4-4Q: 2, L4-8Q: 1}}]\n").config()
    host = SimHost.from_profile(profile)
    verbs.apply_host(host, cfg)
    program = boot_program(host, cfg)
    uuids = sorted(m["uuid"] for g in program["gpus"] for m in g["mdevs"])
    host.reboot()
    assert verbs.check(host, cfg), "the reboot should have lost something"
    rc, lines = layout_boot.run(program, fs=host.fs, locker=host._locker)
    assert rc == 0, lines
    assert verbs.check(host, cfg) == []
    after = sorted(m["uuid"] for g in boot_program(host, cfg)["gpus"] for m in g["mdevs"])
    assert after == uuids                      # the same UUIDs: domains naming them start again
    rc, lines = layout_boot.run(program, fs=host.fs, locker=host._locker)
    assert rc == 0 and "already in place" in lines[-1]


def test_mdevctl_defined_mdevs_are_left_to_mdevctl() -> None:
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, LAY.config("t4"))
    program = boot_program(host, LAY.config("t4"))
    mine = program["gpus"][0]["mdevs"][0]["uuid"]
    host.reboot()
    rc, _ = layout_boot.run(program, fs=host.fs, locker=host._locker, defined={mine})
    assert rc == 0
    present = {v.uuid for g in verbs.read_gpus(host)[1] for v in g.vgpus}
    assert mine not in present and len(present) == 5


def test_install_boot_refuses_a_host_not_in_the_layout(tmp_path: Path) -> None:
    host = SimHost.from_profile("t4x2")
    with pytest.raises(ValueError, match="layout apply"):
        install_boot(host, LAY, LAY.config("t4"), prefix=str(tmp_path), target=LocalHost())
    assert not any(tmp_path.iterdir())


def test_installed_unit_verifies_and_its_script_runs(tmp_path: Path) -> None:
    host = SimHost.from_profile("a10-sriov")
    verbs.apply_host(host, LAY.config("day"))
    done = install_boot(host, LAY, LAY.config("day"), prefix=str(tmp_path), target=LocalHost())
    assert done["devices"] == 6
    unit = tmp_path / UNIT_PATH.lstrip("/")
    text = unit.read_text()
    assert "After=nvidia-vgpu-mgr.service" in text and "Before=libvirtd.service libvirt-guests.service" in text
    analyze = shutil.which("systemd-analyze")
    require_part("systemd-analyze", analyze is not None, "apt-get install systemd (scripts/testbed.sh install)")
    assert analyze is not None
    ok = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert ok.returncode == 0 and not ok.stderr.strip(), ok.stderr      # a warning counts: it says "ignoring"
    bad = tmp_path / "bad.service"
    bad.write_text(unit_text("day").replace("Type=oneshot", "Type=sometimes"))
    no = subprocess.run([analyze, "verify", str(bad)], capture_output=True, text=True)
    assert no.returncode != 0 or "Failed to parse service type" in no.stderr
    # the shipped pair (layout_boot.py + agent.py), loaded from where it was installed, restores the host
    spec = importlib.util.spec_from_file_location("installed_boot", tmp_path / LIB_DIR.lstrip("/") / "layout_boot.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert Path(mod.agent.__file__ or "").parent == tmp_path / LIB_DIR.lstrip("/")
    import json
    program = json.loads((tmp_path / PROGRAM.lstrip("/")).read_text())
    host.reboot()
    rc, lines = mod.run(program, fs=host.fs, locker=host._locker)
    assert rc == 0, lines
    assert verbs.check(host, LAY.config("day")) == []


def test_the_installed_script_needs_nothing_but_python3(tmp_path: Path) -> None:
    """``python3 -I -S``: no site-packages, no vgpuvirt; against an empty tree (root=tmp) it reads, plans the
    missing mdev, fails its write (no such parent) and says so with exit status 1."""
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, LAY.config("t4"))
    install_boot(host, LAY, LAY.config("t4"), prefix=str(tmp_path / "inst"), target=LocalHost())
    import json
    prog = json.loads((tmp_path / "inst" / PROGRAM.lstrip("/")).read_text())
    tree = tmp_path / "tree"
    (tree / "sys/bus/pci/devices").mkdir(parents=True)
    prog["root"], prog["lock"] = str(tree), str(tmp_path / "lockdir" / "lock")
    prog["gpus"] = prog["gpus"][:1]
    prog["gpus"][0]["mdevs"] = prog["gpus"][0]["mdevs"][:1]
    (tmp_path / "p.json").write_text(json.dumps(prog))
    script = tmp_path / "inst" / LIB_DIR.lstrip("/") / "layout_boot.py"
    res = subprocess.run(["/usr/bin/python3", "-I", "-S", str(script), str(tmp_path / "p.json")],
                         capture_output=True, text=True, env={}, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "FAILED write" in res.stdout and "1 failed" in res.stdout


def test_the_boot_command_makes_the_vms_own_mdevs_in_place_of_derived_ones(tmp_path: Path) -> None:
    # issue 28: a VM provisioned after install-boot names an mdev the program does not list
    host = SimHost.from_profile("t4x2")
    cfg = LAY.config("t4")
    verbs.apply_host(host, cfg)
    program = boot_program(host, cfg)
    gpu0 = program["gpus"][0]
    theirs = "7e57ab1e-0000-4000-8000-00000000d001"
    (tmp_path / "desk-01.xml").write_text(
        "<domain type='kvm'><name>desk-01</name><metadata><vgpuvirt:provision "
        "xmlns:vgpuvirt='https://vgpuvirt.dev/xmlns/provision/1' host='h'><vgpuvirt:gpu kind='mdev' "
        f"uuid='{theirs}' parent='{gpu0['address']}' type='nvidia-231'/></vgpuvirt:provision></metadata>"
        f"<devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{theirs}'/>"
        "</source></hostdev></devices></domain>")
    (tmp_path / "broken.xml").write_text("<domain")
    claims = layout_boot.vm_mdevs(str(tmp_path))
    assert claims == [{"uuid": theirs, "parent": gpu0["address"], "type": "nvidia-231", "domain": "desk-01"}]
    host.reboot()
    rc, lines = layout_boot.run(program, fs=host.fs, locker=host._locker, claims=claims)
    assert rc == 0, lines
    on0 = {v.uuid for g in verbs.read_gpus(host)[1] if str(g.address) == gpu0["address"] for v in g.vgpus}
    assert theirs in on0 and len(on0) == 3                # the VM's own, in place of a derived one
    pairs = [("desk-01", (tmp_path / "desk-01.xml").read_text())]
    assert verbs.check(host, cfg, pairs) == []
    rc, lines = layout_boot.run(program, fs=host.fs, locker=host._locker, claims=claims)
    assert rc == 0 and "already in place" in lines[-1]    # a rerun makes nothing more
