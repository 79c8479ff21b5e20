"""``Host.is_local``: "is this host the machine we run on" is a question the host answers, not an isinstance
check. Only LocalHost says yes; the NVML choice and the libvirt URI follow the answer, whatever the class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_metrics_nvml import fake_pynvml  # type: ignore[import-not-found]

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host import LocalHost
from vgpuvirt.host.replay import ReplayHost
from vgpuvirt.host.ssh import SSHHost
from vgpuvirt.libvirt_uri import default_uri
from vgpuvirt.observe.collect import Collector
from vgpuvirt.sim import SimHost

ROOT = Path(__file__).resolve().parents[2]
H100_CAPTURE = ROOT / "tests/fixtures/real/h100-580/capture/capture.json"


class HereSim(SimHost):
    """A simulated host that says it is this machine (what a LocalHost on a GPU host would say)."""

    @property
    def is_local(self) -> bool:
        return True


def test_each_host_answers(tmp_path: Path) -> None:
    assert LocalHost().is_local
    assert LocalHost(str(tmp_path)).is_local          # another sysfs tree, but its programs run here
    assert not SimHost.from_profile("t4x2").is_local
    assert not ReplayHost(str(H100_CAPTURE)).is_local
    assert not SSHHost("127.0.0.1", port=2222).is_local   # never connected: the answer needs no connection


def test_libvirt_uri_follows_the_answer() -> None:
    assert default_uri(HereSim.from_profile("t4x2")) == "qemu:///system"
    assert default_uri(SimHost.from_profile("t4x2")) == "test:///default"


def test_nvml_follows_the_answer() -> None:
    # NVML describes the machine we run on: a host that says it is that machine (and reads its real /) gets it
    m = Collector(use_nvml=True, nvml_module=fake_pynvml()).collect(HereSim.from_profile("t4x2"))
    assert m.sources["nvml"] == "ok"
    with pytest.raises(InvalidSpec, match="NVML only"):
        Collector(use_nvml=True, nvml_module=fake_pynvml()).collect(SimHost.from_profile("t4x2"))


def test_no_isinstance_check_for_the_local_host() -> None:
    found = []
    for path in sorted((ROOT / "vgpuvirt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2 and "LocalHost" in ast.unparse(node.args[1])):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
