"""The kernel is the authority where the capacity model cannot size a type (issue 22, item 2): generic mdev
types, legacy NVIDIA types missing from the tables and unknown vendors count exactly what sysfs
``available_instances`` says; a tree with mdev parents and no PCI device is a sysfs tree.

mdevctl's own ``types`` test (src/tests/types.rs) populates parents with these types and compares
``mdevctl types --dumpjson`` with files kept in ../shared/peers/mdevctl/types: ``vgpuvirt types --json`` on
the same trees must say the same of every type, free counts included.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.cli import main
from vgpuvirt.host.local import LocalHost
from vgpuvirt.services.capacity.build import gpu_budgets
from vgpuvirt.services.inventory.read import inventory, type_capacity
from vgpuvirt.sim import SimHost
from vgpuvirt.sim.profiles import list_profiles

PEERS = Path(__file__).resolve().parents[2].parent / "shared" / "peers"

#: mdevctl src/tests/types.rs: parent -> (type, available_instances, device_api, name, description)
MDEVCTL_PARENTS: dict[str, list[tuple[str, int, str, str, str | None]]] = {
    "0000:00:02.0": [("mdev_type1", 5, "vfio-pci", "name1", "description 1"),
                     ("mdev_type2", 16, "vfio-pci", "name2", None),
                     ("mdev_type3", 1, "vfio-pci", "name3", "description 3")],
    "0000:00:03.0": [("nvidia-155", 4, "vfio-pci", "GRID M10-2B", None),
                     ("nvidia-36", 16, "vfio-pci", "GRID M10-0Q", None)],
    "0.0.26ab": [("vfio_ccw-io", 4, "vfio_mdev", "name", "description")],
}


def populate_parent_device(root: Path, parent: str, type_id: str, instances: int, device_api: str, name: str,
                           description: str | None) -> None:
    """As mdevctl's TestEnvironment does: plain directories under /sys/class/mdev_bus, no PCI device."""
    d = root / "sys" / "class" / "mdev_bus" / parent / "mdev_supported_types" / type_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "available_instances").write_text(str(instances))
    (d / "device_api").write_text(device_api)
    (d / "name").write_text(name)
    if description is not None:
        (d / "description").write_text(description)


def mdevctl_tree(root: Path) -> Path:
    for parent, types in MDEVCTL_PARENTS.items():
        for t in types:
            populate_parent_device(root, parent, *t)
    return root


def as_mdevctl(rows: list[dict[str, Any]]) -> list[dict[str, list[dict[str, dict[str, Any]]]]]:
    """vgpuvirt's rows in the shape of ``mdevctl types --dumpjson`` (parent -> [{type: attributes}])."""
    if not rows:
        return []
    out: dict[str, list[dict[str, dict[str, Any]]]] = {}
    for r in rows:
        attrs = {"available_instances": r["available_instances"], "device_api": r["device_api"], "name": r["name"]}
        if r["description"] is not None:
            attrs["description"] = r["description"]
        out.setdefault(r["parent"], []).append({r["id"]: attrs})
    return [out]


