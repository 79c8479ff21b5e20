"""SimHost.reboot(): what vanishes (VFs, VF vGPU types, MIG instances, mdevs, runtime driver changes) and what
stays (MIG mode; a pending mode becomes current), seen through sysfs and nvidia-smi as a tool would."""

from __future__ import annotations

from vgpuvirt.host.base import Op
from vgpuvirt.services.mig.state import read_mig_state
from vgpuvirt.sim import SimHost

D = "/sys/bus/pci/devices"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_a100_reboot_drops_vfs_mdevs_and_gpu_instances_but_keeps_mig_mode() -> None:
    host = SimHost.from_profile("a100-sriov")
    assert host.apply([Op.write(f"{D}/0000:17:00.4/mdev_supported_types/nvidia-700/create",
                                "73269d0f-b2c9-438d-8f28-f9e4bc6c6990")]).ok
    assert host.run(["nvidia-smi", "-i", "1", "-mig", "1"]).exit_code == 0
    before = host.fs.read(BOOT_ID)
    version = host.model.version
    host.reboot()
    snap = host.read([f"{D}/0000:17:00.0/sriov_numvfs", f"{D}/0000:65:00.0/sriov_numvfs", "/sys/bus/mdev/devices/*",
                      "/sys/class/mdev_bus/*", f"{D}/0000:17:00.0/virtfn*"])
    assert snap.text(f"{D}/0000:17:00.0/sriov_numvfs") == "0" and snap.text(f"{D}/0000:65:00.0/sriov_numvfs") == "0"
    assert not snap.glob("/sys/bus/mdev/devices/*") and not snap.glob("/sys/class/mdev_bus/*")
    assert not snap.glob(f"{D}/0000:17:00.0/virtfn*")
    state = read_mig_state(host)
    assert [(g.mode_current, g.mode_pending) for g in state.gpus] == [("Enabled", "Enabled"), ("Enabled", "Enabled")]
    assert all(not g.gpu_instances for g in state.gpus)                     # GIs do not survive a reboot
    assert host.fs.read(BOOT_ID) != before and host.model.version > version and host.model.boots == 1
    # the boot steps an operator (or a boot unit) runs bring the state back, through the same kernel paths
    assert host.run(["/usr/lib/nvidia/sriov-manage", "-e", "ALL"]).exit_code == 0
    assert host.run(["nvidia-smi", "mig", "-i", "0", "-cgi", "14,14,14,19"]).exit_code == 0
    avail = f"{D}/0000:17:00.4/mdev_supported_types/nvidia-700/available_instances"
    assert host.read([avail]).text(avail) == "1"


def test_vendor_vf_types_heterogeneous_mode_and_driver_changes_do_not_survive() -> None:
    host = SimHost.from_profile("l4-hetero")
    pf = next(a for a in host.model.gpus)
    vf = host.model.vfs(host.model.devices[pf])[0]
    number = host.model.creatable(vf)[0].number
    assert host.apply([Op.write(f"{D}/{vf.addr}/nvidia/current_vgpu_type", str(number))]).ok
    assert host.model.gpus[pf].heterogeneous
    gpu = host.model.devices[pf]
    assert host.apply([Op.write(f"{D}/{pf}/driver_override", "vfio-pci")]).ok
    host.reboot()
    assert not host.model.gpus[pf].heterogeneous                            # -shm is not persistent
    assert host.model.vfs(host.model.devices[pf]) == [] and gpu is not host.model.devices[pf]
    snap = host.read([f"{D}/{pf}/driver_override", f"{D}/{pf}/driver"])
    assert snap.raw(f"{D}/{pf}/driver_override") == "(null)\n" and snap.link(f"{D}/{pf}/driver").endswith("/nvidia")


def test_a_pending_disable_takes_effect_at_reboot_and_profiles_are_free_again() -> None:
    host = SimHost.from_profile("a30-mig")
    assert host.run(["nvidia-smi", "mig", "-dgi"]).exit_code == 0
    host.model.gpus["0000:31:00.0"].processes = 2
    res = host.run(["nvidia-smi", "-mig", "0"])
    assert res.exit_code == 0 and "pending disable state" in res.stdout
    assert read_mig_state(host).gpus[0].pending
    host.reboot()
    g = read_mig_state(host).gpus[0]
    assert (g.mode_current, g.mode_pending, g.pending) == ("Disabled", "Disabled", False)
    assert host.model.gpus["0000:31:00.0"].processes == 0                   # processes end with the boot


def test_etc_modprobe_stays_and_the_driver_loads_its_options() -> None:
    host = SimHost.from_profile("t4x2")
    host.model.sched.modprobe["vgpu-sched.conf"] = 'options nvidia NVreg_RegistryDwords="RmPVMRL=0x00010001"\n'
    assert host.model.sched.loaded["NVreg_RegistryDwords"] == ""            # written, not loaded yet
    host.reboot()
    assert host.model.sched.modprobe == {"vgpu-sched.conf":
                                         'options nvidia NVreg_RegistryDwords="RmPVMRL=0x00010001"\n'}
    assert host.model.sched.loaded["NVreg_RegistryDwords"] == "RmPVMRL=0x00010001"
