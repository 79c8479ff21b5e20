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
    got, _ = place(VmRequest.pool("vdi", 64, gpu=VgpuRequest(type="nvidia-231")), hosts,
                   policy=policy)  # type: ignore[arg-type]
    assert len(got) == 64
    # the first VM looks at all 16 GPUs, each later one at the one GPU the VM before it changed
    assert len(calls) <= 16 + 64, len(calls)                            # was 64 x 16 = 1,024


def _without_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    real = options.rank

    def plain(vm: Any, req: Any, hosts: Any, policy: Any, order: Any, memo: Any = None) -> Any:
        return real(vm, req, hosts, policy, order, None)

    monkeypatch.setattr(placement, "rank", plain)


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
            return place(vms, host_states(invs), policy=policy)  # type: ignore[arg-type]
        except NoCapacity as exc:        # a refusal must be the same refusal, reasons included
            return str(exc)

    fast = outcome()
    _without_memo(monkeypatch)
    assert fast == outcome()
