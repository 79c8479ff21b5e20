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


# ------------------------------------------------------------------------------------------ issues 27 and 28


def test_a_host_that_did_not_answer_is_unknown_not_empty() -> None:
    """Issue 28 item 5: the members missing from the hosts that answered may be on the one that did not; none
    is placed elsewhere (no duplicate when it returns), the members found stay, and the plan says so."""
    hosts = fleet()
    first = place_pool(surveys(hosts), "vdi", 6, TEMPLATE, policy="spread")
    assert all(first.shares[h.name] for h in hosts)
    # hv1 and hv2 hold their shares (as their next surveys would show); hv3 does not answer
    held_by = {h: list(first.shares[h]) for h in ("hv1", "hv2")}
    pairs = {h: [(n, _member_xml(n, h)) for n in names] for h, names in held_by.items()}
    up = [s for s in surveys(hosts, pairs) if s.host != "hv3"]
    pool = place_pool(up, "vdi", 8, TEMPLATE, policy="spread", unreachable=["hv3"])
    assert pool.unreachable == ["hv3"]
    assert pool.shares == held_by                      # kept where they are, nothing new anywhere
    assert pool.held == sorted(set(members("vdi", 8)) - {n for v in held_by.values() for n in v})
    assert pool.plan is not None and not pool.plan.steps
    assert pool.to_dict()["held"] == pool.held and pool.to_dict()["unreachable"] == ["hv3"]
    # every host answers again: hv3's members are found where they are, the rest is placed once
    pairs["hv3"] = [(n, _member_xml(n, "hv3")) for n in first.shares["hv3"]]
    back = place_pool(surveys(hosts, pairs), "vdi", 8, TEMPLATE, policy="spread")
    assert not back.held and not back.unreachable
    assert back.shares["hv3"][:len(first.shares["hv3"])] == first.shares["hv3"]
    placed = [n for v in back.shares.values() for n in v]
    assert sorted(placed) == members("vdi", 8) and len(placed) == len(set(placed))


def _member_xml(name: str, host: str) -> str:
    """A pool member as vgpuvirt defines it (its metadata names its host), with no GPU: placement keeps it."""
    from vgpuvirt.provision.plan import domain_meta

    xml = (f"<domain type='kvm'><name>{name}</name><metadata><vgpuvirt:provision xmlns:vgpuvirt="
           f"'https://vgpuvirt.dev/xmlns/provision/1' host='{host}'/></metadata></domain>")
    assert domain_meta(xml) is not None and domain_meta(xml).get("host") == host, "the metadata form changed"
    return xml


def test_absent_without_host_name_finds_the_members_by_their_ownership_records(conn: Any) -> None:
    """Issue 27 item 5: the pool was made with host_name hv1; a teardown task without host_name (the module
    then names the host by its hostname) removed nothing and said ok."""
    h1 = sim("t4x2", "hv1")
    pool = place_pool(surveys([h1]), "vdi", 2, TEMPLATE)
    assert _pool(h1, conn, count=2, placed=pool.shares["hv1"])["changed"] is True
    # without host_name the module names the target by its hostname (open_local_host): here "box-7", a view
    # of the same simulated machine under that name
    box = sim("t4x2", "box-7")
    box.model, box.fs = h1.model, h1.fs
    res = Runner("vgpu_pool", box, conn)(name="vdi", uri="test:///default", state="absent")
    assert res.get("failed") is not True and res["changed"] is True, res
    assert sorted(res["diff"]["before"]["members"]) == pool.shares["hv1"]
    assert not mdevs(h1) and not [d for d in conn.domains() if d.name.startswith("vdi-")]


def test_absent_without_host_name_refuses_when_members_of_several_hosts_share_the_libvirt(conn: Any) -> None:
    h1, h2 = sim("t4x2", "hv1"), sim("t4x2", "hv2")
    pool = place_pool(surveys([h1, h2]), "vdi", 2, TEMPLATE, policy="spread")
    for h in (h1, h2):
        assert _pool(h, conn, count=2, placed=pool.shares[h.name])["changed"] is True
    res = Runner("vgpu_pool", h1, conn)(name="vdi", uri="test:///default", state="absent")
    assert res["failed"] is True and res["error"] == "InvalidSpec", res
    assert "hv1, hv2" in res["msg"] and "host_name" in res["msg"]
    assert len([d for d in conn.domains() if d.name.startswith("vdi-")]) == 2 and len(mdevs(h1)) == 1


