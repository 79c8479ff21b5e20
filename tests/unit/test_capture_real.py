"""The real H100 (driver 580, read-only transcript in tests/fixtures/real/h100-580), turned into a capture
file by scripts/hostdata_to_capture.py (kept in tests/fixtures/real/h100-580/capture/ with the outputs vgpuvirt
printed on that machine, at commit 97383fc): its replay answers as vgpuvirt answered there, except where that
vgpuvirt was wrong (issue #22's findings, fixed since) and where the sources differ.

vgpuvirt ran there as ``--host local`` with pynvml installed, so its inventory and metrics took the GPU facts
from NVML; a replay (like any remote host) takes them from nvidia-smi. Each difference from the recorded output
is named below with the value the host's own transcript gives; everything else must be equal."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from vgpuvirt.capture.redact import redact
from vgpuvirt.cli import main as cli_main
from vgpuvirt.host.replay import ReplayHost, save_capture

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h100-580" / "capture"
CAPTURE = HERE / "capture.json"
SERIAL, UUID = "1753024032134", "GPU-00370a4d-41ae-f094-66e0-ae98443dc8a1"


def _cli_json(*argv: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["--host", f"capture:{CAPTURE}", "--json", *argv]) == 0
    return json.loads(out.getvalue())


def _recorded(name: str) -> Any:
    return json.loads((HERE / f"recorded-{name}.json").read_text())


def test_types_replay_prints_what_vgpuvirt_printed_on_the_h100() -> None:
    assert _cli_json("types") == _recorded("types")


def test_mig_show_replays_with_the_boards_profiles_while_mig_is_off() -> None:
    """Finding 2: the recorded output threw the 7 profiles ``mig -lgip`` lists with MIG off away."""
    replay, recorded = _cli_json("mig", "show"), _recorded("mig-show")
    (r_gpu,), (l_gpu,) = replay["gpus"], recorded["gpus"]
    assert l_gpu.pop("profiles") == []
    assert [(p["id"], p["name"], p["free"], p["total"]) for p in r_gpu.pop("profiles")] == [
        (19, "1g.10gb", 7, 7), (20, "1g.10gb+me", 1, 1), (15, "1g.20gb", 4, 4), (14, "2g.20gb", 3, 3),
        (9, "3g.40gb", 2, 2), (5, "4g.40gb", 1, 1), (0, "7g.80gb", 1, 1)]
    assert replay == recorded


def test_scheduler_show_replays_with_the_loaded_policy_from_proc() -> None:
    """Finding 3: the loaded registry keys are in /proc/driver/nvidia/params (RegistryDwords empty: the
    driver's default policy, best effort); the recorded output read a sysfs file a real driver does not have."""
    (replay,), (recorded,) = _cli_json("scheduler", "show"), _recorded("scheduler-show")
    assert recorded.pop("current") is None
    assert replay.pop("current") == {"policy": "best-effort", "timeslice_us": None, "adaptive": None}
    assert replay == recorded


def test_layout_export_replays_exactly() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["--host", f"capture:{CAPTURE}", "layout", "export"]) == 0
    assert out.getvalue() == (HERE / "recorded-layout-export.txt").read_text()


def test_inventory_replays_with_nvidia_smi_in_place_of_nvml() -> None:
    replay, recorded = _cli_json("inventory"), _recorded("inventory")
    (r_gpu,), (l_gpu,) = replay["gpus"], recorded["gpus"]
    r_facts, l_facts = r_gpu.pop("nvidia"), l_gpu.pop("nvidia")
    # where the sources differ: nvidia-smi names the brand and architecture and counts no MIG device (MIG off);
    # NVML lists the vGPU calls it was refused
    differ = ("source", "product_brand", "architecture", "mig_devices", "not_supported")
    assert [r_facts.pop(k) for k in differ] == ["nvidia-smi", "NVIDIA", "Hopper", 0, []]
    assert r_facts.pop("ecc_mode") == "Enabled" and "ecc_mode" not in l_facts     # a fact added since (mobility)
    for k in differ:
        l_facts.pop(k)
    assert r_facts == l_facts        # name, UUID, 81559 MiB, Pass-Through, MIG Disabled/Disabled, ...
    assert r_gpu.pop("health") == {"healthy": True, "reasons": [], "warnings": []}   # from -q -x and dmesg
    l_gpu.pop("health")
    # finding 6: a guest is named as one, and an IOMMU folder that is there but empty is called empty
    assert l_gpu.pop("notes") == []
    (note,) = r_gpu.pop("notes")
    assert note.startswith("this OS is a VM guest") and "not a vGPU host driver" in note
    (r_iommu, r_guest), (l_iommu,) = replay.pop("warnings"), recorded.pop("warnings")
    assert "/sys/kernel/iommu_groups is empty" in r_iommu and "empty" not in l_iommu
    assert r_guest.startswith("this OS is a VM guest (nvidia-smi: Virtualization Mode Pass-Through)")
    assert replay.pop("sources") == {"sysfs": "ok", "nvidia_smi": "ok", "nvml": "not used", "kernel_log": "ok"}
    recorded.pop("sources")
    assert replay.pop("cordon") is None and "cordon" not in recorded     # a field added since (host maintenance)
    assert replay == recorded


