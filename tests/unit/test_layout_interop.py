"""Interop: the example configs of NVIDIA mig-parted's and vGPU Device Manager's READMEs import and apply
as they are on matching simulated hosts; vgpuvirt exports both formats (read back equal) and KubeVirt's."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpuvirt.cli import main
from vgpuvirt.layout import dump_layout, parse_layout, verbs
from vgpuvirt.layout.interop import detect, import_config, read_any, to_kubevirt, to_mig_parted, to_vgpu_device_manager
from vgpuvirt.layout.schema import LayoutFileError
from vgpuvirt.sim.host import SimHost

DGX = str(Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "dgx-a100.yaml")

# mig-parted's README (its examples/config.yaml, for a DGX A100), as data.
MIG_PARTED = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7

  all-2g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3

  all-3g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2

  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1

  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - devices: [5]
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3
    - devices: [6]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2
    - devices: [7]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
"""

# The vGPU Device Manager's README (two Tesla T4s), as data.
VGPU_DM = """\
version: v1
vgpu-configs:
  # NVIDIA Tesla T4, Q-Series
  T4-1Q:
    - devices: all
      vgpu-devices:
        "T4-1Q": 16

  T4-2Q:
    - devices: all
      vgpu-devices:
        "T4-2Q": 8

  T4-4Q:
    - devices: all
      vgpu-devices:
        "T4-4Q": 4

  T4-8Q:
    - devices: all
      vgpu-devices:
        "T4-8Q": 2

  T4-16Q:
    - devices: all
      vgpu-devices:
        "T4-16Q": 1

  # Custom configurations
  T4-small:
    - devices: [0]
      vgpu-devices:
        "T4-1Q": 16
    - devices: [1]
      vgpu-devices:
        "T4-2Q": 8

  T4-medium:
    - devices: [0]
      vgpu-devices:
        "T4-4Q": 4
    - devices: [1]
      vgpu-devices:
        "T4-8Q": 2

  T4-large:
    - devices: [0]
      vgpu-devices:
        "T4-8Q": 2
    - devices: [1]
      vgpu-devices:
        "T4-16Q": 1
"""

ONE_OFF = """\
version: v1
mig-configs:
  all-1g.5gb:
  - devices: all
    mig-enabled: true
    mig-devices:
      1g.5gb: 7
"""


def test_mig_parted_readme_configs_apply_on_a_dgx_a100() -> None:
    lay = import_config(MIG_PARTED, "config.yaml")
    assert lay.names == ["all-disabled", "all-enabled", "all-1g.5gb", "all-2g.10gb", "all-3g.20gb", "all-balanced",
                         "custom-config"]
    host = SimHost.from_profile(DGX)
    for name in [*lay.names, "all-disabled"]:
        r = verbs.apply_host(host, lay.config(name))
        assert verbs.check(host, lay.config(name)) == [], name
        assert set(r.round_trips.values()) <= {0, 1, 2}
    verbs.apply_host(host, lay.config("custom-config"))
    gpus = verbs.read_gpus(host)[1]
    assert [g.budget.gpu_instances or {} for g in gpus[3:]] == [
        {}, {"1g.5gb": 7}, {"2g.10gb": 3}, {"3g.20gb": 2}, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}]
    assert [g.mig_enabled for g in gpus] == [False] * 4 + [True] * 4
    one = import_config(ONE_OFF, "-")
    verbs.apply_host(host, one.config())
    assert all((g.budget.gpu_instances or {}) == {"1g.5gb": 7} for g in verbs.read_gpus(host)[1])


def test_vgpu_device_manager_readme_configs_apply_on_two_t4s() -> None:
    lay = read_any(VGPU_DM, "config-t4.yaml")
    host = SimHost.from_profile("t4x2")
    for name in lay.names:
        verbs.apply_host(host, lay.config(name))
        assert verbs.check(host, lay.config(name)) == [], name
    counts = [dict(g.counts()) for g in verbs.read_gpus(host)[1]]
    assert counts == [{"nvidia-233": 2}, {"nvidia-234": 1}]      # T4-large, the last: 2 x 8Q, 1 x 16Q


