"""``vgpuvirt capture --redact``: no serial, UUID, host name or foreign kernel option is left, the same secret
gets the same replacement everywhere, and the redacted capture replays to the live answers with the
replacements in place."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_capture_replay import _frozen, answers  # type: ignore[import-not-found]

from vgpuvirt.capture.record import capture
from vgpuvirt.capture.redact import redact
from vgpuvirt.host.base import Op
from vgpuvirt.host.replay import ReplayHost, save_capture

CMDLINE = ("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=UUID=6f1c0b0e-2d53-4c1b-9d1c-2a8d3f6c9e11 ro quiet "
           "intel_iommu=on iommu=pt default_hugepagesz=1G hugepagesz=1G hugepages=64 "
           "vfio-pci.ids=10de:2236 secret_token=hunter2\n")
MDEV = "0b2b3c4d-1111-4222-8333-444455556666"


def _recorded(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    h = _frozen("t4x2")
    create = "/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create"
    assert h.apply([Op.write(create, MDEV)]).ok
    data = capture(h)
    data["entries"]["/proc/cmdline"] = ["f", CMDLINE, None]      # the simulator has none: as a real host's
    path = tmp_path / "live.json"
    save_capture(data, str(path))
    return ReplayHost(str(path)), data


def _with(replaced: dict[str, str], text: str) -> str:
    for old in sorted(replaced, key=len, reverse=True):
        text = text.replace(old, replaced[old])
    return text


def test_nothing_secret_is_left_and_the_replay_answers_alike(tmp_path: Path) -> None:
    live, data = _recorded(tmp_path)
    smi = next(p["stdout"] for p in data["programs"] if p["argv"] == ["nvidia-smi", "-q", "-x"])
    gpu_uuids = re.findall(r"<uuid>(GPU-[^<]+)</uuid>", smi)
    assert gpu_uuids        # (the simulator prints no serial: the real H100's capture has one, test_capture_real)
    out = redact(data)
    text = json.dumps(out.capture)
    for secret in (*gpu_uuids, MDEV, "hunter2", "6f1c0b0e-2d53-4c1b-9d1c-2a8d3f6c9e11", "BOOT_IMAGE"):
        assert secret not in text
    assert out.capture["redacted"] and not data["redacted"]          # the original is left as it was
    assert out.capture["entries"]["/proc/cmdline"][1] == ("intel_iommu=on iommu=pt default_hugepagesz=1G "
                                                          "hugepagesz=1G hugepages=64 vfio-pci.ids=10de:2236\n")
    # consistently: the mdev's directory and the vGPU listing name the same replacement
    new_mdev = out.replaced[MDEV]
    assert f"/sys/bus/mdev/devices/{new_mdev}" in out.capture["entries"]
    assert len(set(out.replaced.values())) == len(out.replaced)      # two secrets never share a replacement
    path = tmp_path / "redacted.json"
    save_capture(out.capture, str(path))
    assert json.dumps(answers(ReplayHost(str(path))), sort_keys=True) == _with(
        out.replaced, json.dumps(answers(live), sort_keys=True))


def test_the_host_name_goes_wherever_it_appears(tmp_path: Path) -> None:
    _, data = _recorded(tmp_path)
    data["host"] = "ssh://root@gpu7.corp.example:2222"
    data["programs"][0]["stderr"] = "warning from gpu7.corp.example\n"
    out = redact(data)
    assert out.capture["host"] == "ssh://root@redacted-host:2222"
    assert "gpu7.corp.example" not in json.dumps(out.capture)


def test_the_kernel_log_keeps_the_nvidia_lines_and_where_it_ends() -> None:
    data: dict[str, Any] = {"host": "x", "entries": {}, "nvml": [], "programs": [
        {"argv": ["dmesg"], "rc": 0, "stderr": "", "errno": None, "stdout":
         "[    1.0] Command line: BOOT_IMAGE=/vmlinuz root=/dev/sda1\n"
         "[    2.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
         "[    9.0] e1000e: eth0 NIC Link is Up on host gpu7\n"}]}
    log = redact(data).capture["programs"][0]["stdout"]
    assert log == ("[    2.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
                   "[    9.0] (other kernel messages redacted)\n")
