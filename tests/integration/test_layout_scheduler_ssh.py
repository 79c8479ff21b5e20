"""A layout's vGPU scheduler policy through the real agent over a real sshd on a live FUSE mount of t4x2: no
NVML library for that root, so the registry-key path: written into the mount's /etc/modprobe.d (the agent's
atomic replace: a temporary file renamed over the target), pending until the driver reloads, in the layout's
own round trips; assert passes with a note; export writes the policy once the simulated driver reloads."""

from __future__ import annotations

from typing import Any

import pytest
from _sim_mount import sim_mount  # type: ignore[import-not-found]

from vgpuvirt.layout import parse_layout, verbs

pytestmark = pytest.mark.integration

LAYOUT = parse_layout("version: v1\nconfigs:\n  a:\n    - devices: all\n      mode: vgpu\n"
                      "      vgpu-devices: {T4-2Q: 1}\n      scheduler: {policy: fixed-share, timeslice-ms: 3}\n",
                      "s.yaml").config()


def test_layout_scheduler_registry_path_over_ssh(testbed: Any) -> None:
    with sim_mount(testbed.mnt_dir, "t4x2") as mount:
        host = testbed.ssh(sysfs_root=mount)
        try:
            r = verbs.apply_host(host, LAYOUT)
            assert r.round_trips == {"read": 1, "prepare": 0, "devices": 1}
            assert [s.text for s in r.pending_reload] == [
                "write RmPVMRL for 0000:3b:00.0, 0000:d8:00.0 to /etc/modprobe.d/vgpuvirt-scheduler.conf "
                "(pending until the driver reloads)"]
            with open(f"{mount}/etc/modprobe.d/vgpuvirt-scheduler.conf", encoding="utf-8") as f:
                assert "pci=0000:3b:00.0;RmPVMRL=0x30011;pci=0000:d8:00.0;RmPVMRL=0x30011" in f.read()
            diffs, notes = verbs.check_notes(host, LAYOUT)
            assert diffs == [] and len(notes) == 2
            again = verbs.apply_host(host, LAYOUT)
            assert not again.changed and again.round_trips == {"read": 1}
            exported = verbs.export(host).config()
            assert all(e.layout.scheduler is not None for e in exported.entries)
        finally:
            host.close()
