"""A layout apply that fails at its LAST step, or whose batch is cut, leaves the host exactly as it was: the sysfs
tree (VFs, drivers, vGPU types, mdevs, available instances), the MIG state (mode, GPU and compute instances with
their ids and placements) and the vGPU scheduler (vgpuvirt's modprobe.d file, the policy NVML runs).

The layout used touches every family of the change engine in one apply: GPU instances destroyed and created (the
create's undo learned from nvidia-smi's answer), SR-IOV VFs re-counted, mdevs made on the new VFs, the
scheduler's file and its NVML call, the last step of the plan."""

from __future__ import annotations

from typing import Any

import pytest

from vgpuvirt.errors import ProvisioningError, TransportError
from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.services.mig.state import read_mig_state
from vgpuvirt.services.scheduler.service import read_schedulers
from vgpuvirt.sim import SimHost

CFG = parse_layout("""\
version: v1
configs:
  a:
    - devices: ['0000:17:00.0']
      mode: mig
      mig-devices: {3g.40gb: 2}
    - devices: ['0000:65:00.0']
      mode: vgpu
      sriov-vfs: 8
      vgpu-devices: {A100D-20C: 2}
      scheduler: {policy: equal-share}
""", "rollback.yaml").config()

FILE, GPU1 = "vgpuvirt-scheduler.conf", "0000:65:00.0"
GPUS = ["0000:17:00.0", GPU1]
#: What a host holds, as the kernel, nvidia-smi and the driver's files tell it.
TREE = ("/sys/bus/pci/devices/*/*", "/sys/bus/pci/devices/*/nvidia/*",
        "/sys/bus/pci/devices/*/mdev_supported_types/*/available_instances", "/sys/bus/mdev/devices/*/*",
        "/etc/modprobe.d/*")


def a100() -> SimHost:
    """The host, its vGPU scheduler set once before (vgpuvirt's file holds fixed-share for the second GPU)."""
    host = SimHost.from_profile("a100-sriov")
    host.model.sched.modprobe[FILE] = f'options nvidia NVreg_RegistryDwordsPerDevice="pci={GPU1};RmPVMRL=0x11"\n'
    return host


def state(host: SimHost) -> dict[str, Any]:
    snap = host.read(TREE)
    mig = read_mig_state(host)
    return {"sysfs": {p: (e.kind, e.text, e.target) for p, e in snap.items()},
            "mig": [(g.index, g.mode_current, g.mode_pending,
                     sorted((i.id, i.profile, i.start) for i in g.gpu_instances),
                     sorted((c.gi, c.id, c.profile_id) for c in g.compute_instances)) for g in mig.gpus],
            # the file as written, and the policy each GPU runs and will run after a driver load, as NVML and the
            # module's parameters tell them
            "scheduler": (dict(host.model.sched.modprobe),
                          [(g.address, g.current, g.pending) for g in read_schedulers(host, GPUS)])}


def test_the_plan_touches_every_family_and_ends_with_the_nvml_call() -> None:
    host = a100()
    p = verbs.plan(host, CFG)
    kinds = [s.change.kind for s in p.phase(1) + p.phase(2)]
    assert kinds == ["destroy-gpu-instance"] * 4 + ["sriov-enable", "create-gpu-instances", "scheduler-file",
                                                    "scheduler-nvml"]
    r = verbs.apply_host(host, CFG)
    assert [s.change.kind for s in r.done][-3:] == ["create-mdev", "scheduler-file", "scheduler-nvml"]
    assert verbs.check(host, CFG) == []
    assert "RmPVMRL=0x11" not in host.model.sched.modprobe[FILE]


@pytest.mark.parametrize("file_before", [True, False], ids=["file-there", "no-file"])
def test_a_failure_in_the_last_step_leaves_the_host_exactly_as_before(file_before: bool) -> None:
    host = a100() if file_before else SimHost.from_profile("a100-sriov")
    before = state(host)
    assert (FILE in host.model.sched.modprobe) is file_before
    real = host.model.sched.nvml

    def refuse_sets(op: dict[str, Any]) -> dict[str, Any]:
        # the driver refuses the scheduler change (a VM runs on the GPU): the last step of the apply fails
        if op.get("value") == "vgpu_scheduler_set" and not refused:
            refused.append(op)
            return {"ok": False, "errno": None, "rc": 19, "error": "In use by another client"}
        return real(op)

    refused: list[dict[str, Any]] = []
    host.model.sched.nvml = refuse_sets  # type: ignore[method-assign]
    with pytest.raises(ProvisioningError, match="In use by another client") as err:
        verbs.apply_host(host, CFG)
    assert refused
    # everything before the NVML call had run, and was undone, in reverse
    assert err.value.completed[-1].endswith("(the policy at every driver load)")
    assert not any("FAILED" in line for line in err.value.rollback)
    assert len(err.value.rollback) == len(err.value.completed)
    # the GPU instances phase 1 destroyed (13 first) come back last, 13 last of all, at their placements
    assert err.value.rollback[-1] == f"{host.name}: created GPU instance 1g.10gb on 0000:17:00.0 at placement 6 again"
    assert state(host) == before


class CutHost(SimHost):
    """The SSH link drops right after the host ran the batch that makes the vGPUs (phase 2): its outcome is
    unknown to the client."""

    cut = True

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        ops = request.get("ops") or ()
        if self.cut and any(o.get("op") == "nvml" and o.get("value") == "vgpu_scheduler_set" for o in ops):
            self.cut = False
            super()._exchange(request, idempotent=idempotent)
            raise TransportError(self.name, "connection lost: simulated cut")
        return super()._exchange(request, idempotent=idempotent)


def test_a_cut_batch_is_reread_and_what_happened_is_undone() -> None:
    host = CutHost.from_profile("a100-sriov")
    assert isinstance(host, CutHost)
    host.model.sched.modprobe[FILE] = a100().model.sched.modprobe[FILE]
    before = state(host)
    with pytest.raises(ProvisioningError, match="simulated cut") as err:
        verbs.apply_host(host, CFG)
    assert not host.cut
    unknown = [c for c in err.value.completed if c.endswith("(outcome unknown)")]
    assert len(unknown) == 4            # the two mdevs, the file, the NVML call
    assert not any("FAILED" in line or "had not happened" in line for line in err.value.rollback)
    assert state(host) == before
