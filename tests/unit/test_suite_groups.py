"""The suite's xdist groups reach the scheduler. Tests that share a real part (the extra test hosts, which the
fleet test stops and restarts) carry `pytest.mark.xdist_group`, and `--dist loadgroup` runs each group on one
worker by adding the group to the test's nodeid. Under pytest 9.2 that addition was silently lost (its nodeid no
longer read the attribute pytest-xdist 3.8 sets): every group was spread over the workers, and the extra-hosts
tests could stop each other's hosts. setup.cfg pins pytest below 9.2; this test fails where that breaks again."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("suite-groups-probe")
def test_a_grouped_test_carries_its_group_under_loadgroup(request: pytest.FixtureRequest) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under xdist with --dist loadgroup (as .ci/run does)")
    assert request.node.nodeid.endswith("@suite-groups-probe"), request.node.nodeid
