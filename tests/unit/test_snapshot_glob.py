"""Snapshot.glob: the literal-prefix shortcut matches exactly what a component-by-component fnmatch of every
path matches (the shortcut exists because the inventory globs an ~11,000-path snapshot several times)."""

from __future__ import annotations

import fnmatch

import pytest

from vgpuvirt.services.inventory.read import INVENTORY_GLOBS
from vgpuvirt.sim import SimHost


def brute_force(paths: list[str], pattern: str) -> list[str]:
    parts = pattern.split("/")
    return sorted(p for p in paths if len(p.split("/")) == len(parts)
                  and all(fnmatch.fnmatchcase(a, b) for a, b in zip(p.split("/"), parts, strict=True)))


@pytest.fixture(scope="module")
def snap():
    return SimHost.from_profile("a10-sriov").read(INVENTORY_GLOBS)


@pytest.mark.parametrize("pattern", [
    "/sys/devices/system/node/node*/cpulist",
    "/sys/kernel/mm/hugepages/hugepages-*/free_hugepages",
    "/sys/bus/pci/devices/*/vendor",
    "/sys/bus/pci/devices/*/virtfn*",
    "/*/bus/pci/devices/*/class",
    "/sys/bus/pci/devices/0000:*/mdev_supported_types/*/name",
    "/sys/class/mdev_bus/*",
    "/sys/bus/pci/devices/[0-9]*/numa_node",
    "/sys/no/such/dir/*",
    "*",
])
def test_glob_matches_a_brute_force_fnmatch(snap, pattern: str) -> None:
    paths = list(snap)
    want = brute_force(paths, pattern)
    assert snap.glob(pattern) == want
    if pattern.endswith(("cpulist", "free_hugepages", "vendor", "class")):
        assert want, "the pattern must match something in this profile, or the test proves nothing"