def test_exports_read_back_and_rebuild_the_host() -> None:
    a = SimHost.from_profile("a100-sriov")
    mp = read_any(yaml_text(to_mig_parted(verbs.read_gpus(a)[1])), "export")
    b = SimHost.from_profile("a100-sriov")
    verbs.apply_host(b, parse_layout(dump_layout(mp)).config("current"))
    assert [g.budget.gpu_instances for g in verbs.read_gpus(b)[1]] == \
        [g.budget.gpu_instances for g in verbs.read_gpus(a)[1]]
    t = SimHost.from_profile("t4x2")
    verbs.apply_host(t, import_config(VGPU_DM).config("T4-medium"))
    dm = import_config(yaml_text(to_vgpu_device_manager(verbs.read_gpus(t)[1])))
    u = SimHost.from_profile("t4x2")
    verbs.apply_host(u, dm.config("current"))
    assert dump_layout(verbs.export(u)) == dump_layout(verbs.export(t))


def yaml_text(data: object) -> str:
    import yaml
    return str(yaml.safe_dump(data, sort_keys=False))


def test_kubevirt_permitted_host_devices() -> None:
    t = SimHost.from_profile("t4x2")
    verbs.apply_host(t, import_config(VGPU_DM).config("T4-small"))
    d = SimHost.from_profile("desktop")
    verbs.apply_host(d, parse_layout("version: v1\nconfigs:\n  a: [{devices: ['0000:01:00.0'], mode: passthrough}]\n")
                     .config())
    one = to_kubevirt({"node-a": verbs.read_gpus(t)[1]})
    assert one["permittedHostDevices"]["mediatedDevices"] == [
        {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"},
        {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/GRID_T4-2Q"}]
    assert one["mediatedDevicesConfiguration"] == {"mediatedDeviceTypes": ["nvidia-230", "nvidia-231"]}
    both = to_kubevirt({"node-a": verbs.read_gpus(t)[1], "node-b": verbs.read_gpus(d)[1]})
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
    ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: nvidia\n",
     "f.yaml:5: mig-configs.a[0].device-filter"),
    ("version: v2\nmig-configs: {}\n", "f.yaml:1: version"),
])
def test_bad_imports_name_file_line_key(text: str, where: str) -> None:
    with pytest.raises(LayoutFileError) as exc:
        import_config(text, "f.yaml")
    assert str(exc.value).startswith(where), str(exc.value)


def test_device_filter_and_nvidia_indexes() -> None:
    lay = import_config("version: v1\nmig-configs:\n  a:\n    - devices: [0]\n      device-filter: ['0x20B010DE']\n"
                        "      mig-enabled: true\n      mig-devices: {3g.20gb: 2}\n")
    e = lay.config().entries[0]
    assert e.vendor == "nvidia" and e.device_filter == ("0x10de:0x20b0",)
    # on the desktop, nvidia index 0 is the RTX 3080 (the Intel iGPU is GPU 0 by address): filtered out by id
    d = SimHost.from_profile("desktop")
    assert verbs.plan(d, lay.config()).empty
    assert detect(MIG_PARTED) == "mig-parted" and detect(VGPU_DM) == "vgpu-device-manager"


def test_cli_import_export_and_apply_as_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "config-t4.yaml"
    f.write_text(VGPU_DM)
    assert main(["layout", "import", str(f)]) == 0
    assert parse_layout(capsys.readouterr().out).config("T4-large").entries[0].vendor == "nvidia"
    assert main(["--host", "sim:t4x2", "layout", "apply", str(f), "-c", "T4-2Q"]) == 0
    assert "create mdev" in capsys.readouterr().out
    for fmt, key in (("mig-parted", "mig-configs"), ("vgpu-device-manager", "vgpu-configs"),
                     ("kubevirt", "permittedHostDevices")):
        assert main(["--host", "sim:a100-sriov", "layout", "export", "--format", fmt]) == 0
        assert key in capsys.readouterr().out
    g = tmp_path / "dgx.yaml"
    g.write_text(MIG_PARTED)
    assert main(["--host", f"sim:{DGX}", "layout", "apply", str(g), "-c", "custom-config"]) == 0
