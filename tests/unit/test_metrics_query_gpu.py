"""The metrics' NVIDIA read: ``--query-gpu`` every collection, ``-q -x`` (108 ms on a real H100) only when the
facts only it gives must be read: a host's first collection, after ``max_age_s``, and when the GPUs
``--query-gpu`` lists are not the ones the kept ``-q -x`` described. Every collection gives what a collection
that runs ``-q -x`` gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from vgpuvirt import sim
from vgpuvirt.host.base import BatchResult, Op
from vgpuvirt.observe.collect import Collector
from vgpuvirt.sim import SimHost

QX = ("nvidia-smi", "-q", "-x")


class Recording(SimHost):
    """A simulated host that notes the programs each batch runs."""

    batches: list[list[tuple[str, ...]]]

    def apply(self, ops: Sequence[Op], **kw: Any) -> BatchResult:
        self.batches.append([o.argv for o in ops if o.argv is not None])
        return super().apply(ops, **kw)


def _host(profile: str) -> Recording:
    from vgpuvirt.sim.profiles import load_profile

    h = Recording(load_profile(profile))
    h.batches = []
    h.model.telemetry.clock = lambda: 1_700_200_000.0
    return h


def _same(m: Any) -> dict[str, Any]:
    d = dataclasses.asdict(m)
    for k in ("collected_at", "duration_s", "round_trips"):
        d.pop(k)
    return d


def test_q_x_runs_on_the_first_collection_only_and_the_answers_stay_the_same() -> None:
    h = _host("l40s-vgpu17")
    now = [1000.0]
    c = Collector(clock=lambda: now[0])
    first = c.collect(h)
    now[0] += 10
    second = c.collect(h)
    assert [QX in b for b in h.batches] == [True, False]
    assert (first.round_trips, second.round_trips) == (1, 1)
    assert _same(second) == _same(first) == _same(Collector().collect(_host("l40s-vgpu17")))


def test_q_x_is_read_again_when_it_is_older_than_max_age() -> None:
    h = _host("t4x2")
    now = [1000.0]
    c = Collector(clock=lambda: now[0])
    c.static.max_age_s = 30
    c.collect(h)
    now[0] += 31
    m = c.collect(h)
    assert [QX in b for b in h.batches] == [True, True] and m.round_trips == 1


def test_a_gpu_leaving_the_driver_between_collections_makes_it_read_q_x_again() -> None:
    h = _host("t4x2")
    c = Collector(clock=lambda: 1000.0)
    before = c.collect(h)
    assert h.apply([Op.write("/sys/bus/pci/drivers/nvidia/unbind", "0000:d8:00.0")]).ok
    after = c.collect(h)
    # the kept -q -x describes two GPUs, --query-gpu lists one: read again (one more round trip), and the
    # collection is what a fresh collector sees
    assert [QX in b for b in h.batches if b] == [True, False, True] and after.round_trips == 2
    assert _same(after) == _same(Collector().collect(h)) != _same(before)


def test_without_query_gpu_the_collection_reads_q_x_as_before() -> None:
    h = _host("t4x2")
    c = Collector(clock=lambda: 1000.0)
    c.collect(h)
    # a driver whose nvidia-smi refuses one of the fields: --query-gpu fails, -q -x gives the readings
    from vgpuvirt.sim import tools

    real_run = tools.run_tool

    def no_query(model: Any, argv: list[str], stdin: str) -> Any:
        if any(a.startswith("--query-gpu=") for a in argv):
            return 2, "", 'Field "memory.reserved" is not a valid field to query.\n'
        return real_run(model, argv, stdin)

    tools.run_tool = no_query
    try:
        m = c.collect(h)
    finally:
        tools.run_tool = real_run
    assert m.round_trips == 2 and [QX in b for b in h.batches] == [True, False, True]
    assert _same(m) == _same(Collector().collect(_host("t4x2")))


@pytest.mark.parametrize("profile", sim.list_profiles())
def test_an_inventory_with_kept_facts_reads_query_gpu_and_answers_alike(profile: str) -> None:
    from vgpuvirt.services.inventory.read import inventory
    from vgpuvirt.services.nvidia.static import StaticFacts

    h = _host(profile)
    static = StaticFacts()
    plain = inventory(h).to_dict()
    first = inventory(h, static=static).to_dict()
    rt = h.round_trips
    second = inventory(h, static=static).to_dict()
    assert h.round_trips - rt == 1
    # nothing to keep where nvidia-smi fails (no GPU on the nvidia driver): -q -x says so each time
    kept = h.run(list(QX)).ok
    assert [QX in b for b in h.batches] == [True, True, not kept]
    assert second == first == plain


LGI, LGIP = ("nvidia-smi", "mig", "-lgi"), ("nvidia-smi", "mig", "-lgip")


def test_with_mig_off_everywhere_the_mig_listings_are_left_out_too() -> None:
    h = _host("t4x2")                        # no MIG on a T4: -lgi has nothing to say
    c = Collector(clock=lambda: 1000.0)
    first = c.collect(h)
    second = c.collect(h)
    assert [(QX in b, LGI in b) for b in h.batches] == [(True, True), (False, False)]
    assert _same(second) == _same(first)


def test_mig_switched_on_between_two_reads_reads_the_listings_again() -> None:
    h = _host("a30-mig")
    for argv in (["nvidia-smi", "mig", "-dgi"], ["nvidia-smi", "-i", "0", "-mig", "0"]):
        assert h.run(argv).ok
    from vgpuvirt.services.inventory.read import inventory
    from vgpuvirt.services.nvidia.static import StaticFacts

    c, static = Collector(clock=lambda: 1000.0), StaticFacts()
    c.collect(h)
    inventory(h, static=static)
    c.collect(h)
    inventory(h, static=static)
    assert [(QX in b, LGI in b) for b in h.batches] == [(True, True), (True, True), (False, False), (False, False)]
    for argv in (["nvidia-smi", "-i", "0", "-mig", "1"], ["nvidia-smi", "mig", "-cgi", "1g.6gb", "-C"]):
        assert h.run(argv).ok
    h.batches.clear()
    m = c.collect(h)
    inv = inventory(h, static=static).to_dict()
    # the MIG mode in --query-gpu differs from the kept -q -x: one more round trip reads -q -x and the listings
    assert m.round_trips == 2 and [(QX in b, LGI in b) for b in h.batches] == [(False, False), (True, True)] * 2
    assert LGIP in h.batches[3]
    assert _same(m) == _same(Collector().collect(h)) and m.gpus[0].mode == "mig"
    assert inv == inventory(h).to_dict()
    assert [g["profile"] for g in inv["gpus"][0]["nvidia"]["gpu_instances"]] == ["1g.6gb"]
