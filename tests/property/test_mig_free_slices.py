"""Property: what ``nvidia-smi mig -lgip`` says still fits (Free) is exactly what creating that profile again and
again achieves, after any sequence of creates and destroys, on every MIG board the simulator knows; and the
capacity model reads the same numbers (GpuBudget.gi_free) in the inventory's one round trip."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgpuvirt.services.capacity.build import gpu_budgets
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.services.mig.parse import parse_lgi, parse_lgip, parse_lgipp
from vgpuvirt.sim import SimHost, load_profile
from vgpuvirt.sim.profiles import builtin_type_tables

TABLES = ["a100", "a100d", "h100", "a30"]


def _host(tmp: Path, table: str) -> SimHost:
    f = tmp / f"prop-mig-{table}.yaml"
    if not f.exists():
        f.write_text(yaml.safe_dump({
            "name": f"prop-mig-{table}", "cpus": {"sockets": 1, "cores_per_socket": 2, "threads_per_core": 1,
                                                  "memory_mib_per_node": 8192},
            "devices": [{"address": "0000:17:00.0", "vendor": 0x10DE, "device": 0x20B5, "class": 0x030200,
                         "driver": "nvidia", "iommu_group": 1, "product": table,
                         "vgpu": {"mode": "mdev", "types": table, "mig": {"enabled": True}}}]}), encoding="utf-8")
    return SimHost(load_profile(str(f)))


@st.composite
def scenario(draw: st.DrawFn) -> tuple[str, list[tuple[str, int]]]:
    table = draw(st.sampled_from(TABLES))
    ids = [p.id for p in builtin_type_tables()[table].mig_profiles]
    steps = draw(st.lists(st.tuples(st.sampled_from(["create", "destroy"]), st.sampled_from(ids)), max_size=10))
    return table, steps


def _replay(host: SimHost, steps: list[tuple[str, int]]) -> None:
    for kind, pid in steps:
        if kind == "create":
            host.run(["nvidia-smi", "mig", "-cgi", str(pid)])
        else:
            gis = parse_lgi(host.run(["nvidia-smi", "mig", "-lgi"]).stdout)
            if gis:
                host.run(["nvidia-smi", "mig", "-dgi", "-gi", str(gis[pid % len(gis)].id)])


def _oracle(host: SimHost, compute_total: int) -> dict[str, int]:
    """Brute force, from the tool's own listings only (-lgipp placements, -lgi occupancy, -lgip totals): the
    largest set of non-overlapping free placements of each profile within the compute slices and its maximum."""
    gis = parse_lgi(host.run(["nvidia-smi", "mig", "-lgi"]).stdout)
    occupied = {s for g in gis for s in range(g.start, g.start + g.size)}
    compute_used = sum(int(g.profile.split("g.")[0]) for g in gis)
    placements = parse_lgipp(host.run(["nvidia-smi", "mig", "-lgipp"]).stdout)
    out = {}
    for p in parse_lgip(host.run(["nvidia-smi", "mig", "-lgip"]).stdout):
        starts, size = placements[(0, p.id)]
        free = [s for s in starts if not occupied & set(range(s, s + size))]
        room = min(p.total - sum(1 for g in gis if g.profile == p.name),
                   (compute_total - compute_used) // (p.compute_slices or 1))
        best = 0
        for n in range(len(free), 0, -1):
            if any(all(a + size <= b for a, b in itertools.pairwise(c)) for c in itertools.combinations(free, n)):
                best = n
                break
        out[p.name] = max(0, min(best, room))
    return out


@pytest.mark.slow   # 80 cases, 16 s in a loaded -n 2 run of the inner loop
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=scenario())
def test_lgip_free_is_what_creating_achieves(tmp_path: Path, case: tuple[str, list[tuple[str, int]]]) -> None:
    table, steps = case
    host = _host(tmp_path, table)
    _replay(host, steps)
    profiles = parse_lgip(host.run(["nvidia-smi", "mig", "-lgip"]).stdout)
    budget = gpu_budgets(inventory(host))[0]
    assert budget.gi_free == {p.name: p.free for p in profiles}
    assert _oracle(host, builtin_type_tables()[table].compute_slices) == budget.gi_free
    # MIG-backed vGPU types: the capacity model's count is the kernel's available_instances (one per unused GI)
    avail = "/sys/bus/pci/devices/0000:17:00.0/mdev_supported_types/*/available_instances"
    snap = host.read([avail])
    kernel = {p.split("/")[-2]: int(snap.text(p) or "-1") for p in snap.glob(avail)}
    mig_types = [t for t in budget.types.values() if t.mig_profile]
    assert mig_types and all(budget.fit(t.id).fits_now == kernel[t.id] for t in mig_types)
    for p in profiles:
        trial = _host(tmp_path, table)
        _replay(trial, steps)
        made = 0
        while trial.run(["nvidia-smi", "mig", "-cgi", str(p.id)]).exit_code == 0:
            made += 1
        assert made == p.free, (table, steps, p.name)
        gis = parse_lgi(trial.run(["nvidia-smi", "mig", "-lgi"]).stdout)
        used: set[int] = set()
        for gi in gis:                                     # never two GPU instances on one memory slice
            span = set(range(gi.start, gi.start + gi.size))
            assert not used & span
            used |= span
