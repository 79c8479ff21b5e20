"""Every simulator profile inventoried three ways, with the same JSON: SimHost, a materialized tree read by
the CLI with ``--sysfs-root``, and the same tree over a real sshd (one exec per inventory)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from typing import Any

import pytest

from vgpuvirt.cli import main as cli_main
from vgpuvirt.services.inventory import inventory

pytestmark = pytest.mark.integration

try:
    from conftest import require_part  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - the testbed helper's conftest is not there yet
    def require_part(name: str, available: bool, why: str) -> None:
        if not available:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{name} missing: {why}")
            pytest.skip(f"{name} missing: {why}")


def _sim() -> Any:
    try:
        import vgpuvirt.sim as sim
        import vgpuvirt.sim.materialize  # noqa: F401  (the static-tree writer)
    except ImportError as exc:
        require_part("vgpuvirt.sim.materialize", False, str(exc))
    return sim


def _profiles() -> list[str]:
    try:
        from vgpuvirt.sim import list_profiles
        return list_profiles()
    except ImportError:
        return ["t4x2"]


@pytest.fixture(scope="module")
def bed(request: pytest.FixtureRequest) -> Any:
    try:
        return request.getfixturevalue("testbed")
    except pytest.FixtureLookupError as exc:
        require_part("testbed fixture", False, str(exc))


def _cli_json(*argv: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli_main(list(argv))
    assert rc == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


@pytest.mark.parametrize("profile", _profiles())
def test_three_ways_same_json(bed: Any, profile: str) -> None:
    sim = _sim()
    via_sim = inventory(sim.SimHost.from_profile(profile), nvidia_smi=False).to_dict()
    base = bed.mnt_dir if os.path.isdir(bed.mnt_dir) else None
    with tempfile.TemporaryDirectory(prefix=f"inv-{profile}-", dir=base) as tree:
        sim.materialize(profile, tree)
        via_tree = _cli_json("--sysfs-root", tree, "inventory", "--json")
        host = bed.ssh(sysfs_root=tree)
        try:
            before = host.round_trips
            via_ssh = inventory(host).to_dict()
            assert host.round_trips - before == 1
        finally:
            host.close()
    assert via_tree["host"] == "local" and via_ssh["host"].startswith("ssh://")
    for d in (via_sim, via_tree, via_ssh):
        d.pop("host")
    assert via_tree == via_sim
    assert via_ssh == via_sim


def test_nvidia_smi_rides_in_the_same_exec_over_ssh(bed: Any) -> None:
    host = bed.ssh()
    try:
        before = host.round_trips
        inv = inventory(host, nvidia_smi=True)
        assert host.round_trips - before == 1
    finally:
        host.close()
    # No GPU driver on the testbed machine: nvidia-smi is absent, which is normal and not a warning.
    assert inv.sources["nvidia_smi"] in ("not installed", "ok")
    if inv.sources["nvidia_smi"] == "not installed":
        assert not any("nvidia-smi" in w for w in inv.warnings)
