"""``read_host``: one round trip, named results, ``nvidia-smi -q -x`` parsed once per read.

The golden digests (tests/golden/host_read.json) were taken from the code BEFORE inventory, metrics, layouts
and pools read through ``read_host`` (each assembled its own batch then): every simulated profile and the real
H100 capture give the same inventory, metrics, layout inventory and survey, with the same round trips.
Regenerate (after review): VGPUVIRT_REGEN_GOLDEN=1 pytest tests/unit/test_host_read.py
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_doubles import RecordingHost  # type: ignore[import-not-found]
from lxml import etree
from test_metrics_nvml import fake_pynvml  # type: ignore[import-not-found]

from vgpuvirt.hosts import open_host
from vgpuvirt.layout.verbs import read_gpus
from vgpuvirt.observe.collect import Collector
from vgpuvirt.provision.pool import take_survey
from vgpuvirt.services.inventory.host_read import INVENTORY_GLOBS, MIG_TABLES, Want, read_host
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.metrics_model import MetricsSnapshot
from vgpuvirt.services.mig import state as mig
from vgpuvirt.services.nvidia.static import StaticFacts
from vgpuvirt.sim import SimHost, list_profiles

ROOT = Path(__file__).resolve().parents[2]
H100 = "capture:" + str(ROOT / "tests/fixtures/real/h100-580/capture/capture.json")
GOLDEN = ROOT / "tests/golden/host_read.json"
REGEN = os.environ.get("VGPUVIRT_REGEN_GOLDEN") == "1"


class HereSim(SimHost):
    """A simulated host that says it is this machine (where NVML may be read)."""

    @property
    def is_local(self) -> bool:
        return True


@pytest.fixture
def smi_parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times an ``nvidia-smi -q -x`` document was parsed (every parser goes through lxml)."""
    count = [0]
    real = etree.fromstring

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        if b"<nvidia_smi_log" in (text.encode() if isinstance(text, str) else bytes(text)):
            count[0] += 1
        return real(text, *args, **kwargs)

    monkeypatch.setattr(etree, "fromstring", counting)
    yield count


# ------------------------------------------------------------------------------------------ parsed once


def test_a_metrics_collection_parses_nvidia_smi_once(smi_parses: list[int]) -> None:
    c, host = Collector(), SimHost.from_profile("h100-sxm5")
    first = c.collect(host)
    assert first.up and first.sources["nvidia_smi"] == "ok" and first.round_trips == 1
    assert smi_parses[0] == 1          # the facts, the static fingerprint and the readings share one parse
    second = c.collect(host)
    assert second.round_trips == 1 and second.gpus == first.gpus
    assert smi_parses[0] == 1          # the kept -q -x is kept parsed: the second scrape parses nothing


@pytest.mark.parametrize("read", [
    lambda h: inventory(h),
    lambda h: inventory(h, static=StaticFacts(), nvidia_smi=True),
    lambda h: read_gpus(h),
], ids=["inventory", "inventory-static", "layout-read"])
def test_each_read_parses_nvidia_smi_once(smi_parses: list[int], read: Any) -> None:
    host = SimHost.from_profile("a30-mig")
    read(host)
    assert host.round_trips == 1
    assert smi_parses[0] == 1          # the inventory's facts and health (and the layout's MIG state) share it


# ------------------------------------------------------------------------------------------ named results


def test_named_results_in_one_round_trip() -> None:
    host = SimHost.from_profile("a30-mig")
    r = read_host(host, {Want.SYSFS, Want.NVIDIA_SMI, *MIG_TABLES, Want.KERNEL_LOG, Want.SCHEDULER})
    assert r.round_trips == host.round_trips == 1
    assert r.smi is not None and r.smi.result.ok and r.smi.facts.gpus and r.smi.readings
    assert r.smi.result.op is not None and r.smi.result.op.argv == ("nvidia-smi", "-q", "-x")
    for field, argv in [("mig_gpu_instances", mig.LGI_ARGV), ("mig_compute_instances", mig.LCI_ARGV),
                        ("mig_gi_profiles", mig.LGIP_ARGV), ("mig_gi_placements", mig.LGIPP_ARGV)]:
        got = getattr(r, field)
        assert got is not None and got.op.argv == argv, field
    assert r.kernel_log is not None and r.kernel_log.op.argv[0] == "dmesg"
    assert len(r.scheduler) == 1 and r.scheduler[0].op.op == "nvml"
    assert r.vgpu_query is None and r.readings is None and r.nvml is None and r.nvml_readings is None
    assert any(p.startswith("/sys/bus/pci/devices/") for p in r.snapshot) and r.health.klog is not None
    assert r.mig_state().gpus and r.inventory().gpus


def test_sysfs_only_is_one_plain_read() -> None:
    host = RecordingHost()
    r = read_host(host, {Want.SYSFS})
    assert host.calls == [("read", list(INVENTORY_GLOBS))]
    assert r.smi is None and r.kernel_log is None and r.scheduler == () and r.round_trips == 1


def test_a_kept_report_is_reused_while_it_describes_the_gpus() -> None:
    host, static = SimHost.from_profile("t4x2"), StaticFacts()
    first = read_host(host, {Want.SYSFS, Want.NVIDIA_SMI}, static=static, now=100.0)
    second = read_host(host, {Want.SYSFS, Want.NVIDIA_SMI}, static=static, now=110.0)
    assert first.round_trips == second.round_trips == 1
    assert second.smi is first.smi      # the same parsed object: not run, not parsed again
    assert second.readings is not None and set(second.readings) == set(first.smi.readings if first.smi else {})


