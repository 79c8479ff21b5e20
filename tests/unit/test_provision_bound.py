"""Refuse fast (issue 25): a bound on the budgets refuses what cannot fit before any search, says which bound
decided, and lets the search run where the bound allows a fit. Soundness against an exhaustive search with the
simulator is tests/property/test_capacity_referee.py's completeness property (place() runs the bound)."""

from __future__ import annotations

import pytest
from provision_fixtures import t4_host

from vgpuvirt.errors import NoCapacity
from vgpuvirt.provision import placement, search
from vgpuvirt.provision.bound import refusal
from vgpuvirt.provision.placement import place
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.provision.state import host_state, host_states
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the searches place() runs (the real search still runs)."""
    calls: list[int] = []

    def counted(*a: object, **kw: object) -> object:
        calls.append(1)
        return search.search(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(placement, "search", counted)
    return calls


def pool(prefix: str, n: int, spec: str) -> list[VmRequest]:
    return VmRequest.pool(prefix, n, gpu=VgpuRequest.parse(spec), start=False)


@pytest.fixture(scope="module")
def large() -> object:
    return inventory(SimHost.from_profile("large"))


def test_the_large_refusal_is_decided_by_the_bound_without_a_search(large: object, searches: list[int]) -> None:
    # bench_placement's case: 30 x 8 GiB + 30 x 4 GiB on 8 A10s (24 GiB each). 1.2 s of search before.
    vms = pool("a", 30, "fb>=8G") + pool("b", 30, "fb>=4G")
    hs = host_state(large)  # type: ignore[arg-type]
    with pytest.raises(NoCapacity) as ei:
        place(vms, {hs.name: hs})
    assert searches == []
    msg = str(ei.value)
    assert "no other placement fits either" in msg
    assert "30 VMs ask for" in msg and "at most 24" in msg          # A10-8Q: 3 per GPU x 8 GPUs


def test_the_framebuffer_bound_decides_a_mix_no_single_kind_overflows(searches: list[int]) -> None:
    # two T4s (16 GiB each): 2 x 16Q (one per GPU) + 1 x 1 GiB need 33 GiB of 32; each kind alone fits
    vms = pool("big", 2, "fb>=12G") + pool("small", 1, "fb>=1G")
    with pytest.raises(NoCapacity) as ei:
        place(vms, host_states([t4_host()]))
    assert searches == []
    assert "need at least 33 GiB of framebuffer" in str(ei.value) and "at most 32 GiB" in str(ei.value)


def test_where_the_bound_allows_a_fit_the_search_runs_and_says_so(large: object, searches: list[int]) -> None:
    # 7 x 12Q take 4 GPUs and 13 x 8Q take 5: 9 > 8, yet the framebuffer (188 of 192 GiB) and each kind fit
    ids = {t.name: t.id for p in large.mdev_parents[:1] for t in p.types}  # type: ignore[attr-defined]
    vms = pool("c", 7, ids["NVIDIA A10-12Q"]) + pool("d", 13, ids["NVIDIA A10-8Q"])
    hs = host_state(large)  # type: ignore[arg-type]
    assert refusal(vms, {hs.name: hs}) is None
    with pytest.raises(NoCapacity) as ei:
        place(vms, {hs.name: hs})
    assert searches == [1]
    assert "the budgets allow a fit, but a search of up to" in str(ei.value)


def test_the_search_still_finds_what_greedy_misses(searches: list[int]) -> None:
    # search.py's own example: "any vGPU" first takes the 1 GiB type; a later VM wants 2 GiB + 4 GiB
    late = VmRequest("late", gpus=(VgpuRequest.parse("fb>=2G"), VgpuRequest.parse("fb>=4G")), start=False)
    got, _, _ = place([*pool("any", 1, "fb>=1G"), late], host_states([t4_host()]))
    assert searches == [1] and len(got) == 3


def test_a_request_no_gpu_serves_is_refused_by_name(large: object) -> None:
    hs = host_state(large)  # type: ignore[arg-type]
    why = refusal(pool("a", 1, "fb>=1G") + pool("z", 1, "fb>=48G"), {hs.name: hs})
    assert why is not None and "no GPU can serve" in why and "z-001" in why


def test_the_bound_allows_what_fits_exactly(large: object) -> None:
    # 24 x 8Q fill the 8 A10s to the last GiB: the bound must allow it (and the greedy places it)
    hs = host_state(large)  # type: ignore[arg-type]
    vms = pool("a", 12, "fb>=8G") + pool("b", 12, "fb>=8G,series=Q")
    assert refusal(vms, {hs.name: hs}) is None
    got, _, _ = place(vms, {hs.name: hs})
    assert len(got) == 24


def test_a_gpu_with_room_for_exactly_one_more_vgpu_gives_its_framebuffer() -> None:
    # each T4 holds one 8Q (equal-size: only one more 8Q fits on each): two 8Q VMs fit, the bound must agree
    inv = t4_host(mdevs=(("4b0e2a3c-1d5f-4e6a-8b7c-9d0e1f2a3b01", "0000:3b:00.0", "nvidia-233"),
                         ("4b0e2a3c-1d5f-4e6a-8b7c-9d0e1f2a3b02", "0000:d8:00.0", "nvidia-233")))
    vms = pool("last", 2, "nvidia-233")
    assert refusal(vms, host_states([inv])) is None
    got, _, _ = place(vms, host_states([inv]))
    assert sorted(str(a.gpu) for a in got) == ["0000:3b:00.0", "0000:d8:00.0"]
