"""``vgpuvirt xml build|lint|devices`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xmlcheck import U1, U2, check_create

from vgpuvirt.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_build_prints_valid_xml(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "xml", "build", "--template", "vdi", "--name", "cli1", "--mdev", f"{U1}:ramfb",
                        "--pci", "0000:41:00.0", "--pci", "0000:41:00.1", "--nic", "5e:02.1,52:54:00:aa:bb:01,42",
                        "--secure-boot", "--tpm", "--graphics", "vnc", "--pin", "2-3", "--host-cpus", "0-7")
    assert rc == 0, err
    check_create(out)
    assert 'ramfb="on"' in out and 'multifunction="on"' in out


def test_build_pci_display_and_iommufd(capsys: pytest.CaptureFixture[str]) -> None:
    # a vGPU 17+ VF desktop: newer than the libvirt here, so its schema refuses it unless --no-validate
    argv = ["xml", "build", "--template", "vdi", "--name", "cli-vf", "--pci", "41:00.4:unmanaged:ramfb:iommufd"]
    rc, out, err = _run(capsys, *argv, "--no-validate")
    assert rc == 0, err
    from vgpuvirt.xml import Domain, PciHostdev
    (dev,) = Domain.from_xml(out).hostdevs()
    assert dev == PciHostdev("0000:41:00.4", managed=False, display=True, ramfb=True, iommufd=True)
    rc, out, err = _run(capsys, *argv)
    assert rc == 1 and out == "" and "domain.rng rejects" in err


def test_build_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "xml", "build", "--template", "compute", "--name", "cli2", "--pci",
                      "41:00.4:unmanaged", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["devices"]["pci_addresses"] == ["0000:41:00.4"] and doc["uuid"]
    check_create(doc["xml"])


@pytest.mark.parametrize("argv, msg", [
    (["--template", "desktop"], "invalid template 'desktop'"),
    (["--template", "vdi", "--mdev", f"{U1}:ramfb", "--mdev", f"{U2}:ramfb"], "ramfb-multiple"),
    (["--template", "vdi", "--nic", "5e:02.1,52:54:00:zz:bb:01"], "invalid MAC address"),
    (["--template", "vdi", "--pin", "9-10", "--host-cpus", "0-7"], "cpu-not-on-host"),
    (["--template", "gaming", "--mdev", f"{U1}:display"], "display-without-graphics"),
])
def test_build_refuses_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], msg: str) -> None:
    rc, out, err = _run(capsys, "xml", "build", "--name", "bad", *argv)
    assert rc != 0 and out == ""
    assert msg in err and err.count("\n") == 1


def test_lint_and_devices(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = _run(capsys, "xml", "build", "--template", "vdi", "--name", "cli3", "--mdev", f"{U1}:display")
    good = tmp_path / "good.xml"
    good.write_text(out)
    rc, out, _ = _run(capsys, "xml", "lint", str(good))
    assert rc == 0 and out.strip().endswith("ok")
    bad = tmp_path / "bad.xml"
    bad.write_text(good.read_text().replace("<graphics", "<!-- gone --><graphicsX").replace(
        "</graphics>", "</graphicsX>"))
    rc, out, _ = _run(capsys, "--json", "xml", "lint", str(bad))
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"]
    assert any(p.startswith("display-without-graphics") for p in doc["problems"])
    assert any(p.startswith("schema:") for p in doc["problems"])
    rc, out, _ = _run(capsys, "xml", "devices", str(good), "--json")
    assert rc == 0 and json.loads(out)["mdev_uuids"] == [str(U1)]
    rc, out, _ = _run(capsys, "xml", "devices", str(good))
    assert rc == 0 and out.startswith("mdev") and str(U1) in out


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = _run(capsys, "xml", "lint", str(tmp_path / "nope.xml"))
    assert rc == 2 and "readable file" in err