def test_the_pool_runs_the_cli_pre_flight_before_defining_anything(conn: Any) -> None:
    """Issue 28 item 6: 20 desktops were defined on a network and disks that did not exist."""
    h1 = sim("t4x2", "hv1")
    pool = place_pool(surveys([h1]), "vdi", 2, TEMPLATE)
    nics = {"virtio_nics": [{"kind": "network", "source": "no-such-net"}]}
    res = _pool(h1, conn, count=2, placed=pool.shares["hv1"], domain_options=nics)
    assert res["failed"] is True and res["error"] == "PreflightFailed", res
    assert "no-such-net" in res["msg"]
    res = _pool(h1, conn, count=2, placed=pool.shares["hv1"],
                clone={"golden": "/var/lib/libvirt/images/golden.qcow2", "pool": "no-such-pool"})
    assert res["failed"] is True and res["error"] == "PreflightFailed" and "no-such-pool" in res["msg"], res
    assert not mdevs(h1) and not [d for d in conn.domains() if d.name.startswith("vdi-")]
    res = _pool(h1, conn, count=2, placed=pool.shares["hv1"], disk="/srv/a.qcow2", clone={"golden": "/g", "pool": "p"})
    assert res["failed"] is True and "mutually exclusive" in res["msg"]


def test_each_member_gets_its_own_disk(conn: Any) -> None:
    h1 = sim("t4x2", "hv1")
    pool = place_pool(surveys([h1]), "vdi", 2, TEMPLATE)
    res = _pool(h1, conn, count=2, placed=pool.shares["hv1"], disk="/srv/vdi/{name}.qcow2")
    assert res.get("failed") is not True and res["changed"] is True, res
    xml = {d.name: d.xml for d in conn.domains() if d.name.startswith("vdi-")}
    for n in pool.shares["hv1"]:
        assert f"/srv/vdi/{n}.qcow2" in xml[n]


def test_a_domain_runs_the_same_pre_flight_and_takes_a_linked_clone(conn: Any) -> None:
    """vgpu_domain too: a missing network or storage pool is refused before anything is made."""
    h1 = sim("t4x2", "hv1")
    run = Runner("vgpu_domain", h1, conn)
    base = {"name": "desk", "uri": "test:///default", "state": "defined", "gpus": [{"type": "nvidia-231"}],
            "memory_mib": 512, "host_name": "hv1"}
    res = run(**base, domain_options={"virtio_nics": [{"kind": "network", "source": "no-such-net"}]})
    assert res["failed"] is True and res["error"] == "PreflightFailed" and "no-such-net" in res["msg"], res
    res = run(**base, clone={"golden": "/var/lib/libvirt/images/golden.qcow2", "pool": "no-such-pool"})
    assert res["failed"] is True and "no-such-pool" in res["msg"], res
    assert not mdevs(h1) and not conn.exists("desk")


def test_the_pool_gives_each_member_a_linked_clone_of_the_golden_image(conn: Any) -> None:
    """clone: a qcow2 overlay per member in the storage pool, backed by the golden image (the test driver's
    pool holds a golden volume made for the test)."""
    from vgpuvirt.xml.storage import Volume

    golden = conn.create_volume("default-pool", Volume("golden-pooltest.qcow2", capacity_bytes=1 << 30))
    try:
        h1 = sim("t4x2", "hv1")
        pool = place_pool(surveys([h1]), "vdi", 2, TEMPLATE)
        clone = {"golden": golden, "pool": "default-pool"}
        dry = _pool(h1, conn, check=True, count=2, placed=pool.shares["hv1"], clone=clone)
        assert dry.get("failed") is not True, dry
        volumes = [s for s in dry["plan"] if "linked clone of " + golden in s]
        assert len(volumes) == 2 and all(n in " ".join(volumes) for n in pool.shares["hv1"]), dry["plan"]
        res = _pool(h1, conn, count=2, placed=pool.shares["hv1"], clone=clone)
        assert res.get("failed") is not True and res["changed"] is True, res
        for n in pool.shares["hv1"]:
            vol = conn.volume(f"/default-pool/{n}.qcow2")
            assert vol.backing == golden
        assert _pool(h1, conn, state="absent")["changed"] is True
    finally:
        for path in ("golden-pooltest.qcow2", "vdi-01.qcow2", "vdi-02.qcow2"):
            conn.delete_volume("default-pool", path)
