"""A pool counted across the fleet (issue 16): the controller's placement from the hosts' surveys
(vgpuvirt.provision.pool) and the vgpu_pool module's per-host share, in-process against SimHosts and
libvirt's test driver. The real fleet run over sshd (sessions counted in sshd's log) is
tests/integration/test_ansible_fleet.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import require_part  # type: ignore[import-not-found]
from test_ansible_modules import Runner, _reset, _SharedConn, mdevs, sim  # type: ignore[import-not-found]

from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.provision import VgpuRequest, VmRequest
from vgpuvirt.provision.pool import Survey, member_index, members, place_pool, take_survey

PROFILES = ("t4x2", "l40s-vgpu17", "mixed")


@pytest.fixture
def conn() -> Iterator[Any]:
    """test:///default kept open for the whole test (as in test_ansible_modules)."""
    import importlib.util

    require_part("libvirt-python", importlib.util.find_spec("libvirt") is not None, "pip install libvirt-python")
    c = _SharedConn("test:///default")
    _reset(c)
    yield c
    _reset(c)
    c.really_close()
TEMPLATE = VmRequest(name="t", gpus=(VgpuRequest(min_framebuffer_mib=2048, series="Q"),), memory_mib=512, start=False)


def surveys(hosts: list[Any], pairs: dict[str, list[tuple[str, str]]] | None = None) -> list[Survey]:
    """Each host's survey as it travels: through JSON (an Ansible fact), validated on the way back."""
    return [Survey.from_dict(json.loads(json.dumps(take_survey(h, (pairs or {}).get(h.name, [])).to_dict())))
            for h in hosts]


def fleet() -> list[Any]:
    return [sim(p, name=f"hv{i}") for i, p in enumerate(PROFILES, 1)]


def test_member_names_round_trip_and_refuse_others() -> None:
    assert members("vdi", 3) == ["vdi-01", "vdi-02", "vdi-03"]
    assert [member_index("vdi", n) for n in ("vdi-01", "vdi-100", "vdi-1", "vdi-007", "vdix-01", "vdi-01a")] == \
        [1, 100, None, None, None, None]
    for bad in ("", "-x", "a b", "x;rm", "../x"):
        with pytest.raises(InvalidSpec, match="pool name"):
            members(bad, 1)
    with pytest.raises(InvalidSpec, match="pool count"):
        members("vdi", -1)


def test_count_is_fleet_wide_and_each_member_placed_once() -> None:
    hosts = fleet()
    sv = surveys(hosts)
    spread = place_pool(sv, "vdi", 8, TEMPLATE, policy="spread")
    assert sorted(n for v in spread.shares.values() for n in v) == members("vdi", 8)
    assert all(spread.shares[h.name] for h in hosts), spread.shares        # every host takes a share
    # binpack fills the first host before the next: 8 x 2 GiB fit the two T4s of hv1
    binpack = place_pool(sv, "vdi", 8, TEMPLATE)
    assert binpack.to_dict()["per_host"] == {"hv1": 8, "hv2": 0, "hv3": 0}
    # and it overflows to the next host when the first is full (a T4 holds 8 x 2Q: 16 on hv1)
    big = place_pool(sv, "vdi", 20, TEMPLATE)
    assert big.to_dict()["per_host"]["hv1"] == 16 and sum(big.to_dict()["per_host"].values()) == 20
    # placement touched nothing
    assert all(not mdevs(h) for h in hosts)


def test_too_large_a_pool_says_so_for_the_fleet() -> None:
    two = [sim("t4x2", name="a"), sim("t4x2", name="b")]
    with pytest.raises(NoCapacity, match=r"pool vdi of 40.*does not fit the fleet"):
        place_pool(surveys(two), "vdi", 40, TEMPLATE)
    # a fleet where the pool fits once a PF's SR-IOV VFs exist says what to enable
    with pytest.raises(NoCapacity, match="fits only after SR-IOV is enabled: enable 32 SR-IOV VFs on 0000:41"):
        place_pool(surveys(fleet()), "vdi", 500, TEMPLATE)


def test_duplicate_host_names_and_bad_surveys_are_refused() -> None:
    a, b = sim("t4x2", name="same"), sim("t4x2", name="same")
    with pytest.raises(InvalidSpec, match="distinct host names"):
        place_pool(surveys([a, b]), "vdi", 1, TEMPLATE)
    good = take_survey(a, []).to_dict()
    for bad in (None, {}, {**good, "version": 99}, {**good, "host": ""}, {**good, "snapshot": []},
                {**good, "domains": [["only-a-name"]]}, {**good, "snapshot": {"/sys/x": ["q", 1, None]}}):
        with pytest.raises(InvalidSpec, match="h9's survey"):
            Survey.from_dict(bad, "h9's survey")