def test_nvidia_tools_only_where_nvml_did_not_answer() -> None:
    wants = {Want.SYSFS, Want.NVIDIA_SMI, Want.KERNEL_LOG, Want.NVML_READINGS, Want.TOOLS_ONLY_WITHOUT_NVML}
    here = read_host(HereSim.from_profile("t4x2"), wants, nvml_module=fake_pynvml())
    assert here.nvml_readings is not None and here.nvml_readings.available
    # no nvidia-smi where NVML answered; the kernel log still runs: its XIDs are nowhere else
    assert here.smi is None and here.kernel_log is not None and here.health.klog is not None
    there = read_host(SimHost.from_profile("t4x2"), wants, nvml_module=fake_pynvml())
    assert there.nvml_readings is None and there.smi is not None and there.kernel_log is not None


def test_a_stale_kept_report_reads_again_only_what_the_caller_wants() -> None:
    from test_metrics_query_gpu import _host  # type: ignore[import-not-found]

    h = _host("a30-mig")
    qx, lgi, lgip = ("nvidia-smi", "-q", "-x"), mig.LGI_ARGV, mig.LGIP_ARGV
    for argv in (["nvidia-smi", "mig", "-dgi"], ["nvidia-smi", "-i", "0", "-mig", "0"]):
        assert h.run(argv).ok
    c, static = Collector(clock=lambda: 1000.0), StaticFacts()
    for _ in range(2):                  # the second time MIG is off everywhere: the listings are left out
        c.collect(h)
        inventory(h, static=static)
    for argv in (["nvidia-smi", "-i", "0", "-mig", "1"], ["nvidia-smi", "mig", "-cgi", "1g.6gb", "-C"]):
        assert h.run(argv).ok
    h.batches.clear()
    c.collect(h)
    inventory(h, static=static)
    # MIG went on: each reads -q -x again with the MIG listings IT reads (metrics -lgi; inventory -lgi, -lgip)
    assert (h.batches[1], h.batches[3]) == ([qx, lgi], [qx, lgi, lgip])


# ------------------------------------------------------------------------------------------ outputs unchanged


def _outputs(spec: str) -> dict[str, Any]:
    h = open_host(spec)
    r: dict[str, Any] = {}
    rt = h.round_trips
    r["inventory"] = inventory(h).to_dict()
    r["rt_inv"] = h.round_trips - rt
    static = StaticFacts()
    for i in range(2):
        rt = h.round_trips
        r[f"inventory_static{i}"] = inventory(h, static=static, nvidia_smi=True).to_dict()
        r[f"rt_invs{i}"] = h.round_trips - rt
    c = Collector(clock=lambda: 1000.0)
    for i in range(2):
        m = MetricsSnapshot(0.0, (c.collect(h),)).to_dict()
        for host in m["hosts"]:
            host.pop("duration_s")
        r[f"metrics{i}"] = m
    rt = h.round_trips
    r["layout_inv"] = read_gpus(h)[0].to_dict()
    r["rt_layout"] = h.round_trips - rt
    rt = h.round_trips
    r["survey"] = take_survey(h, []).to_dict()
    r["rt_survey"] = h.round_trips - rt
    h.close()
    return r


def _digest(d: dict[str, Any]) -> str:
    canonical = json.dumps(json.loads(json.dumps(d, default=str)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


SPECS = [*(f"sim:{p}" for p in list_profiles()), H100]


@pytest.mark.slow
def test_outputs_equal_the_code_before_read_host() -> None:
    got = {("capture:h100-580" if s == H100 else s): _digest(_outputs(s)) for s in SPECS}
    if REGEN:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_where_nvml_answers_the_inventory_still_knows_each_gpus_health() -> None:
    # Seen on a real H100 with pynvml installed: `inventory --json` said "health": null, so placement could not
    # skip a GPU with retired pages. NVML's readings now feed the same rules nvidia-smi's do.
    wants = {Want.SYSFS, Want.NVML_READINGS, Want.NVIDIA_SMI, Want.KERNEL_LOG, Want.TOOLS_ONLY_WITHOUT_NVML}
    read = read_host(HereSim.from_profile("t4x2"), wants, nvml_module=fake_pynvml())
    assert read.smi is None
    gpu = next(g for g in read.inventory().gpus if str(g.address) == "0000:3b:00.0")
    # the fake GPU has a retired page pending and a double-bit ECC retirement
    assert gpu.health is not None and not gpu.health.healthy and gpu.health.reasons
    healthy = read_host(HereSim.from_profile("t4x2"), wants, nvml_module=fake_pynvml(ecc=False))
    gpu = next(g for g in healthy.inventory().gpus if str(g.address) == "0000:3b:00.0")
    assert gpu.health is not None and gpu.health.healthy


def test_the_inventory_of_this_machine_through_nvml_has_health(monkeypatch: pytest.MonkeyPatch) -> None:
    # the whole path, as `vgpuvirt inventory` ran on the real H100: pynvml importable, the host this machine
    from test_real_h100 import fake_h100_pynvml  # type: ignore[import-not-found]

    monkeypatch.setitem(sys.modules, "pynvml", fake_h100_pynvml())
    inv = inventory(HereSim.from_profile("h100-sxm5"))
    assert inv.sources.get("nvml") == "ok" and inv.sources.get("nvidia_smi") == "not run"
    assert inv.sources.get("kernel_log") == "ok"
    (gpu,) = inv.gpus
    assert gpu.health is not None and gpu.health.healthy
