"""A fleet that scales (issue 25): the greedy placement evaluates a GPU again only when its state changed, so
placing P alike VMs on G GPUs costs ~G + P evaluations, not G x P (benchmarks/bench_fleet.py gives the
figures); and it places exactly as evaluating everything each time did."""

from __future__ import annotations

from typing import Any

import pytest
from provision_fixtures import l40s_host, t4_host

from vgpuvirt.errors import NoCapacity
from vgpuvirt.provision import options, placement
from vgpuvirt.provision.placement import place
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.provision.state import host_states


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = options.evaluate

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(options, "evaluate", counted)
    return calls


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_a_pool_on_a_fleet_evaluates_each_gpu_again_only_when_it_changed(monkeypatch: pytest.MonkeyPatch,
                                                                         policy: str) -> None:
    calls = counting(monkeypatch)
    hosts = host_states([t4_host(f"h{i}") for i in range(8)])        # 16 GPUs
    got, _, _ = place(VmRequest.pool("vdi", 64, gpu=VgpuRequest(type="nvidia-231")), hosts,
                   policy=policy)  # type: ignore[arg-type]
    assert len(got) == 64
    # the first VM looks at all 16 GPUs, each later one at the one GPU the VM before it changed
    assert len(calls) <= 16 + 64, len(calls)                            # was 64 x 16 = 1,024


def _without_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    real = options.rank

    def plain(vm: Any, req: Any, hosts: Any, policy: Any, order: Any, memo: Any = None) -> Any:
        return real(vm, req, hosts, policy, order, None)

    monkeypatch.setattr(placement, "rank", plain)


