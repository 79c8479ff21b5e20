"""Property: every layout mig-parted or the vGPU Device Manager can say survives ``import(export(x)) == x``,
and every file of theirs survives ``export(import(f))`` read back equal (the NVIDIA side of the round trip);
a layout they cannot say is refused (NotExpressible), never written half-right."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vgpuvirt.layout.interop import MIG_PARTED, VGPU_DM, NotExpressible, export_config, import_config, mig_profile_of
from vgpuvirt.layout.model import GpuEntry, GpuLayout, Layout, LayoutConfig, Selector, VgpuCount

PROFILES = ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.10gb+me"]
SLICED = ["A10-4Q", "T4-2Q", "A100D-8C", "L40S-8Q", "A16-1B", "M60-0Q"]
MIG_TYPES = ["A100D-1-10C", "A100D-3-40C", "A100-1-5CME", "H100-2-20C", "A30-1-6C"]
IDS = ["0x10de:0x20b0", "0x10de:0x20b5", "0x10de:0x1eb8", "0x10de:0x2236"]


@st.composite
def selection(draw: st.DrawFn) -> dict[str, object]:
    filters = tuple(draw(st.lists(st.sampled_from(IDS), unique=True, max_size=2)))
    if filters or draw(st.booleans()):
        return {"devices": (Selector("all"),), "device_filter": filters}
    idx = draw(st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True))
    return {"devices": tuple(Selector("index", i) for i in idx), "device_filter": ()}


@st.composite
def mig_entry(draw: st.DrawFn) -> GpuEntry:
    sel = draw(selection())
    if draw(st.booleans()):
        lay = GpuLayout(mode="off")
    else:
        profs = draw(st.lists(st.sampled_from(PROFILES), unique=True, max_size=3))
        lay = GpuLayout(mode="mig", mig_devices=tuple((p, draw(st.integers(0, 7))) for p in profs), mig_exact=True)
    return GpuEntry(sel["devices"], lay, vendor="nvidia", device_filter=sel["device_filter"])  # type: ignore[arg-type]


@st.composite
def vgpu_entry(draw: st.DrawFn) -> GpuEntry:
    sel = draw(selection())
    pool = MIG_TYPES if draw(st.booleans()) else SLICED
    types = draw(st.lists(st.sampled_from(pool), unique=True, max_size=3))
    top = 3 if pool is MIG_TYPES else 16          # one GPU instance per MIG-backed vGPU: 7 at most per profile
    counts = tuple(VgpuCount(t, draw(st.integers(0, top))) for t in types)
    implied: dict[str, int] = {}
    for c in counts:
        if (p := mig_profile_of(c.type)) is not None:
            implied[p] = implied.get(p, 0) + (c.count or 0)
    lay = GpuLayout(mode="mig-vgpu" if implied else "vgpu", mig_devices=tuple(implied.items()),
                    mig_exact=bool(implied), vgpu_devices=counts)
    return GpuEntry(sel["devices"], lay, vendor="nvidia", device_filter=sel["device_filter"])  # type: ignore[arg-type]


def _layout(entries: list[GpuEntry]) -> Layout:
    return Layout((LayoutConfig("c", tuple(entries)),))


@settings(max_examples=150, deadline=None)
@given(st.lists(mig_entry(), min_size=1, max_size=4))
def test_mig_parted_layouts_round_trip(entries: list[GpuEntry]) -> None:
    x = _layout(entries)
    text = export_config(x, MIG_PARTED)
    assert import_config(text, "x", MIG_PARTED) == x
    assert export_config(import_config(text, "x", MIG_PARTED), MIG_PARTED) == text


@settings(max_examples=150, deadline=None)
@given(st.lists(vgpu_entry(), min_size=1, max_size=4))
def test_vgpu_device_manager_layouts_round_trip(entries: list[GpuEntry]) -> None:
    x = _layout(entries)
    text = export_config(x, VGPU_DM)
    assert import_config(text, "x", VGPU_DM) == x
    assert export_config(import_config(text, "x", VGPU_DM), VGPU_DM) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(vgpu_entry(), min_size=1, max_size=3), st.sampled_from(["passthrough", "fill", "sriov", "address"]))
def test_what_they_cannot_say_is_refused(entries: list[GpuEntry], spoil: str) -> None:
    e = entries[0]
    if spoil == "passthrough":
        bad = GpuEntry(e.devices, GpuLayout(mode="passthrough"), vendor="nvidia")
    elif spoil == "fill":
        bad = GpuEntry(e.devices, GpuLayout(mode="vgpu", vgpu_devices=(VgpuCount("A10-4Q", None),)), vendor="nvidia")
    elif spoil == "sriov":
        bad = GpuEntry(e.devices, GpuLayout(mode="vgpu", sriov_vfs=4), vendor="nvidia")
    else:
        bad = GpuEntry((Selector("address", "0000:41:00.0"),), e.layout, vendor="nvidia")
    for fmt in (MIG_PARTED, VGPU_DM):
        try:
            export_config(_layout([*entries, bad]), fmt)
        except NotExpressible as exc:
            assert f"c[{len(entries)}]" in str(exc) or fmt == MIG_PARTED
        else:
            raise AssertionError(f"{spoil} was written as {fmt}")
