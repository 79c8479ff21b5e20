"""Interop: mig-parted and vGPU Device Manager files (their published examples' structure, in
examples/layouts/nvidia) import and apply on matching simulated hosts; export to their formats and to
KubeVirt; round trips; what a format cannot say is refused with one line naming it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from vgpuvirt.cli import main
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout import dump_layout, interop, interop_host, parse_layout, verbs
from vgpuvirt.layout.interop import (
    MIG_PARTED,
    VGPU_DM,
    NotExpressible,
    detect,
    export_config,
    import_config,
    read_any,
)
from vgpuvirt.layout.model import Layout
from vgpuvirt.layout.schema import LayoutFileError
from vgpuvirt.sim.host import SimHost

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "examples" / "layouts" / "nvidia"          # the published configs' structure, as examples
DGX = str(ROOT / "tests" / "fixtures" / "profiles" / "dgx-a100.yaml")


def _load(name: str, fmt: str) -> Layout:
    return import_config((FIX / name).read_text(), name, fmt)


def _gis(host: SimHost) -> dict[str, dict[str, int]]:
    """GPU address -> its GPU instances by profile (from a fresh read)."""
    return {str(g.address): dict(g.budget.gpu_instances or {}) for g in verbs.read_gpus(host)[1]}


def _vgpus(host: SimHost) -> dict[str, Counter[str]]:
    return {str(g.address): Counter(g.short_name(v.type_id) for v in g.vgpus) for g in verbs.read_gpus(host)[1]}


MIG_PARTED_NAMES = ["all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-1g.10gb", "all-2g.10gb",
                    "all-3g.20gb", "all-balanced", "custom-config"]


# each on a fresh DGX (MIG off: the mode goes on, then a second round places the GPU instances), and in turn
@pytest.mark.parametrize("sequence", [[n] for n in MIG_PARTED_NAMES] +
                         [["all-3g.20gb", "custom-config", "all-balanced", "all-disabled", "all-balanced",
                           "all-enabled", "all-1g.5gb.me", "all-2g.10gb", "all-1g.10gb", "all-disabled"]])
def test_mig_parted_example_configs_apply_on_a_dgx_a100_in_turn(sequence: list[str]) -> None:
    lay = _load("mig-parted-config.yaml", MIG_PARTED)
    assert lay.names == MIG_PARTED_NAMES
    host = SimHost.from_profile(DGX)
    gpus = sorted(_gis(host))
    for name in sequence:
        verbs.apply_host(host, lay.config(name))
        assert verbs.check(host, lay.config(name)) == [], name
        gis = _gis(host)
        wanted = {p: n for p, n in (lay.config(name).entries[-1].layout.mig_devices or ())}
        if name == "custom-config":
            assert [gis[a] for a in gpus[:4]] == [{}] * 4 and gis[gpus[4]] == {"1g.5gb": 7}
            assert gis[gpus[5]] == {"2g.10gb": 3} and gis[gpus[7]] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
            modes = [g.mig_enabled for g in verbs.read_gpus(host)[1]]
            assert modes == [False] * 4 + [True] * 4
        else:
            assert all(gis[a] == wanted for a in gpus), (name, gis)
    if sequence[-1] != "custom-config":
        assert all(g.mig_enabled == (sequence[-1] != "all-disabled") for g in verbs.read_gpus(host)[1])


def test_mig_parted_export_of_the_host_is_what_its_readme_shows(capsys: pytest.CaptureFixture[str]) -> None:
    f = FIX / "mig-parted-config.yaml"
    host = SimHost.from_profile(DGX)
    verbs.apply_host(host, _load("mig-parted-config.yaml", MIG_PARTED).config("all-balanced"))
    assert interop_host.host_export(verbs.read_gpus(host)[1], MIG_PARTED) == {"version": "v1", "mig-configs": {
        "current": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}}]}}
    # the CLI: import, then the file applies and asserts through the ordinary verbs
    assert main(["layout", "import", str(f), "--from", "mig-parted", "-c", "custom-config"]) == 0
    imported = capsys.readouterr().out
    assert parse_layout(imported).names == ["custom-config"]
    assert main(["--host", f"sim:{DGX}", "layout", "export", "--format", "mig-parted"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["mig-configs"]["current"] == [
        {"devices": "all", "mig-enabled": False}]


def test_mig_parted_device_filters_select_by_pci_id() -> None:
    lay = _load("mig-parted-filters.yaml", MIG_PARTED)
    assert lay.config("all-1g.10gb").entries[1].device_filter == ("0x10de:0x20b0", "0x10de:0x20f1")
    a100_80 = SimHost.from_profile("a100-sriov")          # 0x20b5: the first entry
    dgx = SimHost.from_profile(DGX)                        # 0x20b0: the second
    for host, n in ((a100_80, 7), (dgx, 4)):
        verbs.apply_host(host, lay.config("all-1g.10gb"))
        assert verbs.check(host, lay.config("all-1g.10gb")) == []
        assert set(map(str, _gis(host).values())) == {str({"1g.10gb": n})}
    # an entry whose filter selects no GPU of the host leaves the host alone
    before = dump_layout(verbs.export(dgx))
    assert not verbs.apply_host(dgx, lay.config("all-7g")).changed
    assert dump_layout(verbs.export(dgx)) == before


T4_SEQUENCE = ("T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q", "T4-16Q", "T4-small", "T4-medium", "T4-large")


def test_vgpu_device_manager_t4_configs_apply_on_two_t4s_in_turn() -> None:
    lay = _load("vgpu-dm-t4.yaml", VGPU_DM)
    assert lay.names == list(T4_SEQUENCE)
    host = SimHost.from_profile("t4x2")
    for name in T4_SEQUENCE:
        verbs.apply_host(host, lay.config(name))
        assert verbs.check(host, lay.config(name)) == [], name
        got = list(_vgpus(host).values())
        entries = lay.config(name).entries
        want = [Counter({v.type: v.count for v in e.layout.vgpu_devices}) for e in entries]
        assert got == (want * 2 if len(entries) == 1 else want), name


@pytest.mark.parametrize(("config", "profile"), [
    ("A10-4Q", "a10-sriov"), ("A10-24Q", "a10-sriov"), ("A100D-1-10C", "a100-sriov"), ("A100D-1-10CME", "a100-sriov"),
    ("A100D-3-40C", "a100-sriov"), ("A100D-8C", "a100-sriov"), ("A30-1-6C", "a30-mig"), ("T4-8Q", "t4x2"),
    ("A16-4Q", "a16"), ("L4-4Q", "l4-hetero"), ("L40S-8Q", "l40s-vgpu17"),
    ("default", "mixed"), ("default", "a100-sriov"), ("default", "a30-mig")])
def test_vgpu_device_manager_example_configs_apply_on_their_boards(config: str, profile: str) -> None:
    cfg = _load("vgpu-dm-example.yaml", VGPU_DM).config(config)
    host = SimHost.from_profile(profile)
    assert verbs.apply_host(host, cfg).changed
    assert verbs.check(host, cfg) == []
    if config.startswith("A100D-1-10C"):
        e = cfg.entries[0].layout
        assert e.mode == "mig-vgpu"
        assert dict(e.mig_devices or ()) == {interop.mig_profile_of(config): e.vgpu_devices[0].count}
        assert all(gis == dict(e.mig_devices or ()) for gis in _gis(host).values())
    got = {a: dict(c) for a, c in _vgpus(host).items() if c}
    if config == "default" and profile == "mixed":
        assert sorted(map(str, got.values())) == sorted([str({"A10-12Q": 2})] + [str({"T4-8Q": 2})] * 2)
    else:
        assert got and all(sum(c.values()) == sum(v.count or 0 for v in cfg.entries[-1].layout.vgpu_devices)
                           for c in got.values() if config != "default"), got


@pytest.mark.parametrize(("name", "fmt"), [("mig-parted-config.yaml", MIG_PARTED),
                                           ("mig-parted-filters.yaml", MIG_PARTED), ("vgpu-dm-t4.yaml", VGPU_DM),
                                           ("vgpu-dm-example.yaml", VGPU_DM)])
def test_import_of_export_is_identity(name: str, fmt: str) -> None:
    x = _load(name, fmt)
    again = import_config(export_config(x, fmt), "again.yaml", fmt)
    assert again == x
    # and through our own file format
    assert parse_layout(dump_layout(x)) == x


def test_hand_written_layouts_round_trip_where_expressible() -> None:
    x = parse_layout("""\
