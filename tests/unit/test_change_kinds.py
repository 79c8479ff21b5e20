"""One test per kind of change the layouts (and the MIG, SR-IOV, vfio and scheduler verbs) make: its ops, its line,
its undo, and for the kinds whose undo is learned from the host's answer (or whose answer can say "not done") the
reading of that answer, with the simulator's nvidia-smi (its outputs have the real tool's shapes). Each runs
through the one Runner on a simulated host and is rolled back: the host must be as before."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vgpuvirt.change.boot import InstallBootUnit
from vgpuvirt.change.driver import BindDriver
from vgpuvirt.change.mdev import CreateMdev, RemoveMdev
from vgpuvirt.change.mig import (
    PENDING_RESET,
    CreateComputeInstances,
    CreateGpuInstances,
    DestroyComputeInstances,
    DestroyGpuInstance,
    SetMigMode,
)
from vgpuvirt.change.nvidia_mode import SetMixedSize
from vgpuvirt.change.runner import Runner
from vgpuvirt.change.scheduler import SetSchedulerNvml, WriteSchedulerFile
from vgpuvirt.change.sriov import DisableVfs, EnableVfs, vf_count_step
from vgpuvirt.change.step import STEP_KINDS, HostStep, Phase
from vgpuvirt.change.vendor_vf import ClearVfType, SetVfType
from vgpuvirt.errors import DeviceError, ProvisioningError
from vgpuvirt.host.base import OpResult
from vgpuvirt.host.local import LocalHost
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.services import host_files
from vgpuvirt.services.mig.state import read_mig_state
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.pci import sysfs
from vgpuvirt.services.scheduler.model import MODPROBE_FILE, SchedulerSetting
from vgpuvirt.services.scheduler.service import read_schedulers
from vgpuvirt.sim import SimHost

T4 = PciAddress.parse("0000:3b:00.0")           # t4x2's first T4
UUID = MdevUuid.parse("5b4c1a2e-0f3d-4b8a-9c6e-1d2f3a4b5c6d")
A30 = PciAddress.parse("0000:31:00.0")          # a30-mig: MIG on, GPU instances 3 and 4 (1g.6gb at 0 and 1)
H100 = PciAddress.parse("0000:00:06.0")         # h100-sxm5: MIG off


def argvs(what: HostStep | Planned | None) -> list[list[str]]:
    """The argv of a step's ops, or of a planned undo's."""
    assert what is not None
    planned = what.item(10.0) if isinstance(what, HostStep) else what
    return [list(op.argv or ()) for op in planned.ops]


def mdevs(host: SimHost) -> set[str]:
    return set(host.read([f"{sysfs.MDEV_DEVICES}/*"]).children(sysfs.MDEV_DEVICES))


def gis(host: SimHost, index: int = 0) -> list[tuple[int, str, int]]:
    g = read_mig_state(host).gpu(index)
    assert g is not None
    return sorted((gi.id, gi.profile, gi.start) for gi in g.gpu_instances)


def test_every_kind_has_its_place_in_todays_order() -> None:
    ranks = {k: (c.phase, c.rank) for k, c in STEP_KINDS.items()}
    prep, dev = Phase.PREPARE, Phase.DEVICES
    assert ranks["remove-mdev"] == ranks["clear-vf-type"] == (prep, 10)
    assert ranks["destroy-gpu-instance"] == (prep, 12) and ranks["sriov-disable"] == (prep, 20)
    assert ranks["bind-driver"] == (prep, 30) and ranks["sriov-enable"] == (prep, 40)
    assert ranks["mig-mode"] == (prep, 42) and ranks["mixed-size"] == (prep, 45)
    assert ranks["create-gpu-instances"] == (prep, 55)
    assert ranks["set-vf-type"] == (dev, 60) and ranks["create-mdev"] == (dev, 70)
    assert ranks["scheduler-file"] == (dev, 80) and ranks["scheduler-nvml"] == (dev, 81)


def test_remove_mdev_and_its_undo_make_it_again_with_its_uuid() -> None:
    host = SimHost.from_profile("t4x2")
    t = MdevTypeId.parse("nvidia-231")
    Runner(host).run([CreateMdev(host.name, "vm", UUID, T4, t)])
    step = RemoveMdev(host.name, "", UUID, T4, t, "T4-2Q")
    assert step.describe() == f"remove mdev {UUID} (T4-2Q) from {T4}"
    assert step.item(10.0).ops[0].path == f"{sysfs.MDEV_DEVICES}/{UUID}/remove"
    assert step.to_dict() == {"action": "remove-mdev", "host": host.name, "target": str(UUID), "parent": str(T4),
                              "type": "nvidia-231"}
    r = Runner(host)
    r.run([step])
    assert str(UUID) not in mdevs(host) and step.happened(host.read([step.state_path()]))
    assert r.rollback() == [f"{host.name}: created mdev {UUID} (T4-2Q) on {T4} again"]
    assert str(UUID) in mdevs(host)
    assert host.read([sysfs.mdev(UUID, "mdev_type")]).link_name(sysfs.mdev(UUID, "mdev_type")) == "nvidia-231"


def test_clear_vf_type_and_its_undo_give_the_type_back() -> None:
    host = SimHost.from_profile("l40s-vgpu17")
    vf, t = PciAddress.parse("0000:3d:00.4"), VgpuTypeId.parse("1145")
    Runner(host).run([SetVfType(host.name, "vm", vf, t)])
    step = ClearVfType(host.name, "", vf, t, "L40S-1Q")
    assert step.describe() == f"clear vGPU type L40S-1Q from VF {vf}"
    op = step.item(10.0).ops[0]
    assert (op.op, op.value) == ("write", "0")
    r = Runner(host)
    r.run([step])
    assert host.read([sysfs.vf_type(vf)]).text(sysfs.vf_type(vf)) == "0"
    assert r.rollback() == [f"{host.name}: set vGPU type L40S-1Q on VF {vf} again"]
    assert host.read([sysfs.vf_type(vf)]).text(sysfs.vf_type(vf)) == "1145"


def test_the_vf_count_kind_follows_the_direction_and_its_undo_restores_the_count() -> None:
    host = SimHost.from_profile("a10-sriov")
    pf = PciAddress.parse("0000:41:00.0")
    up = vf_count_step(host.name, pf, 0, 4)
    down = vf_count_step(host.name, pf, 4, 0)
    assert isinstance(up, EnableVfs) and isinstance(down, DisableVfs) and down.rank < up.rank
    assert up.describe() == f"set 4 SR-IOV VFs on {pf} (from 0)"
    assert [(op.op, op.value) for op in up.item(10.0).ops if op.op == "write"] == [("write", "4")]
    numvfs = sysfs.pci(pf, "sriov_numvfs")
    r = Runner(host)
    r.run([up])
    assert host.read([numvfs]).int(numvfs) == 4
    assert r.rollback() == [f"{host.name}: set 0 SR-IOV VFs on {pf} again"]
    assert host.read([numvfs]).int(numvfs) == 0


def test_bind_driver_to_vfio_and_back() -> None:
    host = SimHost.from_profile("t4x2")
    step = BindDriver(host.name, "", T4, "nvidia", "vfio-pci")
    assert step.describe() == f"bind {T4} to vfio-pci"
    assert step.item(10.0).ops[0].path == sysfs.pci(T4, "driver_override")
    driver = sysfs.pci(T4, "driver")
    r = Runner(host)
    r.run([step])
    assert host.read([driver]).link_name(driver) == "vfio-pci" and step.happened(host.read([driver]))
    assert r.rollback() == [f"{host.name}: bound {T4} back to nvidia"]
    assert host.read([driver]).link_name(driver) == "nvidia"
    # a device that had no driver: the undo of its bind to vfio-pci unbinds it (no probe: no driver to go back to)
    undo = BindDriver(host.name, "", T4, None, "vfio-pci").undo_item(10.0)
    assert undo is not None and [op.path.rsplit("/", 1)[-1] for op in undo.ops] == ["driver_override", "unbind"]
    assert BindDriver(host.name, "", T4, None, "nvidia").undo_item(10.0) is None


def test_mixed_size_both_ways() -> None:
    host = SimHost.from_profile("l4-hetero")
    gpu = PciAddress.parse("0000:01:00.0")
    Runner(host).run([vf_count_step(host.name, gpu, 8, 0)])     # an idle GPU: its VFs hold no vGPU, but go first
    g = host.model.gpus[str(gpu)]
    was = g.heterogeneous
    step = SetMixedSize(host.name, "", gpu, on=not was)
    assert argvs(step)[0][-2:] == ["-shm", "0" if was else "1"]
    assert ("equal-size" if was else "mixed-size") in step.describe()
    r = Runner(host)
    r.run([step])
    assert g.heterogeneous is (not was)
    assert r.rollback() == [f"{host.name}: switched GPU {gpu} back to {'mixed' if was else 'equal'}-size mode"]
    assert g.heterogeneous is was


def test_mig_mode_on_then_back_off() -> None:
    host = SimHost.from_profile("h100-sxm5")
    step = SetMigMode(host.name, "", H100, 0, on=True, was=False)
    assert step.describe() == f"turn MIG mode on on {H100}"
    assert argvs(step) == [["nvidia-smi", "-i", "00000000:00:06.0", "-mig", "1"]]   # by bus id, not by index
    r = Runner(host)
    r.run([step])
    assert read_mig_state(host).gpus[0].mode_current == "Enabled"
    assert r.rollback() == [f"{host.name}: turned MIG mode off on {H100} again"]
    assert read_mig_state(host).gpus[0].mode_current == "Disabled"
    assert SetMigMode(host.name, "", H100, 0, on=True, was=True).undo_item(10.0) is None


def test_a_mig_mode_pending_a_reset_is_read_from_the_answer_and_rolled_back() -> None:
    host = SimHost.from_profile("a100-sriov")       # Ampere: a MIG mode change waits for a GPU reset
    gpu = PciAddress.parse("0000:65:00.0")          # its second A100, MIG off
    host.model.gpus[str(gpu)].processes = 1         # a CUDA process holds the GPU: the change waits for a reset
    step = SetMigMode(host.name, "", gpu, 1, on=True, was=False)
    res = host.apply(list(step.item(10.0).ops))
    assert "pending enable state" in res.results[0].stdout
    assert step.check(res.results) == PENDING_RESET                    # the tool's own words, parsed
    host.apply(list(step.undo_item(10.0).ops))                         # type: ignore[union-attr]
    r = Runner(host)
    with pytest.raises(ProvisioningError, match="pending until the GPU is reset") as err:
        try:
            r.run([step])
        except Exception as exc:
            raise r.fail(exc, "mig") from exc
    assert err.value.rollback == [f"{host.name}: turned MIG mode off on {gpu} again"]
    g = read_mig_state(host).gpu(1)
    assert g is not None and (g.mode_current, g.mode_pending) == ("Disabled", "Disabled")
    ok = OpResult(step.item(10.0).ops[0], True, rc=0, stdout="Enabled MIG Mode for GPU 00000000:65:00.0\nAll done.\n")
    assert step.check((ok,)) is None


def test_destroy_gpu_instance_is_undone_at_its_placement() -> None:
    host = SimHost.from_profile("a30-mig")
    before = gis(host)
    assert (3, "1g.6gb", 0) in before
    step = DestroyGpuInstance(host.name, "", A30, 0, gi=3, profile="1g.6gb", start=0)
    assert step.describe() == f"destroy GPU instance 3 (1g.6gb) on {A30}"
    assert argvs(step) == [["nvidia-smi", "mig", "-i", "00000000:31:00.0", "-dgi", "-gi", "3"]]
    assert argvs(step.undo_item(10.0)) == [["nvidia-smi", "mig", "-i", "00000000:31:00.0", "-cgi", "1g.6gb:0"]]
    r = Runner(host)
    r.run([step])
    assert 3 not in {i for i, _, _ in gis(host)}
    assert r.rollback() == [f"{host.name}: created GPU instance 1g.6gb on {A30} at placement 0 again"]
    assert gis(host) == before


def test_create_gpu_instances_learns_its_undo_from_the_answer() -> None:
    host = SimHost.from_profile("a30-mig")
    before = gis(host)
    step = CreateGpuInstances(host.name, "", A30, 0, profiles=("1g.6gb", "1g.6gb"), placements=(2, 3),
                              default_ci=True)
    assert step.undo_item(10.0) is None and step.undo_learned
    assert argvs(step) == [["nvidia-smi", "mig", "-i", "00000000:31:00.0", "-cgi", "1g.6gb:2,1g.6gb:3", "-C"]]
    res = host.apply(list(step.item(10.0).ops))
    made = sorted(set(i for i, _, _ in gis(host)) - {i for i, _, _ in before})
    assert len(made) == 2
    undo = step.undo_from(res.results, 10.0)
    assert undo is not None
    # the compute instances nvidia-smi made first, then exactly the GPU instances its answer named
    assert argvs(undo)[-1] == ["nvidia-smi", "mig", "-i", "00000000:31:00.0", "-dgi", "-gi",
                               ",".join(map(str, reversed(made)))]
    assert all("-dci" in a for a in argvs(undo)[:-1]) and len(argvs(undo)) == 3
    host.apply(list(undo.ops))
    assert gis(host) == before
    # through the runner: rolled back from what the answer said
    r = Runner(host)
    r.run([step])
    assert len(gis(host)) == len(before) + 2
    r.rollback()
    assert gis(host) == before
    # an answer that names nothing made: nothing to undo
    assert step.undo_from((OpResult(step.item(10.0).ops[0], False, rc=2, stderr="Insufficient resources"),),
                          10.0) is None


def test_compute_instances_create_learned_and_destroy_recreated() -> None:
    host = SimHost.from_profile("a30-mig")
    make = CreateComputeInstances(host.name, "", A30, 0, gi=3, profiles=("1g.6gb",))
    assert argvs(make) == [["nvidia-smi", "mig", "-i", "00000000:31:00.0", "-gi", "3", "-cci", "1g.6gb"]]
    r = Runner(host)
    r.run([make])
    cis = [(c.gi, c.id, c.profile_id) for c in read_mig_state(host).gpus[0].compute_instances]
    assert len(cis) == 1 and cis[0][0] == 3
    r.rollback()
    assert read_mig_state(host).gpus[0].compute_instances == ()
    # destroy one, the undo makes it again from its profile id
    Runner(host).run([make])
    (gi, ci, pid), = [(c.gi, c.id, c.profile_id) for c in read_mig_state(host).gpus[0].compute_instances]
    drop = DestroyComputeInstances(host.name, "", A30, 0, gi=gi, ids=(ci,), profiles=(str(pid),))
    assert drop.describe() == f"destroy compute instances {ci} of GPU instance {gi} on {A30}"
    r = Runner(host)
    r.run([drop])
    assert read_mig_state(host).gpus[0].compute_instances == ()
    r.rollback()
    assert [(c.gi, c.profile_id) for c in read_mig_state(host).gpus[0].compute_instances] == [(gi, pid)]


def test_scheduler_nvml_undo_sets_the_policy_nvml_reported_before() -> None:
    host = SimHost.from_profile("t4x2")
    was = read_schedulers(host, [str(T4)])[0].current
    want = SchedulerSetting(policy="fixed-share", timeslice_us=2000)
    step = SetSchedulerNvml(host.name, "", T4, want, was)
    assert step.describe() == f"set the vGPU scheduler of {T4} to {want.describe()} (now, through NVML)"
    op = step.item(10.0).ops[0]
    assert (op.op, op.value, op.argv) == ("nvml", "vgpu_scheduler_set", (T4.nvml_bus_id, "3", "1", "2000000"))
    r = Runner(host)
    r.run([step])
    assert read_schedulers(host, [str(T4)])[0].current == want
    r.rollback()
    assert read_schedulers(host, [str(T4)])[0].current == was
    assert SetSchedulerNvml(host.name, "", T4, want, None).undo_item(10.0) is None


def test_scheduler_file_undo_puts_the_file_back_and_a_file_alone_is_pending() -> None:
    host = SimHost.from_profile("t4x2")
    old = 'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:3b:00.0;RmPVMRL=0x01"\n'
    host.model.sched.modprobe["vgpuvirt-scheduler.conf"] = old
    new = 'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:3b:00.0;RmPVMRL=0x11"\n'
    step = WriteSchedulerFile(host.name, "", new, old, pending=(T4,))
    assert step.reload_pending and "pending until the driver reloads" in step.describe()
    assert not WriteSchedulerFile(host.name, "", new, old).reload_pending
    assert step.item(10.0).ops[0].path == MODPROBE_FILE
    r = Runner(host)
    r.run([step])
    assert host.model.sched.modprobe["vgpuvirt-scheduler.conf"] == new
    assert r.report().pending_reload == [f"{host.name}: {step.describe()}"] and not r.report().done
    assert r.rollback() == [f"{host.name}: put {MODPROBE_FILE} back as it was"]
    assert host.model.sched.modprobe["vgpuvirt-scheduler.conf"] == old


def test_install_boot_unit_undo_puts_back_what_was_there(tmp_path: Path) -> None:
    # the files go to this machine under tmp_path (a simulated host has no /etc), through its own LocalHost
    host = LocalHost(lock_path=str(tmp_path / "lock"), audit_path=str(tmp_path / "audit.jsonl"))
    etc = tmp_path / "etc/vgpuvirt"
    etc.mkdir(parents=True)
    (etc / "layout-boot.json").write_text("old program\n")
    (etc / "layout-boot.json").chmod(0o600)
    files = {"/etc/vgpuvirt/layout-boot.json": {"text": "new program\n", "mode": "644"},
             "/usr/lib/vgpuvirt/layout_boot.py": {"text": "print('boot')\n", "mode": "644"},
             "/etc/systemd/system/multi-user.target.wants/x.service": {"link": "/etc/systemd/system/x.service"}}
    step = InstallBootUnit(host.name, "", json.dumps(files), str(tmp_path))
    assert step.describe() == f"install the boot unit (3 files under {tmp_path})"
    argv = argvs(step)[0]
    assert argv[:2] == ["python3", "-c"] and argv[-1] == str(tmp_path)         # the files travel on stdin
    assert json.loads(step.item(10.0).ops[0].stdin or "") == files
    assert step.undo_item(10.0) is None and step.undo_learned
    r = Runner(host)
    r.run([step])
    assert (etc / "layout-boot.json").read_text() == "new program\n"
    assert (tmp_path / "usr/lib/vgpuvirt/layout_boot.py").exists()
    assert os.readlink(tmp_path / "etc/systemd/system/multi-user.target.wants/x.service") == \
        "/etc/systemd/system/x.service"
    assert r.rollback() == [f"{host.name}: {step.undone()}"]
    # the old program is back with its mode; what was not there is gone again
    assert (etc / "layout-boot.json").read_text() == "old program\n"
    assert (etc / "layout-boot.json").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "usr/lib/vgpuvirt/layout_boot.py").exists()
    assert not os.path.lexists(tmp_path / "etc/systemd/system/multi-user.target.wants/x.service")


def test_the_installers_answer_gives_the_undo_even_when_it_failed_part_way(tmp_path: Path) -> None:
    host = LocalHost(lock_path=str(tmp_path / "lock"), audit_path=str(tmp_path / "audit.jsonl"))
    (tmp_path / "a").write_text("was here\n")
    (tmp_path / "blocker").write_text("a file where a directory is needed\n")
    files = {"/a": {"text": "new\n", "mode": "644"}, "/blocker/b": {"text": "x\n", "mode": "644"}}
    step = InstallBootUnit(host.name, "", json.dumps(files), str(tmp_path))
    r = Runner(host)
    with pytest.raises(DeviceError, match="writing the files failed"):
        r.run([step])
    assert (tmp_path / "a").read_text() == "new\n"           # written before the failure
    r.rollback()
    assert (tmp_path / "a").read_text() == "was here\n"
    assert host_files.previous((OpResult(step.item(10.0).ops[0], False, rc=1, stdout=""),)) is None


def test_a_scheduler_file_that_was_absent_is_removed_by_the_undo() -> None:
    host = SimHost.from_profile("t4x2")
    assert "vgpuvirt-scheduler.conf" not in host.model.sched.modprobe
    text = 'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:3b:00.0;RmPVMRL=0x11"\n'
    step = WriteSchedulerFile(host.name, "", text)
    undo = step.undo_item(10.0)
    assert [(op.op, op.path) for op in undo.ops] == [("remove_file", MODPROBE_FILE)]
    r = Runner(host)
    r.run([step])
    assert "vgpuvirt-scheduler.conf" in host.model.sched.modprobe
    assert r.rollback() == [f"{host.name}: removed {MODPROBE_FILE} again"]
    assert "vgpuvirt-scheduler.conf" not in host.model.sched.modprobe