def _pool(host: Any, c: Any, **args: Any) -> dict[str, Any]:
    base = {"name": "vdi", "uri": "test:///default", "gpus": [{"min_framebuffer_mib": 2048, "series": "Q"}],
            "memory_mib": 512, "host_name": host.name}
    return Runner("vgpu_pool", host, c)(**{**base, **args})


def test_module_applies_its_share_converges_shrinks_and_removes(conn: Any) -> None:
    hosts = fleet()
    pool = place_pool(surveys(hosts), "vdi", 6, TEMPLATE, policy="spread")
    h1 = hosts[0]
    share = pool.shares["hv1"]
    # check mode: the plan and the diff, nothing made
    res = _pool(h1, conn, check=True, count=6, placed=share)
    assert res["changed"] is True and res["diff"]["before"] == {"members": {}}
    assert res["diff"]["after"] == {"members": {n: "defined" for n in share}}
    assert not mdevs(h1) and not [d for d in conn.domains() if d.name.startswith("vdi-")]
    # the real run: the default state is defined (nothing is started)
    res = _pool(h1, conn, count=6, placed=share)
    assert res["changed"] is True and res["members"] == {n: "defined" for n in share}
    assert len(mdevs(h1)) == len(share)
    assert {d.name: d.active for d in conn.domains() if d.name.startswith("vdi-")} == {n: False for n in share}
    # rerun: nothing to do
    assert _pool(h1, conn, count=6, placed=share)["changed"] is False
    # the next survey sees the members where they are: the fleet plan keeps them on hv1
    pairs = {"hv1": list(conn.domain_xml_pairs())}
    again = place_pool(surveys(hosts, pairs), "vdi", 6, TEMPLATE, policy="spread")
    assert again.shares["hv1"] == share and again.plan is not None
    assert not [s for s in again.plan.steps if s.host == "hv1"]
    # shrink to 1: the members above it are surplus, removed where they are
    keep = [n for n in share if member_index("vdi", n) == 1]
    shrink = place_pool(surveys(hosts, pairs), "vdi", 1, TEMPLATE)
    assert shrink.surplus["hv1"] == [n for n in share if n not in keep]
    res = _pool(h1, conn, count=1, placed=shrink.shares["hv1"])
    assert res["changed"] is True and set(res["members"]) == set(shrink.shares["hv1"])
    # absent needs no placement; a rerun changes nothing
    res = _pool(h1, conn, state="absent")
    assert res["changed"] is True and res["members"] == {}
    assert not mdevs(h1) and not [d for d in conn.domains() if d.name.startswith("vdi-")]
    assert _pool(h1, conn, state="absent")["changed"] is False


def test_module_without_its_action_plugin_or_with_a_bad_share_fails_cleanly(conn: Any) -> None:
    h1 = sim("t4x2")
    res = _pool(h1, conn, count=2)
    assert res["failed"] is True and "action plugin" in res["msg"]
    res = _pool(h1, conn, count=2, placed=["vdi-03"])
    assert res["failed"] is True and "invalid placed" in res["msg"]
    res = _pool(h1, conn, name="x;y", count=1, placed=[])
    assert res["failed"] is True and "invalid pool name" in res["msg"]
    assert not mdevs(h1)


def test_info_survey_is_the_fact_vgpu_pool_places_with(conn: Any) -> None:
    host = sim("t4x2", name="hvA")
    info = Runner("vgpu_info", host)
    info.mod.domain_pairs = lambda uri: list(conn.domain_xml_pairs())
    res = info(survey=True, host_name="hvA", uri="test:///default")
    s = Survey.from_dict(json.loads(json.dumps(res["ansible_facts"]["vgpuvirt_survey"])))
    assert s.host == "hvA" and len(s.snapshot) > 0
    assert "vgpuvirt_survey" not in info(uri="test:///default")["ansible_facts"]


def test_teardown_on_a_shared_libvirt_ignores_another_hosts_domain_on_the_same_vf_address(conn: Any) -> None:
    # the fleet test's three hosts share one libvirtd and the simulated boards share PCI addresses: removing
    # hv1's desktop must not see hv2's desktop (same VF address, another host) as a user of hv1's VF
    h1, h2 = sim("l40s-vgpu17", "hv1"), sim("l40s-vgpu17", "hv2")
    a = Runner("vgpu_domain", h1, conn)(name="a", gpus=[{"type": "NVIDIA L40S-2Q"}], uri="test:///default",
                                        host_name="hv1")
    b = Runner("vgpu_domain", h2, conn)(name="b", gpus=[{"type": "NVIDIA L40S-2Q"}], uri="test:///default",
                                        host_name="hv2")
    assert a["domain"]["gpus"] == b["domain"]["gpus"]          # the same VF address on both hosts
    res = Runner("vgpu_domain", h1, conn)(name="a", state="absent", uri="test:///default", host_name="hv1")
    assert res.get("failed") is not True and res["changed"] is True, res
    assert not conn.exists("a") and conn.exists("b")
