"""Requests by type or by need, and the smallest-fitting-type rule (pure)."""

from __future__ import annotations

import pytest
from provision_fixtures import t4_host

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.provision.request import TypeProfile, VgpuRequest, VmRequest, fit, smallest_key
from vgpuvirt.provision.state import host_state


def _t4_profiles() -> list[TypeProfile]:
    hs = host_state(t4_host())
    return list(next(s for s in hs.gpus[0].slots if s.kind == "mdev").profiles.values())


def _smallest(req: VgpuRequest) -> TypeProfile | None:
    fits = [t for t in _t4_profiles() if fit(req, t) is None]
    return min(fits, key=smallest_key) if fits else None


@pytest.mark.parametrize("text", ["nvidia-231", "231", "GRID T4-2Q", "T4-2Q", "grid t4-2q"])
def test_by_type_id_or_name(text):
    t = _smallest(VgpuRequest(type=text))
    assert t is not None and t.id == "nvidia-231"


@pytest.mark.parametrize(("req", "want"), [
    (VgpuRequest(min_framebuffer_mib=2048, series="Q"), "nvidia-231"),
    (VgpuRequest(min_framebuffer_mib=1500, series="q"), "nvidia-231"),
    (VgpuRequest(min_framebuffer_mib=3000), "nvidia-319"),      # 4Q and 4C are 4096; 4C has fewer heads
    (VgpuRequest(min_framebuffer_mib=3000, min_heads=4), "nvidia-232"),
    (VgpuRequest(series="C"), "nvidia-319"),
    (VgpuRequest(min_resolution="7680x4320"), "nvidia-231"),
    (VgpuRequest(series="A"), "nvidia-225"),
    (VgpuRequest(vendor="0x10de", min_framebuffer_mib=16384), "nvidia-234"),
    (VgpuRequest(mig_backed=False, series="B"), "nvidia-222"),
])
def test_by_need_picks_the_smallest_fitting_type(req, want):
    t = _smallest(req)
    assert t is not None and t.id == want


@pytest.mark.parametrize("req", [
    VgpuRequest(min_framebuffer_mib=32768),
    VgpuRequest(mig_backed=True),
    VgpuRequest(vendor="amd"),
    VgpuRequest(series="C", min_heads=2),
    VgpuRequest(type="nvidia-999"),
])
def test_nothing_fits_says_why(req):
    assert _smallest(req) is None
    reasons = {fit(req, t) for t in _t4_profiles()}
    assert all(r for r in reasons)


def test_fit_reasons_name_the_mismatch():
    t = next(p for p in _t4_profiles() if p.id == "nvidia-231")
    assert "framebuffer 2048 MiB < 4096 MiB" in fit(VgpuRequest(min_framebuffer_mib=4096), t)
    assert "series Q, not C" in fit(VgpuRequest(series="C"), t)
    assert "vendor nvidia, not intel" in fit(VgpuRequest(vendor="intel"), t)


@pytest.mark.parametrize(("text", "expected"), [
    ("nvidia-231", VgpuRequest(type="nvidia-231")),
    ("GRID T4-2Q", VgpuRequest(type="GRID T4-2Q")),
    ("passthrough", VgpuRequest(mode="passthrough")),
    ("fb>=2G,series=Q", VgpuRequest(min_framebuffer_mib=2048, series="Q")),
    ("fb>=1536,heads>=2,res>=3840x2160,mig=no,vendor=nvidia",
     VgpuRequest(min_framebuffer_mib=1536, min_heads=2, min_resolution="3840x2160", mig_backed=False,
                 vendor="nvidia")),
])
def test_cli_form(text, expected):
    assert VgpuRequest.parse(text) == expected


@pytest.mark.parametrize("bad", [
    dict(series="X"), dict(vendor="matrox"), dict(min_framebuffer_mib=-1), dict(min_resolution="big"),
    dict(mode="whole"), dict(type="a/b"), dict(type=""),
])
def test_bad_requests_are_refused(bad):
    with pytest.raises(InvalidSpec):
        VgpuRequest(**bad)


@pytest.mark.parametrize("bad", ["fb>=lots", "colour=blue", "fb<2G"])
def test_bad_cli_forms_are_refused(bad):
    with pytest.raises(InvalidSpec):
        VgpuRequest.parse(bad)


def test_vm_pool_and_validation():
    vms = VmRequest.pool("vdi", 3, gpu=VgpuRequest(type="nvidia-231"))
    assert [v.name for v in vms] == ["vdi-001", "vdi-002", "vdi-003"]
    assert all(v.gpus == (VgpuRequest(type="nvidia-231"),) for v in vms)
    for bad in (dict(name="bad name"), dict(name="x;rm"), dict(name="ok", memory_mib=1),
                dict(name="ok", host_cpus="3-1"), dict(name="ok", gpus=[1])):
        with pytest.raises(InvalidSpec):
            VmRequest(**bad)
    with pytest.raises(InvalidSpec):
        VmRequest.pool("vdi", 0)


@pytest.mark.parametrize(("text", "mode", "boot_vga", "vendor"), [
    ("passthrough,boot_vga=yes", "passthrough", True, None),     # issue 28: was a type named "passthrough"
    ("mode=passthrough,boot_vga=yes", "passthrough", True, None),
    ("passthrough", "passthrough", False, None),
    ("vf,vendor=intel", "vf", False, "intel"),
])
def test_a_mode_first_then_options(text: str, mode: str, boot_vga: bool, vendor: str | None) -> None:
    r = VgpuRequest.parse(text)
    assert (r.mode, r.type, r.allow_boot_vga, r.vendor) == (mode, None, boot_vga, vendor)