version: v1
configs:
  a: [{devices: [0, 2], vendor: nvidia, mode: mig, mig-devices: {"3g.40gb": 2}},
      {devices: [1], vendor: nvidia, mode: "off"}]
  b: [{devices: all, vendor: nvidia, device-filter: ["0x10de:0x2236", "0x10de:0x1eb8"], mode: vgpu,
       vgpu-devices: {A10-4Q: 6}}]
  c: [{devices: all, vendor: nvidia, mode: mig-vgpu, mig-devices: {"2g.20gb": 3}, vgpu-devices: {A100D-2-20C: 3}}]
""")
    assert import_config(export_config(Layout((x.config("a"),)), MIG_PARTED), "m", MIG_PARTED).config("a") == \
        x.config("a")
    for name in ("b", "c"):
        assert import_config(export_config(Layout((x.config(name),)), VGPU_DM), "v", VGPU_DM).config(name) == \
            x.config(name)


@pytest.mark.parametrize(("layout", "fmt", "says"), [
    ("[{devices: all, mode: passthrough}]", MIG_PARTED, "mode passthrough"),
    ("[{devices: all, mode: vgpu, vgpu-devices: {T4-2Q: fill}}]", VGPU_DM, "fill"),
    ("[{devices: ['0000:3b:00.0'], mode: mig}]", MIG_PARTED, "0000:3b:00.0"),
    ("[{devices: all, mode: mig}]", MIG_PARTED, "mig-devices left out"),
    ("[{devices: all, mode: vgpu, sizing: mixed, vgpu-devices: {L4-4Q: 2}}]", VGPU_DM, "sizing mixed"),
    ("[{devices: all, mode: vgpu, sriov-vfs: 4, vgpu-devices: {A10-4Q: 2}}]", VGPU_DM, "sriov-vfs 4"),
    ("[{devices: all, mode: vgpu, vgpu-devices: {nvidia-231: 2}}]", VGPU_DM, "nvidia-231"),
    ("[{devices: all, mode: mig-vgpu, mig-devices: {'1g.10gb': 7}, vgpu-devices: {A100D-1-10C: 2}}]", VGPU_DM,
     "one GPU instance per MIG-backed vGPU"),
    ("[{devices: all, mode: mig, mig-devices: {}}]", VGPU_DM, "mode mig"),
    ("[{devices: [0], mode: mig, mig-devices: {}}]", MIG_PARTED, "indices without vendor: nvidia"),
    ("[{devices: all, vendor: amd, mode: 'off'}]", MIG_PARTED, "vendor amd"),
    ("[{devices: [1], vendor: nvidia, device-filter: ['0x10de:0x20b0'], mode: 'off'}]", MIG_PARTED,
     "a device-filter with a device list"),
])
def test_what_a_format_cannot_say_is_refused_naming_it(layout: str, fmt: str, says: str) -> None:
    x = parse_layout(f"version: v1\nconfigs:\n  cfg: {layout}\n", "x.yaml")
    with pytest.raises(NotExpressible, match=says) as exc:
        export_config(x, fmt)
    assert "cfg[0]" in str(exc.value) and fmt in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(("text", "fmt", "says"), [
    ("mig-configs:\n  a: [{devices: [0], device-filter: '0x20B010DE', mig-enabled: false}]", MIG_PARTED,
     ":3: mig-configs.a[0].device-filter: a device-filter together with a device list"),
    ("mig-configs:\n  a: [{devices: all, device-filter: '0x20B010DE:0x134F10DE', mig-enabled: false}]", MIG_PARTED,
     "subsystem ids"),
    ("mig-configs:\n  a: [{devices: all, mig-enabled: true}]", MIG_PARTED, "required when mig-enabled is true"),
    ("mig-configs:\n  a: [{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}]", MIG_PARTED,
     "while mig-enabled is false"),
    ("mig-configs:\n  a: [{devices: all, mig-enabled: true, mig-devices: {1c.3g.20gb: 1}}]", MIG_PARTED,
     "compute-instance profiles"),
    ("mig-configs:\n  a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 1}, extra: 1}]", MIG_PARTED,
     "unknown key"),
    ("vgpu-configs:\n  a: [{devices: all, vgpu-devices: {A100D-1-10C: 1, A100D-8C: 1}}]", VGPU_DM,
     "mixes MIG-backed and time-sliced"),
    ("vgpu-configs:\n  a: [{devices: all, vgpu-devices: {'GRID T4-2Q': 1}}]", VGPU_DM, "not a vGPU type name"),
    ("vgpu-configs:\n  a: [{devices: all}]", VGPU_DM, "vgpu-devices: missing"),
    ("mig-configs:\n  a: [{devices: all, mig-enabled: false}]", VGPU_DM, "mig-configs: unknown key"),
])
def test_bad_nvidia_files_are_refused_with_file_line_and_key(text: str, fmt: str, says: str) -> None:
    with pytest.raises(InvalidSpec, match=re.escape(says)) as exc:
        import_config("version: v1\n" + text + "\n", "bad.yaml", fmt)
    assert str(exc.value).startswith("bad.yaml")


def test_kubevirt_fragment_for_mdevs_and_passthrough(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = SimHost.from_profile("t4x2")
    verbs.apply_host(host, _load("vgpu-dm-t4.yaml", VGPU_DM).config("T4-small"))
    gpus = verbs.read_gpus(host)[1]
    frag = interop_host.kubevirt_configuration({"node1": interop_host.governed(verbs.export(host).config(), gpus)})
    assert frag == {
        "permittedHostDevices": {"mediatedDevices": [
            {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q",
             "externalResourceProvider": False},
            {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/GRID_T4-2Q",
             "externalResourceProvider": False}]},
        "mediatedDevicesConfiguration": {
            "mediatedDeviceTypes": ["nvidia-230", "nvidia-231"],
            "nodeMediatedDeviceTypes": [{"nodeSelector": {"kubernetes.io/hostname": "node1"},
                                         "mediatedDeviceTypes": ["nvidia-230", "nvidia-231"]}]}}
    # a layout file's config, through the CLI: the A10 and T4s passed through, the L40S's vGPU 17+ VFs refused
    lab = tmp_path / "lab.yaml"
    lab.write_text("version: v1\nconfigs:\n  night: [{devices: [NVIDIA A10, Tesla T4], mode: passthrough}]\n"
                   "  l40s: [{devices: [NVIDIA L40S], mode: vgpu, vgpu-devices: {L40S-8Q: 2}}]\n")
    assert main(["--host", "sim:mixed", "layout", "export", "--format", "kubevirt", "--layout", str(lab), "-c",
                 "night"]) == 0
    spec = yaml.safe_load(capsys.readouterr().out)["spec"]["configuration"]
    assert spec == {"permittedHostDevices": {"pciHostDevices": [
        {"pciVendorSelector": "10DE:1EB8", "resourceName": "nvidia.com/Tesla_T4",
         "externalResourceProvider": False},
        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/NVIDIA_A10",
         "externalResourceProvider": False}]}}
    assert main(["--host", "sim:mixed", "layout", "export", "--format", "kubevirt", "--layout", str(lab), "-c",
                 "l40s"]) == 2
    assert "vGPU 17+ VF types" in capsys.readouterr().err


def test_cli_import_refusals_change_nothing_and_name_the_file(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v2\nmig-configs: {}\n")
    out = tmp_path / "out.yaml"
    assert main(["layout", "import", str(bad), "--from", "mig-parted", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "version" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    t4 = str(FIX / "vgpu-dm-t4.yaml")
    assert main(["layout", "import", t4, "--from", "vgpu-device-manager", "-c", "nope"]) == 2
    assert "T4-small" in capsys.readouterr().err
    assert main(["layout", "import", t4, "--from", "vgpu-device-manager", "-o", str(out)]) == 0
    assert parse_layout(out.read_text()).names == list(T4_SEQUENCE)


def test_plan_and_assert_take_nvidia_files_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    f = str(FIX / "mig-parted-config.yaml")
    host = ["--host", f"sim:{DGX}"]
    assert main([*host, "layout", "assert", f, "--from", "mig-parted", "-c", "all-disabled"]) == 0
    assert main([*host, "layout", "assert", f, "--from", "mig-parted", "-c", "all-1g.5gb"]) == 1
    assert "MIG 1g.5gb 0 -> 7" in capsys.readouterr().out
    assert main([*host, "layout", "plan", f, "--from", "mig-parted", "-c", "custom-config"]) == 0
    out = capsys.readouterr().out
    assert "4 GPU(s) change" in out and "turn MIG mode on on 0000:87:00.0" in out
    t4 = str(FIX / "vgpu-dm-t4.yaml")
    assert main(["--host", "sim:t4x2", "layout", "apply", t4, "--from", "vgpu-device-manager", "-c", "T4-large"]) == 0
    assert "create mdev" in capsys.readouterr().out


# ---------------------------------------------------------------------------------- from the w13-layout branch

ONE_OFF = """\
version: v1
mig-configs:
  all-1g.5gb:
  - devices: all
    mig-enabled: true
    mig-devices:
      1g.5gb: 7
