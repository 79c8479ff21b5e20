"""``mdev create`` without ``--uuid`` when the link drops after the host ran the create: the UUID was
chosen on the client and printed before the request left, so the rerun with it converges on the
one vGPU the lost batch made instead of creating a second."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from vgpuvirt.change.mdev_service import MdevService
from vgpuvirt.cli import main
from vgpuvirt.cli.context import Context
from vgpuvirt.errors import TransportError
from vgpuvirt.services.vgpu.mdev_state import active_from_snapshot
from vgpuvirt.sim import SimHost

PARENT, TYPE = "0000:3b:00.0", "nvidia-231"
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class CutAfterRunning(SimHost):
    """The first writing batch runs on the host, then the connection 'drops' before the answer."""

    cut = True

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        response = super()._exchange(request, idempotent=idempotent)
        if self.cut and any(o.get("op") == "write" for o in request.get("ops") or ()):
            self.cut = False
            raise TransportError(self.name, "connection lost: simulated cut")
        return response


def mdevs(h: SimHost) -> dict[str, tuple[str, str]]:
    snap = h.read(["/sys/bus/mdev/devices/*", "/sys/bus/mdev/devices/*/mdev_type"])
    return {str(u): v for u, v in active_from_snapshot(snap).items()}


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> CutAfterRunning:
    h = CutAfterRunning.from_profile("t4x2")
    monkeypatch.setattr(Context, "host", lambda self: h)
    return h


@pytest.mark.parametrize("as_json", [False, True])
def test_cut_create_prints_the_uuid_first_and_the_rerun_converges(host, capsys, as_json):
    flag = ["--json"] if as_json else []
    rc = main([*flag, "mdev", "create", "--parent", PARENT, "--type", TYPE])
    out, err = capsys.readouterr()
    assert rc == 1 and "connection lost" in err and "Traceback" not in err
    assert len(mdevs(host)) == 1                        # the lost batch did create it
    (made,) = mdevs(host)
    if as_json:
        # stdout stays JSON-only: the refusal's error object (issue 28), naming the UUID to converge with
        error = json.loads(out)
        assert error["ok"] is False and error["error"] == "TransportError" and f"--uuid {made}" in error["message"]
        intent = json.loads(err.splitlines()[0])        # the intent line came before the request
        assert intent["uuid"] == made and intent["intent"] == "mdev.create" and intent["parent"] == PARENT
    else:
        assert UUID_RE.findall(out) == [made, made]     # "creating mdev U ...; rerun with --uuid U"
    assert f"--uuid {made}" in err                      # the error says how to converge, too
    rc = main([*flag, "mdev", "create", "--parent", PARENT, "--type", TYPE, "--uuid", made])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert mdevs(host) == {made: (PARENT, TYPE)}        # exactly one vGPU for one asked
    if as_json:
        assert json.loads(out)["changed"] is False
    else:
        assert out.startswith("unchanged:")


def test_api_logs_the_generated_uuid_before_sending_and_names_it_on_a_cut(caplog):
    h = CutAfterRunning.from_profile("t4x2")
    with caplog.at_level(logging.INFO, logger="vgpuvirt.audit"), pytest.raises(TransportError) as ei:
        MdevService(h, mdevctl=None).create(PARENT, TYPE)
    (made,) = mdevs(h)
    assert any(made in r.getMessage() for r in caplog.records)
    assert f"uuid={made}" in str(ei.value) and "outcome unknown" in str(ei.value)
    again = MdevService(h, mdevctl=None).create(PARENT, TYPE, made)
    assert not again.changed and list(mdevs(h)) == [made]


def test_the_same_command_rerun_after_a_cut_resumes_the_lost_create(host, capsys):
    """Issue 27: rerunning ``mdev create`` without ``--uuid`` after a cut made a second vGPU (3 of 3). The
    client keeps the UUID of a create whose answer was lost and the same command resumes it."""
    assert main(["mdev", "create", "--parent", PARENT, "--type", TYPE]) == 1
    (made,) = mdevs(host)
    capsys.readouterr()
    assert main(["mdev", "create", "--parent", PARENT, "--type", TYPE]) == 0
    out = capsys.readouterr().out
    assert f"resuming the create of mdev {made}" in out
    assert mdevs(host) == {made: (PARENT, TYPE)}        # one vGPU for one asked
    assert main(["mdev", "create", "--parent", PARENT, "--type", TYPE]) == 0    # settled: a new one now
    assert len(mdevs(host)) == 2


def test_a_create_the_host_answered_leaves_nothing_pending(host, capsys):
    from vgpuvirt.cli.mdev import pending_creates
    host.cut = False
    assert main(["mdev", "create", "--parent", PARENT, "--type", "nvidia-999"]) != 0      # refused by the host
    assert main(["mdev", "create", "--parent", PARENT, "--type", TYPE]) == 0
    assert not [k for k in pending_creates() if k.startswith(f"{host.name} ")]


def test_a_rerun_with_uuid_settles_the_pending_create(host, capsys):
    from vgpuvirt.cli.mdev import pending_creates
    assert main(["mdev", "create", "--parent", PARENT, "--type", TYPE]) == 1
    (made,) = mdevs(host)
    assert pending_creates()[f"{host.name} {PARENT} {TYPE}"] == made
    assert main(["mdev", "create", "--parent", PARENT, "--type", TYPE, "--uuid", made]) == 0
    assert f"{host.name} {PARENT} {TYPE}" not in pending_creates()
