"""The simulator's link targets: ``rel_link`` is ``posixpath.relpath`` (the fast way for normalized absolute
paths, the general one for anything else)."""

from __future__ import annotations

import posixpath

from hypothesis import given, settings
from hypothesis import strategies as st

from vgpuvirt.sim.fs_nodes import rel_link

COMPONENTS = st.sampled_from(["sys", "bus", "pci", "devices", "0000:3b:00.0", "iommu_groups", "12", "..", ".", "",
                              "a b", "x..y", ".hidden"])
PATHS = st.builds(lambda parts, slash: "/" + "/".join(parts) + ("/" if slash else ""),
                  st.lists(COMPONENTS, max_size=6), st.booleans())


@settings(max_examples=1000, derandomize=True, database=None)
@given(link_dir=PATHS, target=PATHS)
def test_rel_link_is_relpath(link_dir: str, target: str) -> None:
    assert rel_link(link_dir, target) == posixpath.relpath(target, link_dir)


def test_the_links_sysfs_has() -> None:
    assert rel_link("/sys/bus/pci/devices", "/sys/devices/pci0000:00/0000:3b:00.0") == \
        "../../../devices/pci0000:00/0000:3b:00.0"
    assert rel_link("/sys/devices/pci0000:00/0000:3b:00.0", "/sys/kernel/iommu_groups/12") == \
        "../../../kernel/iommu_groups/12"
    assert rel_link("/sys/a", "/sys/a") == "."
    assert rel_link("/", "/sys") == "sys"
