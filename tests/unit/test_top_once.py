"""``vgpuvirt top --once`` in a pipe and with ``--json`` (issue 28 item 10): the README says tables are never cut,
and --json is every verb's machine output."""

from __future__ import annotations

import json

from vgpuvirt.cli import main
from vgpuvirt.services.metrics_model import MetricsSnapshot


def test_top_once_piped_is_never_cut(capsys):
    assert main(["top", "sim:l40s-vgpu17", "sim:t4x2", "--once"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    rows = [line for line in out.splitlines() if line.lstrip().startswith("0000:")]
    assert len(rows) == 4 and all("0/49152" in r or "0/16384" in r for r in rows)
    assert all(r.rstrip().endswith("ok") for r in rows)      # the last column, whole, on the row's one line


def test_top_json_prints_one_snapshot(capsys):
    assert main(["--json", "top", "sim:t4x2", "--once"]) == 0
    snap = MetricsSnapshot.from_dict(json.loads(capsys.readouterr().out))
    assert [h.host for h in snap.hosts] == ["sim:t4x2"] and len(snap.hosts[0].gpus) == 2
    assert main(["top", "sim:t4x2", "--json"]) == 0           # no live screen for JSON: one snapshot, exit
    assert json.loads(capsys.readouterr().out)["hosts"][0]["host"] == "sim:t4x2"