"""


def test_mig_parted_readme_one_off_config_and_detection() -> None:
    host = SimHost.from_profile(DGX)
    verbs.apply_host(host, import_config(ONE_OFF, "-").config())
    assert all((g.budget.gpu_instances or {}) == {"1g.5gb": 7} for g in verbs.read_gpus(host)[1])
    assert detect(ONE_OFF) == MIG_PARTED and detect((FIX / "vgpu-dm-t4.yaml").read_text()) == VGPU_DM
    assert detect("version: v1\nconfigs: {}\n") == "vgpuvirt"
    assert read_any((FIX / "vgpu-dm-t4.yaml").read_text(), "t4.yaml").names == list(T4_SEQUENCE)


def test_host_exports_read_back_and_rebuild_the_host() -> None:
    a = SimHost.from_profile("a100-sriov")
    mp = import_config(yaml.safe_dump(interop_host.host_export(verbs.read_gpus(a)[1], MIG_PARTED)), "export")
    b = SimHost.from_profile("a100-sriov")
    verbs.apply_host(b, parse_layout(dump_layout(mp)).config("current"))
    assert [g.budget.gpu_instances for g in verbs.read_gpus(b)[1]] == \
        [g.budget.gpu_instances for g in verbs.read_gpus(a)[1]]
    t = SimHost.from_profile("t4x2")
    verbs.apply_host(t, _load("vgpu-dm-t4.yaml", VGPU_DM).config("T4-medium"))
    dm = import_config(yaml.safe_dump(interop_host.host_export(verbs.read_gpus(t)[1], VGPU_DM)))
    u = SimHost.from_profile("t4x2")
    verbs.apply_host(u, dm.config("current"))
    assert dump_layout(verbs.export(u)) == dump_layout(verbs.export(t))


def test_kubevirt_for_two_hosts_as_they_are() -> None:
    t = SimHost.from_profile("t4x2")
    verbs.apply_host(t, _load("vgpu-dm-t4.yaml", VGPU_DM).config("T4-small"))
    d = SimHost.from_profile("desktop")
    verbs.apply_host(d, parse_layout("version: v1\nconfigs:\n  a: [{devices: ['0000:01:00.0'], mode: passthrough}]\n")
                     .config())
    both = interop_host.to_kubevirt({"node-a": verbs.read_gpus(t)[1], "node-b": verbs.read_gpus(d)[1]})
    pci = both["permittedHostDevices"]["pciHostDevices"]
    assert len(pci) == 1 and pci[0]["pciVendorSelector"].startswith("10DE:")
    assert pci[0]["resourceName"].startswith("nvidia.com/") and " " not in pci[0]["resourceName"]
    assert both["mediatedDevicesConfiguration"]["nodeMediatedDeviceTypes"] == [
        {"nodeSelector": {"kubernetes.io/hostname": "node-a"}, "mediatedDeviceTypes": ["nvidia-230", "nvidia-231"]}]


@pytest.mark.parametrize(("text", "where"), [
    ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: 3\n",
     "f.yaml:5: mig-configs.a[0].mig-enabled"),
    ("version: v1\nvgpu-configs:\n  a:\n    - devices: [x]\n      vgpu-devices: {}\n",
     "f.yaml:4: vgpu-configs.a[0].devices"),
    ("version: v1\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {T4-1Q: many}\n",
     "f.yaml:5: vgpu-configs.a[0].vgpu-devices.T4-1Q"),
    ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: nvidia\n      mig-enabled: false\n",
     "f.yaml:5: mig-configs.a[0].device-filter"),
    ("version: v2\nmig-configs: {}\n", "f.yaml:1: version"),
])
def test_bad_imports_name_file_line_key(text: str, where: str) -> None:
    with pytest.raises(LayoutFileError) as exc:
        import_config(text, "f.yaml")
    assert str(exc.value).startswith(where), str(exc.value)


def test_nvidia_indexes_count_nvidia_gpus_only(capsys: pytest.CaptureFixture[str]) -> None:
    lay = import_config("version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: ['0x20B010DE']\n"
                        "      mig-enabled: true\n      mig-devices: {3g.20gb: 2}\n")
    e = lay.config().entries[0]
    assert e.vendor == "nvidia" and e.device_filter == ("0x10de:0x20b0",)
    # on the desktop, NVIDIA index 0 is the RTX (the Intel iGPU is GPU 0 by address): filtered out by id
    d = SimHost.from_profile("desktop")
    assert verbs.plan(d, lay.config()).empty
    one = import_config("version: v1\nvgpu-configs:\n  a: [{devices: [0], vgpu-devices: {}}]\n")
    assert one.config().entries[0].vendor == "nvidia"
    assert main(["--host", "sim:t4x2", "layout", "export", "--format", "kubevirt"]) == 0
    assert "permittedHostDevices" in capsys.readouterr().out


def test_cli_exports_every_format_of_a_mig_host(capsys: pytest.CaptureFixture[str]) -> None:
    for fmt, key in (("mig-parted", "mig-configs"), ("vgpu-device-manager", "vgpu-configs"),
                     ("kubevirt", "permittedHostDevices")):
        assert main(["--host", "sim:a100-sriov", "layout", "export", "--format", fmt]) == 0
        assert key in capsys.readouterr().out
    # a layout's config that KubeVirt cannot take is refused (the host's own export leaves such GPUs out)
    assert main(["--host", "sim:a100-sriov", "layout", "export", "--format", "kubevirt", "--layout",
                 str(FIX / "mig-parted-config.yaml"), "-c", "all-1g.10gb"]) == 2
    assert "mode mig" in capsys.readouterr().err
