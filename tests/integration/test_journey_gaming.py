"""Issue 28: the cloud-gaming operator's journey, end to end, as a user types it: a simulated consumer board
(RTX 3080 + its HDMI audio in one IOMMU group, an iGPU, an I350 NIC with SR-IOV off) live over FUSE, reached over
the testbed's real sshd, VMs on the real libvirtd (qemu:///system; this kernel has no VFIO, so VMs are defined,
not started).

The story: a gaming VM with the whole GPU (its audio along), an SR-IOV NIC VF (the NIC's VFs enabled first),
pinned to whole cores with the emulator apart, on a host bridge (the testbed's libvirtd has no network) with a
TPM and secure boot; ``vm list`` shows the GPU apart from the audio and the NIC VF; the iGPU is attached and
detached again; ``metrics`` names the VM that uses the passed-through GPU; teardown gives everything back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _sim_mount import sim_mount  # type: ignore[import-not-found]
from conftest import require_part  # type: ignore[import-not-found]

from vgpuvirt.cli import main
from vgpuvirt.xml import Domain

pytestmark = [pytest.mark.integration, pytest.mark.slow]
GPU, AUDIO, NIC_PF, IGPU = "0000:01:00.0", "0000:01:00.1", "0000:05:00.0", "0000:00:02.0"


@pytest.fixture
def bridge() -> Iterator[str]:
    """A real Linux bridge (unique name) that libvirt lists as a host interface."""
    name = "brg" + uuid.uuid4().hex[:8]
    made = subprocess.run(["ip", "link", "add", name, "type", "bridge"], capture_output=True, text=True)
    require_part("a Linux bridge (ip link add ... type bridge)", made.returncode == 0, made.stderr.strip())
    yield name
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str], rc: int = 0) -> Any:
    got = main(argv)
    out = capsys.readouterr()
    assert got == rc, out.err
    return json.loads(out.out) if "--json" in argv and rc == 0 else out


def _pci(conn: Any, vm: str) -> set[str]:
    return {str(a) for a in Domain.from_xml(conn.xml(vm, inactive=True)).gpu_devices().pci_addresses}


def test_the_gaming_operators_journey(testbed: Any, bridge: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        from vgpuvirt.libvirt_conn import LibvirtConnection
    except ImportError:
        require_part("libvirt-python", False, "pip install 'vgpuvirt[libvirt]'")
        raise
    vm = "gjrn-" + uuid.uuid4().hex[:6]
    conn = LibvirtConnection(testbed.libvirt_uri)
    with sim_mount(testbed.mnt_dir, "desktop") as mnt:
        host = ["--host", f"ssh://root@{testbed.ssh_host}:{testbed.ssh_port}", "--sysfs-root", mnt,
                "--identity", testbed.identity, "--known-hosts", testbed.known_hosts]
        uri = ["--connect", testbed.libvirt_uri]
        try:
            # The pre-flight names what the host lacks: no network 'default' on this libvirtd, no such bridge.
            err = _cli([*host, "plan", *uri, "--template", "gaming", "--name", vm, "--gpu", "passthrough"],
                       capsys, rc=1).err
            assert "libvirt network 'default' does not exist" in err and "--bridge NAME" in err
            err = _cli([*host, "plan", *uri, "--template", "gaming", "--name", vm, "--gpu", "passthrough",
                        "--bridge", bridge + "x"], capsys, rc=1).err
            assert f"host bridge '{bridge}x' does not exist (bridges: " in err and bridge in err

            # Provision: GPU + audio, a NIC VF (SR-IOV enabled on the I350 first), whole cores, bridge, TPM.
            res = _cli([*host, "--json", "provision", *uri, "--template", "gaming", "--name", vm, "--gpu",
                        "passthrough", "--nic-vf", "--vcpus", "4", "--memory-mib", "1024", "--bridge", bridge,
                        "--tpm", "--secure-boot", "--no-start"], capsys)
            assert [r["vm"] for r in res["vms"]] == [vm] and res["vms"][0]["device"] == GPU
            dom = Domain.from_xml(conn.xml(vm, inactive=True))
            pci = sorted(str(a) for a in dom.gpu_devices().pci_addresses)
            assert pci == [GPU, AUDIO]
            (vf,) = [str(a) for a in dom.gpu_devices().interfaces]
            vf_pf = Path(f"{mnt}/sys/bus/pci/devices/{vf}/physfn").resolve().name
            assert vf_pf == NIC_PF
            pins = dom.cpu_pinning()
            assert pins is not None and pins.vcpu_cpus == (1, 9, 2, 10) and pins.emulator_cpus == {0, 8}
            assert dom.root.find("cpu/topology").get("threads") == "2"
            assert [i.find("source").get("bridge") for i in dom.root.iterfind("devices/interface[@type='bridge']")
                    ] == [bridge]
            assert dom.root.find("devices/tpm") is not None

            # vm list: the GPU is the GPU; audio and NIC VF are listed apart.
            (info,) = _cli([*host, "--json", "vm", "list", vm, *uri], capsys)["vms"]
            assert [(g["device"], g["type"]) for g in info["gpus"]] == [(GPU, "passthrough")]
            assert sorted((d["kind"], d["device"]) for d in info["devices"]) == [("audio", AUDIO), ("nic-vf", vf)]
            assert info["missing"] == []

            # attach the iGPU (the boot VGA: only when asked), then detach it again.
            att = _cli([*host, "--json", "attach", vm, "--gpu", "mode=passthrough,boot_vga=yes", *uri], capsys)
            assert any(IGPU in d for d in att["devices"])
            assert IGPU in _pci(conn, vm)
            _cli([*host, "--json", "detach", vm, IGPU, *uri], capsys)
            assert _pci(conn, vm) == {GPU, AUDIO}

            # per-VM use: the passed-through GPU names its VM (metrics JSON and the exporter's join metric).
            snap = _cli([*host, "--json", "metrics", *uri], capsys)
            (g,) = [g for h in snap["hosts"] for g in h["gpus"] if g["address"] == GPU]
            assert g["vm_name"] == vm and g["vm_uuid"] == dom.root.findtext("uuid")
            others = [g for h in snap["hosts"] for g in h["gpus"] if g["address"] != GPU]
            assert others and all(o["vm_name"] is None for o in others)
        finally:
            _cli([*host, "teardown", *uri, vm], capsys)
            conn.close()
        assert not LibvirtConnection(testbed.libvirt_uri).exists(vm)
        # the GPU and its audio are free again: a second plan may take them
        again = _cli([*host, "--json", "plan", *uri, "--template", "gaming", "--name", vm, "--gpu", "passthrough",
                      "--vcpus", "4", "--memory-mib", "1024", "--bridge", bridge], capsys)
        assert again["vms"][0]["device"] == GPU