def test_metrics_replay_with_the_readings_of_the_capture_moment() -> None:
    replay, recorded = _cli_json("metrics"), _recorded("metrics")
    (r_host,), (l_host,) = replay.pop("hosts"), recorded.pop("hosts")
    (r_gpu,), (l_gpu,) = r_host.pop("gpus"), l_host.pop("gpus")
    # a separate collection a moment later, through NVML: its own temperature and power; FB used has one meaning
    # now (finding 4: 0 used, the 480 MiB reserved apart, where NVML v1 counted them as used) and R580's
    # average_power_draw is read (finding 1: the recorded nvidia-smi path had no power at all)
    assert (r_gpu.pop("temperature_c"), r_gpu.pop("power_w")) == (41.0, 71.41)
    assert (r_gpu.pop("fb_used_mib"), r_gpu.pop("fb_reserved_mib"), l_gpu.pop("fb_used_mib")) == (0, 480, 480)
    for k in ("temperature_c", "power_w"):
        l_gpu.pop(k)
    # fields added since the recording (a passed-through GPU names its VM): none here, no libvirt was read
    assert (r_gpu.pop("vm_name"), r_gpu.pop("vm_uuid")) == (None, None) and "vm_name" not in l_gpu
    assert r_gpu == l_gpu
    assert r_host.pop("sources").pop("nvml") == "not used" and l_host.pop("sources").pop("nvml") == "ok"
    for d in (replay, recorded, r_host, l_host):
        d.pop("collected_at")
    r_host.pop("duration_s")
    l_host.pop("duration_s")
    (r_iommu, r_guest), (l_iommu,) = r_host.pop("warnings"), l_host.pop("warnings")
    assert "/sys/kernel/iommu_groups is empty" in r_iommu and "empty" not in l_iommu
    assert r_guest.startswith("this OS is a VM guest")
    assert (replay, r_host) == (recorded, l_host)


def test_the_redacted_h100_capture_hides_serial_and_uuid_and_still_replays(tmp_path: Path) -> None:
    data = json.loads(CAPTURE.read_text())
    out = redact(data)
    text = json.dumps(out.capture)
    assert SERIAL not in text and UUID not in text and UUID[4:] not in text
    assert out.replaced[SERIAL] == "0000000000001"
    path = tmp_path / "h100-redacted.json"
    save_capture(out.capture, str(path))
    inv = _cli_json("inventory")
    replay = ReplayHost(str(path))
    from vgpuvirt.services.inventory.read import inventory

    redacted_inv = inventory(replay).to_dict()
    assert redacted_inv["gpus"][0]["nvidia"]["uuid"] == out.replaced[UUID[4:]].join(("GPU-", ""))
    inv["gpus"][0]["nvidia"]["uuid"] = redacted_inv["gpus"][0]["nvidia"]["uuid"]
    assert redacted_inv == inv


def test_the_fixture_is_what_the_converter_makes_of_the_transcript() -> None:
    """The capture file is the transcript, converted: nothing added or edited by hand since."""
    import importlib.util

    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("hostdata_to_capture", repo / "scripts" / "hostdata_to_capture.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    source = repo / "tests" / "fixtures" / "real" / "h100-580"     # the transcript, copied in whole
    assert mod.convert(source) == json.loads(CAPTURE.read_text())
