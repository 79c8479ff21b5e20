"""The one vocabulary for how a GPU is used (vgpuvirt/usage.py): its members are the words the JSON contracts
print, the older contract words are kept at their edge, and every device-making step kind is keyed by it."""

from __future__ import annotations

import json

import pytest

from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.step import META_KINDS, step_from_meta
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.usage import Backend, GpuUse


def test_members_are_their_words_in_json_text_and_comparisons() -> None:
    assert [str(u) for u in GpuUse] == ["free", "whole", "mdev", "vendor-vf", "mig", "mig-vgpu", "gvtg", "vf",
                                        "nic-vf"]
    assert json.dumps({"kind": GpuUse.VENDOR_VF, "b": Backend.SRIOV_VF}) == '{"kind": "vendor-vf", "b": "sriov-vf"}'
    assert f"{GpuUse.WHOLE} {Backend.MDEV_SRIOV:>11}" == "whole  mdev-sriov"
    assert GpuUse("mdev") is GpuUse.MDEV and GpuUse.MDEV == "mdev" and {"mdev": 1}[GpuUse.MDEV] == 1


def test_the_capacity_mode_keeps_its_words() -> None:
    words = {u: u.capacity_word for u in GpuUse}
    assert words[GpuUse.MDEV] == "mdev-vgpu" and words[GpuUse.VENDOR_VF] == "vf-vgpu"
    assert all(w == u.value for u, w in words.items() if u not in (GpuUse.MDEV, GpuUse.VENDOR_VF))
    assert all(GpuUse.from_capacity_word(w) is u for u, w in words.items())
    with pytest.raises(ValueError):
        GpuUse.from_capacity_word("vgpu")


def test_each_backend_serves_one_use() -> None:
    assert {b.value: b.use.value for b in Backend} == {
        "mdev": "mdev", "mdev-sriov": "mdev", "vendor-vfio": "vendor-vf", "passthrough": "whole", "gvtg": "gvtg",
        "sriov-vf": "vf"}


def test_provenance_kinds_are_uses_and_an_unknown_one_makes_no_step() -> None:
    assert {GpuUse.MDEV: CreateMdev, GpuUse.VENDOR_VF: SetVfType} == META_KINDS
    assert step_from_meta("h", "vm", {"kind": "whole", "address": "0000:01:00.0"}) is None
    assert step_from_meta("h", "vm", {"kind": "from-a-later-version"}) is None
    s = step_from_meta("h", "vm", {"kind": "vendor-vf", "vf": "0000:41:00.4", "type": "1155"})
    assert s is not None and s.meta()["kind"] is GpuUse.VENDOR_VF
