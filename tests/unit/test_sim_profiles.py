"""Profile loading: every shipped profile loads; malformed files name the file, the key and the reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from vgpuvirt.sim import ProfileError, SimHost, list_profiles, load_profile
from vgpuvirt.sim import profiles as sim_profiles

SHIPPED = {"h100-sxm5", "h200", "t4x2", "a100-sriov", "l40s-vgpu17", "a10-sriov", "gvtg", "mxgpu", "desktop", "mixed",
           "large", "l4-hetero", "a16", "a30-mig", "server-shared-group"}


def test_all_documented_profiles_ship_and_load() -> None:
    assert set(list_profiles()) == SHIPPED
    for name in SHIPPED:
        p = load_profile(name)
        assert p.name == name and p.devices


def test_large_profile_size() -> None:
    host = SimHost.from_profile("large")
    assert len(host.model.gpus) == 8
    parents = host.model.mdev_parents()
    assert len(parents) == 8 * 32
    assert all(len(host.model.mdev_table(d).types) >= 20 for d in parents)  # type: ignore[union-attr]


GOOD = {"name": "mine", "devices": [
    {"address": "0000:3a:00.0", "vendor": 0x8086, "device": 0x2030, "class": 0x060400, "driver": "pcieport",
     "iommu_group": 1},
    {"address": "0000:3b:00.0", "parent": "0000:3a:00.0", "vendor": 0x10de, "device": 0x1eb8, "class": 0x030200,
     "driver": "nvidia", "iommu_group": 1, "vgpu": {"mode": "mdev", "types": "t4"}}]}


def _write(tmp_path: Path, doc: object, name: str = "p.json") -> str:
    f = tmp_path / name
    f.write_text(json.dumps(doc))
    return str(f)


def test_a_user_profile_in_json_works(tmp_path: Path) -> None:
    host = SimHost.from_profile(_write(tmp_path, GOOD))
    assert host.name == "sim:mine"
    assert len(host.read(["/sys/class/mdev_bus/*/mdev_supported_types/*"])) == 17


def _bad(doc: dict) -> dict:  # type: ignore[type-arg]
    return json.loads(json.dumps(doc))


@pytest.mark.parametrize(("mutate", "key", "reason"), [
    (lambda d: d.pop("devices"), "devices", "required"),
    (lambda d: d["devices"][1].update(address="zz:zz"), "devices[1].address", "bb:ss.f"),
    (lambda d: d["devices"][1].update(parent="0000:99:00.0"), "devices[1].parent", "no device"),
    (lambda d: d["devices"][1].update(parent="0000:3b:00.0"), "devices[1].parent", "not a PCI bridge"),
    (lambda d: d["devices"][1]["vgpu"].update(types="nope"), "devices[1].vgpu.types", "unknown type table"),
    (lambda d: d["devices"][1]["vgpu"].update(mode="magic"), "devices[1].vgpu.mode", "not one of"),
    (lambda d: d["devices"][1].update(colour="red"), "devices[1].colour", "unknown key"),
    (lambda d: d["devices"][1].update(vendor="lots"), "devices[1].vendor", "integer"),
    (lambda d: d["devices"][1].pop("iommu_group"), "devices[1].iommu_group", "required while iommu"),
    (lambda d: d["devices"][1].update(numa_node=3), "devices[1].numa_node", "no NUMA node"),
    (lambda d: d["devices"].append(dict(d["devices"][0])), "devices[2].address", "already"),
    (lambda d: d["devices"][1]["vgpu"].update(mode="vendor"), "devices[1].vgpu.mode", "needs an sriov"),
    (lambda d: d["devices"][1]["vgpu"].update(vgpus=[{"type": "nvidia-1"}]), "devices[0000:3b:00.0].vgpu.vgpus[0]",
     "unknown type"),
    (lambda d: d["devices"][1]["vgpu"].update(vgpus=[{"type": "nvidia-229"}, {"type": "nvidia-229"}]),
     "devices[0000:3b:00.0].vgpu.vgpus[1]", "refused"),
])
def test_malformed_profiles_are_refused_with_file_key_and_reason(tmp_path: Path, mutate, key: str,  # type: ignore[no-untyped-def]
                                                                reason: str) -> None:
    doc = _bad(GOOD)
    mutate(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ProfileError) as ei:
        SimHost.from_profile(path)
    assert ei.value.file == path
    assert ei.value.key == key
    assert reason in ei.value.reason
    assert path in str(ei.value) and key in str(ei.value)


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(str(tmp_path / "missing.yaml"))
    f = tmp_path / "broken.yaml"
    f.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(f))
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile("nonesuch")
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile("_types")


def test_a_shipped_profile_is_parsed_once_a_file_at_every_load(tmp_path: Path) -> None:
    # every simulated host starts from a profile: the shipped ones are parsed once per process (they ship with
    # the package; a Profile is immutable), a file named by path is read again (it may have changed)
    assert load_profile("t4x2") is load_profile("t4x2")
    f = tmp_path / "mine.yaml"
    text = (Path(sim_profiles.__file__).parent / "profiles" / "t4x2.yaml").read_text()
    f.write_text(text)
    first = load_profile(str(f))
    assert replace(first, source="t4x2.yaml") == load_profile("t4x2") and first is not load_profile(str(f))
    f.write_text(text.replace("t4x2", "t4x2-edited", 1))
    assert load_profile(str(f)) != first
