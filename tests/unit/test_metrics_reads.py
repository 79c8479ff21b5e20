"""A collection reads fewer files than the inventory (METRICS_GLOBS): the snapshot it gives is the same as with
every inventory glob, on every simulator profile, with and without vGPUs and domains."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.host.base import Op
from vgpuvirt.observe import collect as metrics
from vgpuvirt.observe.collect import METRICS_GLOBS, Collector
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS
from vgpuvirt.services.metrics_model import MetricsSnapshot
from vgpuvirt.sim import SimHost

NOW = 1_700_100_000.0
PROFILES = sorted(p.stem for p in (Path(metrics.__file__).parents[1] / "sim" / "profiles").glob("[!_]*.yaml"))


def _snapshot(h: SimHost, globs: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
              domains: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setattr(metrics, "METRICS_GLOBS", globs)
        host = Collector(clock=lambda: NOW).collect(h, domains=domains)
    assert host.up, host.error
    host = host.__class__(**{**host.__dict__, "duration_s": None})
    return MetricsSnapshot(collected_at=NOW, hosts=(host,)).to_dict()


def _with_vgpus(h: SimHost) -> list[tuple[str, str]]:
    """One vGPU of the first creatable type on each mdev parent that has one, and a domain for each."""
    doms = []
    types = h.read(["/sys/class/mdev_bus/*/mdev_supported_types/*/available_instances"])
    taken = set()
    for path in sorted(types):
        parent = path.split("/")[4]
        if parent in taken or (types.text(path) or "0") == "0":
            continue
        u = str(uuid.uuid4())
        if h.apply([Op.write(path.rsplit("/", 1)[0] + "/create", u)]).ok:
            taken.add(parent)
            doms.append((f"vm-{len(doms)}", f"<domain type='kvm'><name>vm-{len(doms)}</name><memory>1</memory>"
                         f"<os><type arch='x86_64'>hvm</type></os><devices><hostdev mode='subsystem' type='mdev'>"
                         f"<source><address uuid='{u}'/></source></hostdev></devices></domain>"))
        if len(taken) >= 3:
            break
    return doms


def test_the_left_out_globs_are_the_inventorys() -> None:
    assert set(METRICS_GLOBS) < set(INVENTORY_GLOBS)
    assert len(INVENTORY_GLOBS) - len(METRICS_GLOBS) == len(metrics._NOT_FOR_METRICS)


@pytest.mark.parametrize("profile", PROFILES)
def test_a_collection_with_fewer_reads_gives_the_same_snapshot(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    h = SimHost.from_profile(profile)
    h.model.telemetry.clock = lambda: NOW
    assert _snapshot(h, METRICS_GLOBS, monkeypatch) == _snapshot(h, INVENTORY_GLOBS, monkeypatch)
    doms = _with_vgpus(h)
    assert _snapshot(h, METRICS_GLOBS, monkeypatch, doms) == _snapshot(h, INVENTORY_GLOBS, monkeypatch, doms)
