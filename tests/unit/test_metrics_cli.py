"""``vgpuvirt metrics``: one snapshot of one or several hosts, as JSON or a table; bad input is one line."""

from __future__ import annotations

import json

from vgpuvirt.cli import main
from vgpuvirt.services.metrics_model import MetricsSnapshot


def test_json_snapshot_of_several_hosts(capsys):
    assert main(["metrics", "sim:t4x2", "sim:l40s-vgpu17", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [h["host"] for h in data["hosts"]] == ["sim:t4x2", "sim:l40s-vgpu17"]
    assert all(h["up"] and h["round_trips"] == 1 for h in data["hosts"])
    snap = MetricsSnapshot.from_dict(data)
    assert snap.host("sim:t4x2") is not None and len(snap.host("sim:t4x2").gpus) == 2


def test_global_host_and_table(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("VGPUVIRT_SIM_FAULTS", str(tmp_path / "f.json"))
    assert main(["sim", "fault", "t4x2", "0000:d8:00.0", "xid", "79"]) == 0
    capsys.readouterr()
    assert main(["--host", "sim:t4x2", "metrics"]) == 0
    out = capsys.readouterr().out
    assert "sim:t4x2: 2 GPU(s)" in out and "1 round trip(s)" in out
    assert "0000:d8:00.0 unhealthy: GPU has fallen off the bus (XID 79)" in out
    assert "0000:d8:00.0 XID 79: GPU has fallen off the bus." in out


def test_connect_with_several_hosts_is_refused(capsys):
    assert main(["metrics", "sim:t4x2", "sim:a16", "--connect", "test:///default"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--connect" in err[0]


def test_unknown_host_spec_is_one_line(capsys):
    assert main(["metrics", "bogus://x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus://x" in err[0]