def normalized(doc: list[dict[str, list[dict[str, dict[str, Any]]]]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(parent, tid): attrs for d in doc for parent, types in d.items() for t in types for tid, attrs in t.items()}


@pytest.mark.parametrize("case, parent", [("full", None), ("parent-match-1", "0000:00:02.0"),
                                          ("parent-match-2", "0000:00:03.0"), ("parent-match-3", "0.0.26ab"),
                                          ("parent-no-match", "missing")])
def test_types_json_equals_mdevctls_expected_json(case: str, parent: str | None, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    require_part("../shared/peers", (PEERS / "SOURCES.md").is_file(), f"the peers' test data ({PEERS})")
    expected = json.loads((PEERS / "mdevctl" / "types" / f"{case}.json").read_text())
    root = mdevctl_tree(tmp_path)
    argv = ["--json", "--sysfs-root", str(root), "types", "--no-nvidia-smi", "--nvml", "no"]
    assert main([*argv, *(["--parent", parent] if parent else [])]) == 0
    got = as_mdevctl(json.loads(capsys.readouterr().out))
    assert normalized(got) == normalized(expected)
    assert got == [] if expected == [] else len(normalized(got)) == len(normalized(expected))


def test_a_tree_of_mdev_parents_without_pci_devices_is_a_sysfs_tree(tmp_path: Path) -> None:
    inv = inventory(LocalHost(str(mdevctl_tree(tmp_path))))
    assert {p.address for p in inv.mdev_parents} == set(MDEVCTL_PARENTS)
    assert inv.pci_devices == [] and inv.gpus == []


def test_the_same_types_on_gpus_count_what_the_kernel_says(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """mdevctl's types on real PCI devices (an Intel GPU, an M10 whose -2B/-0Q are not in the tables, an unknown
    vendor): the capacity model cannot size them, so the kernel's figure stands (it was 1 for every type)."""
    from fixtures.trees import populate_mdev_parent, populate_pci_device  # type: ignore[import-not-found]

    populate_pci_device(tmp_path, "0000:00:02.0", vendor="0x8086", device="0x3e92", pci_class="0x030000",
                        driver="i915")
    populate_pci_device(tmp_path, "0000:00:03.0", vendor="0x10de", device="0x13bd", pci_class="0x030000",
                        driver="nvidia")
    populate_pci_device(tmp_path, "0000:00:04.0", vendor="0x1234", device="0x1111", pci_class="0x030000",
                        driver="other")
    for parent, types in [*MDEVCTL_PARENTS.items(), ("0000:00:04.0", [("other-1", 7, "vfio-pci", "x", None)])]:
        if parent.startswith("0000:"):
            populate_mdev_parent(tmp_path, parent, {t: {"available_instances": str(n), "device_api": api, "name": nm}
                                                    for t, n, api, nm, _ in types})
    rows = type_capacity(inventory(LocalHost(str(tmp_path)), nvidia_smi=False, use_nvml=False))
    assert {(r.parent, r.id): r.available for r in rows} == {
        ("0000:00:02.0", "mdev_type1"): 5, ("0000:00:02.0", "mdev_type2"): 16, ("0000:00:02.0", "mdev_type3"): 1,
        ("0000:00:03.0", "nvidia-155"): 4, ("0000:00:03.0", "nvidia-36"): 16, ("0000:00:04.0", "other-1"): 7}
    assert all(not r.exact and "the host's own count" in (r.reason or "") for r in rows)
    assert main(["--sysfs-root", str(tmp_path), "types", "--no-nvidia-smi", "--nvml", "no", "--explain"]) == 0
    assert "0000:00:03.0 nvidia-155: maximum unknown: the host's own count: 4 available" in capsys.readouterr().out


# -- the property: where the model cannot size a type, vgpuvirt's free count is the kernel's -----------------

def _unsized(inv: Any) -> list[tuple[str, str, int]]:
    """(parent, type, kernel's available_instances) of every type on a single-parent GPU that the model
    sizes from the host's own count (SR-IOV GPUs fold VFs, whose figures are each VF's own)."""
    budgets = {str(b.address): b for b in gpu_budgets(inv)}
    out = []
    for p in inv.mdev_parents:
        b = budgets.get(p.address)
        if p.physfn is not None or b is None or b.sriov:
            continue
        for t in p.types:
            if t.id in b.types and not b.fit(t.id).exact:
                out.append((p.address, t.id, t.available_instances or 0))
    return out


@pytest.mark.parametrize("profile", [pytest.param(p, marks=pytest.mark.slow) if p == "large" else p
                                     for p in list_profiles()])     # large: 256 parents, ~17 s
def test_every_simulated_host_counts_what_the_kernel_says_where_the_model_cannot(profile: str,
                                                                                tmp_path: Path) -> None:
    """Each simulated host, materialized, with the type descriptions the model sizes mdev types from
    (``max_instance=``, framebuffer) taken away: what is left the model cannot size, so the kernel's
    available_instances must come through unchanged; and as read, no count ever exceeds the kernel's."""
    import os

    from vgpuvirt.sim import materialize

    as_read = inventory(SimHost.from_profile(profile), nvidia_smi=False)
    kernel = {(p.address, t.id): t.available_instances or 0 for p in as_read.mdev_parents for t in p.types}
    for r in type_capacity(as_read):
        if (r.parent, r.id) in kernel and r.backend in ("mdev", "gvtg"):
            assert r.available <= kernel[(r.parent, r.id)], (profile, r)
    materialize(profile, str(tmp_path))
    for d, _, files in os.walk(tmp_path / "sys" / "devices"):
        if "description" in files and "available_instances" in files:
            os.remove(os.path.join(d, "description"))
    inv = inventory(LocalHost(str(tmp_path)), nvidia_smi=False, use_nvml=False)
    unsized = _unsized(inv)
    free = {(r.parent, r.id): r.available for r in type_capacity(inv)}
    for parent, tid, n in unsized:
        assert free[(parent, tid)] == n, (profile, parent, tid)
    single_parent = [p for p in inv.mdev_parents if p.physfn is None and p.types and
                     not any(g.backend == "gvtg" for g in inv.gpus if str(g.address) == p.address)]
    if single_parent:
        assert unsized, f"{profile}: the model still sizes every type without descriptions"


@pytest.mark.parametrize("seed", range(25))
def test_random_generic_mdev_trees_count_what_the_kernel_says(seed: int, tmp_path: Path) -> None:
    from fixtures.trees import populate_mdev_parent, populate_pci_device  # type: ignore[import-not-found]

    rng = random.Random(seed)
    want: dict[tuple[str, str], int] = {}
    for i in range(rng.randint(1, 4)):
        addr = f"0000:{i + 1:02x}:00.0"
        vendor = rng.choice(["0x1234", "0x8086", "0x10de", "0x1002"])
        populate_pci_device(tmp_path, addr, vendor=vendor, device=f"0x{rng.randint(1, 0xffff):04x}",
                            pci_class=rng.choice(["0x030000", "0x030200", "0x120000"]), driver="drv")
        types = {}
        for j in range(rng.randint(1, 5)):
            tid = rng.choice([f"mdev_type{j}", f"vendor_x-{j}", f"nvidia-{9000 + j}"])
            n = rng.randint(0, 64)
            types[tid] = {"available_instances": str(n), "device_api": "vfio-pci", "name": f"generic {j}"}
            want[(addr, tid)] = n
        populate_mdev_parent(tmp_path, addr, types)
    inv = inventory(LocalHost(str(tmp_path)), nvidia_smi=False, use_nvml=False)
    assert {(r.parent, r.id): r.available for r in type_capacity(inv)} == want