def _rank_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference the reused ranking is held to: every host ranked again for every VM."""
    real = options.rank

    def everything(vm: Any, host_list: Any, pol: Any, order: Any, memo: Any, last: Any) -> Any:
        req = vm.gpus[0]
        ranked, notes = real(vm, req, host_list, pol, order, memo)
        return ranked, notes, placement._Ranked((req, vm.host, vm.numa_node, vm.numa_strict), ranked, notes, None)

    monkeypatch.setattr(placement, "_rank_reusing", everything)


def _scenarios() -> list[tuple[str, list[Any], list[VmRequest]]]:
    two_gpu = VmRequest("dual", gpus=(VgpuRequest.parse("fb>=2G"), VgpuRequest.parse("fb>=4G")), start=False)
    mix = [VmRequest("whole", gpus=(VgpuRequest(mode="passthrough"),), start=False),
           *VmRequest.pool("a", 5, gpu=VgpuRequest(type="nvidia-231"), start=False), two_gpu,
           *VmRequest.pool("b", 6, gpu=VgpuRequest.parse("fb>=1G"), start=False),
           *VmRequest.pool("c", 3, gpu=VgpuRequest.parse("fb>=2G"), numa_node=1, start=False)]
    return [("t4 fleet", [t4_host(f"h{i}") for i in range(3)], mix),
            ("t4 + l40s", [t4_host("a"), l40s_host("b", nvfs=8)],
             [*VmRequest.pool("v", 9, gpu=VgpuRequest.parse("fb>=2G"), start=False), two_gpu])]


@pytest.mark.parametrize("policy", ["binpack", "spread"])
@pytest.mark.parametrize("case", range(2))
def test_the_memo_places_exactly_as_evaluating_everything(monkeypatch: pytest.MonkeyPatch, policy: str,
                                                          case: int) -> None:
    _name, invs, vms = _scenarios()[case]

    def outcome() -> object:
        try:
            return place(vms, host_states(invs), policy=policy)[:2]  # type: ignore[arg-type]
        except NoCapacity as exc:        # a refusal must be the same refusal, reasons included
            return str(exc)

    fast = outcome()
    _without_memo(monkeypatch)
    assert fast == outcome()


def test_a_pool_on_a_fleet_ranks_again_only_the_host_the_last_vm_went_to(monkeypatch: pytest.MonkeyPatch) -> None:
    # ranking every GPU of every host for each VM made a fleet's placement grow with hosts x VMs even with
    # the memo (the keys, the sort, the notes): a VM of the same kind as the one before re-ranks one host
    looked: list[int] = []
    real = options.rank

    def counted(vm: Any, req: Any, hosts: Any, *a: Any, **kw: Any) -> Any:
        looked.append(sum(len(h.gpus) for h in hosts))
        return real(vm, req, hosts, *a, **kw)

    monkeypatch.setattr(placement, "rank", counted)
    hosts = host_states([t4_host(f"h{i}") for i in range(8)])        # 16 GPUs, 2 per host
    got, _, _ = place(VmRequest.pool("vdi", 64, gpu=VgpuRequest(type="nvidia-231")), hosts, policy="spread")
    assert len(got) == 64
    assert sum(looked) <= 16 + 63 * 2, sum(looked)                     # was 64 x 16 = 1,024


@pytest.mark.parametrize("policy", ["binpack", "spread"])
@pytest.mark.parametrize("case", range(2))
def test_the_reused_ranking_places_and_explains_exactly_as_ranking_everything(
        monkeypatch: pytest.MonkeyPatch, policy: str, case: int) -> None:
    _name, invs, vms = _scenarios()[case]
    # mixed kinds and pools, plus a run of pinned and NUMA-strict VMs between two pools of one kind
    vms = [*vms, *VmRequest.pool("p", 2, gpu=VgpuRequest.parse("fb>=1G"), host=host_states(invs).popitem()[0],
                                 start=False),
           *VmRequest.pool("q", 3, gpu=VgpuRequest.parse("fb>=1G"), start=False)]

    def outcome() -> object:
        try:
            return place(vms, host_states(invs), policy=policy)[:2]  # type: ignore[arg-type]
        except NoCapacity as exc:
            return str(exc)

    fast = outcome()
    _rank_everything(monkeypatch)
    assert fast == outcome()


def test_a_pool_on_a_fleet_makes_its_eligible_lines_only_when_the_explanation_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # every VM of a pool is offered every GPU of the fleet: hosts x VMs "eligible" lines (16,000 for 32 hosts
    # of 8 VMs) made during placement made a fleet's plan grow faster than the fleet (bench_fleet.py)
    made: list[str] = []
    real = placement.Candidate

    def counted(*a: Any) -> Any:
        made.append(a[3])
        return real(*a)

    monkeypatch.setattr(placement, "Candidate", counted)
    hosts = host_states([t4_host(f"h{i}") for i in range(8)])        # 16 GPUs
    got, why, _ = place(VmRequest.pool("vdi", 64, gpu=VgpuRequest(type="nvidia-231")), hosts, policy="spread")
    assert len(got) == 64
    assert made.count("eligible") == 0 and len(made) <= 64, len(made)   # was 64 + 64 x 15
    lines = list(why)                                                   # read: every line is there
    assert [c.verdict for c in lines].count("chosen") == 64
    eligible = [c for c in lines if c.verdict == "eligible"]
    assert len(eligible) == 64 * 15
    chosen = {c.vm: (c.host, c.gpu) for c in lines if c.verdict == "chosen"}
    assert all((c.host, c.gpu) != chosen[c.vm] and c.reason.endswith("; ranked lower (spread)") for c in eligible)
    assert len(why) == len(lines) and why[0] == lines[0] and why == lines


def test_a_plan_looks_for_each_vm_s_domain_on_the_hosts_that_hold_one_not_on_every_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vgpuvirt.provision.plan import plan
    from vgpuvirt.provision.state import HostState

    looked: list[object] = []

    class Counting(dict[str, str]):
        def get(self, *a: Any) -> Any:
            looked.append(a[0])
            return super().get(*a)

    real = HostState.clone

    def clone(self: HostState) -> HostState:      # plan() works on clones of the states it is given
        c = real(self)
        c.domains = Counting(c.domains)
        return c

    monkeypatch.setattr(HostState, "clone", clone)
    invs = [t4_host(f"h{i}") for i in range(8)]
    p = plan(invs, VmRequest.pool("vdi", 64, gpu=VgpuRequest(type="nvidia-231"), start=False),
             policy="spread", states=host_states(invs))
    assert len(p.assignments) == 64
    assert len(looked) <= 64, len(looked)          # was one look per host per VM: 8 x 64 = 512


@pytest.mark.parametrize("seed", range(24))
def test_random_runs_of_kinds_place_refuse_and_explain_as_ranking_everything(monkeypatch: pytest.MonkeyPatch,
                                                                           seed: int) -> None:
    """Seeded random fleets and VM sequences (runs of one kind, kinds alternating, pinned and NUMA-strict VMs,
    two-GPU VMs, pools that overflow the fleet): the ranking reused from VM to VM (only the host the last VM went to
    ranked again) and the explanation made from it when read, against every host ranked for every VM."""
    import random
    rng = random.Random(seed)
    invs = [t4_host(f"t{i}") if rng.random() < 0.6 else l40s_host(f"l{i}", nvfs=rng.choice([2, 4, 8]))
            for i in range(rng.randint(1, 6))]
    names = [inv.host for inv in invs]
    kinds = [VgpuRequest(type="nvidia-231"), VgpuRequest.parse("fb>=1G"), VgpuRequest.parse("fb>=2G"),
             VgpuRequest.parse("fb>=4G"), VgpuRequest(mode="passthrough")]
    vms: list[VmRequest] = []
    wanted = rng.randint(4, 6 * len(invs))               # some fleets overflow: a refusal must read alike too
    while len(vms) < wanted:
        req = rng.choices(kinds, weights=[4, 4, 4, 2, 1])[0]
        extra: dict[str, Any] = {}
        if rng.random() < 0.15:
            extra["host"] = rng.choice(names)
        if rng.random() < 0.15:
            extra["numa_node"] = rng.choice([0, 1])
        if rng.random() < 0.1:
            vms.append(VmRequest(f"d{len(vms)}", gpus=(req, VgpuRequest.parse("fb>=1G")), start=False, **extra))
            continue
        vms.extend(VmRequest.pool(f"v{len(vms)}-", rng.randint(1, 8), gpu=req, start=False, **extra))
    policy = rng.choice(["binpack", "spread"])

    def outcome() -> object:
        try:
            got, why, _ = place(vms, host_states(invs), policy=policy)  # type: ignore[arg-type]
            return got, [tuple(c) for c in why]
        except NoCapacity as exc:
            return str(exc)

    fast = outcome()
    _rank_everything(monkeypatch)
    assert fast == outcome()


def test_a_plan_refuses_vm_names_given_twice_naming_each_once() -> None:
    """Counted once for the whole request (a count per name grew with VMs x VMs: 65,000 comparisons for a
    32-host pool of 8 VMs each)."""
    from vgpuvirt.errors import InvalidSpec
    from vgpuvirt.provision.plan import plan
    vms = [*VmRequest.pool("vdi", 300, gpu=VgpuRequest(type="nvidia-231")),
           *VmRequest.pool("vdi", 2, gpu=VgpuRequest(type="nvidia-231")), VmRequest.pool("x", 1)[0]]
    with pytest.raises(InvalidSpec, match="unique names") as ei:
        plan([t4_host("h1")], vms)
    assert ei.value.value == ["vdi-001", "vdi-002"]
