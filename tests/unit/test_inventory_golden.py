"""Golden JSON per simulator profile (SimHost, nvidia-smi off). Regenerate: VGPUVIRT_REGEN_GOLDEN=1 pytest ..."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt import sim
from vgpuvirt.services.inventory.read import inventory

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "inventory"
REGEN = os.environ.get("VGPUVIRT_REGEN_GOLDEN") == "1"


def snapshot_of(profile: str) -> dict[str, Any]:
    host = sim.SimHost.from_profile(profile)
    d = inventory(host, nvidia_smi=False).to_dict()
    assert host.round_trips == 1
    d.pop("host")
    return d


# Profiles whose full JSON is too big to keep in git: the golden holds a digest of the canonical JSON and a
# summary, so a change still fails and the summary shows roughly where.
DIGEST_ONLY = {"large"}


def digest_form(d: dict[str, Any]) -> dict[str, Any]:
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    return {
        "sha256": hashlib.sha256(canonical).hexdigest(),
        "counts": {k: len(v) for k, v in sorted(d.items()) if isinstance(v, list | dict)},
        "gpus": [[g["address"], g["backend"], len(g["vfs"]), g["vgpus_in_use"]] for g in d["gpus"]],
        "warnings": d["warnings"],
    }


@pytest.mark.parametrize("profile", sim.list_profiles())
def test_inventory_matches_golden(profile: str) -> None:
    got = snapshot_of(profile)
    if profile in DIGEST_ONLY:
        got = digest_form(got)
    path = GOLDEN / f"{profile}.json"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if not path.exists():
        pytest.fail(f"no golden file {path}: run with VGPUVIRT_REGEN_GOLDEN=1 and review the diff")
    assert got == json.loads(path.read_text())


def test_every_backend_appears_in_some_profile() -> None:
    backends = {g["backend"] for p in sim.list_profiles() for g in snapshot_of(p)["gpus"]}
    assert {"mdev", "mdev-sriov", "vendor-vfio", "passthrough", "gvtg", "sriov-vf"} <= backends
