"""The one runner (vgpuvirt.change.runner) on a simulated host: consecutive host steps in one batch, the
journal, rollback in reverse of exactly what ran, undos learned from the host's answer, a step whose ops
succeeded but which did not take effect, a cut batch, and the one report format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from host_state import CutSimHost

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.runner import Runner, run_host, run_hosts
from vgpuvirt.change.step import STEP_KINDS, HostFacts, HostStep, Phase
from vgpuvirt.errors import DeviceError, ProvisioningError
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.model import MdevTypeId, PciAddress
from vgpuvirt.services.mutation import Planned
from vgpuvirt.services.pci import sysfs
from vgpuvirt.sim import SimHost

PARENT = PciAddress.parse("0000:3b:00.0")          # t4x2's first T4
T4_2Q = MdevTypeId.parse("nvidia-231")


def _mdevs(host: SimHost) -> set[str]:
    return set(host.read([f"{sysfs.MDEV_DEVICES}/*"]).children(sysfs.MDEV_DEVICES))


def _create(host: SimHost, vm: str, i: int = 0, type_: MdevTypeId = T4_2Q) -> CreateMdev:
    return CreateMdev(host.name, vm, mdev_uuid_for(vm, i), PARENT, type_)


@dataclass(frozen=True)
class WriteMarker(HostStep):
    """A test kind: write a file in /etc/modprobe.d; its undo writes the old text back. ``learn`` makes its undo come
    from the host's answer (an exec's stdout), ``refuse`` makes ``check`` say it did not take effect."""

    kind: ClassVar[str] = "test-marker"
    phase: ClassVar[Phase] = Phase.PREPARE
    rank: ClassVar[int] = 1
    host: str
    vm: str
    path: str
    text: str
    before: str
    refuse: bool = False

    @property
    def target(self) -> str:
        return self.path

    def describe(self) -> str:
        return f"write {self.text!r} to {self.path}"

    def done_in(self, facts: HostFacts) -> bool:
        return False

    def _write(self, text: str) -> Planned:
        return Planned("test.marker", self.path, (Op.replace_file(self.path, text),),
                       lambda r: DeviceError(self.host, self.path, f"write failed: {r.error}"))

    def item(self, wait_timeout: float) -> Planned:
        return self._write(self.text)

    def undo_item(self, wait_timeout: float) -> Planned:
        return self._write(self.before)

    def check(self, results: tuple[OpResult, ...]) -> str | None:
        return "the host ignored it (test)" if self.refuse else None

    def undone(self) -> str:
        return f"wrote {self.before!r} back to {self.path}"


@pytest.fixture
def host() -> SimHost:
    return SimHost.from_profile("t4x2")


def test_a_kind_registers_itself_by_its_name() -> None:
    assert STEP_KINDS["test-marker"] is WriteMarker
    assert STEP_KINDS["create-mdev"] is CreateMdev


def test_consecutive_host_steps_run_in_one_batch_and_report_in_one_format(host: SimHost) -> None:
    steps = [_create(host, "vm-a", i) for i in range(3)]
    before = host.round_trips
    report = run_host(host, steps, what="test")
    assert host.round_trips - before == 1
    assert {str(s.uuid) for s in steps} <= _mdevs(host)
    assert report.done == [f"{host.name}: {s.describe()}" for s in steps]
    assert report.to_dict()["round_trips"] == {host.name: 1}
    assert report.lines()[0].startswith("done: ")


def test_a_failing_last_step_leaves_the_host_as_before(host: SimHost) -> None:
    before = _mdevs(host)
    # a T4 takes 8 x 2Q: the ninth is refused by the capacity check inside the batch
    steps = [_create(host, "vm-b", i) for i in range(9)]
    with pytest.raises(ProvisioningError) as err:
        run_host(host, steps, what="test")
    assert _mdevs(host) == before
    assert len(err.value.completed) == 8
    assert len(err.value.rollback) == 8 and all("removed vGPU" in r for r in err.value.rollback)
    # in reverse of what ran
    assert [r.rsplit(" ", 1)[-1] for r in err.value.rollback] == [str(s.uuid) for s in reversed(steps[:8])]


def test_rollback_runs_in_reverse_across_batches(host: SimHost) -> None:
    path = "/etc/modprobe.d/vgpuvirt-test-marker.conf"
    r = Runner(host)
    r.run([WriteMarker(host.name, "", path, "one", "")])
    r.run([_create(host, "vm-c")])
    r.run([WriteMarker(host.name, "", path, "two", "one")])
    assert host.read([path]).text(path) == "two"
    lines = r.rollback()
    assert [ln.split(": ", 1)[1] for ln in lines] == [
        f"wrote 'one' back to {path}", f"removed vGPU {mdev_uuid_for('vm-c', 0)}", f"wrote '' back to {path}"]
    assert host.read([path]).text(path) == ""
    assert str(mdev_uuid_for("vm-c", 0)) not in _mdevs(host)
    assert r.rollback() == []          # undone once, not twice


def test_a_step_that_did_not_take_effect_stops_and_is_rolled_back(host: SimHost) -> None:
    path = "/etc/modprobe.d/vgpuvirt-test-refused.conf"
    with pytest.raises(ProvisioningError) as err:
        run_host(host, [_create(host, "vm-d"), WriteMarker(host.name, "", path, "x", "", refuse=True)], what="test")
    assert "the host ignored it" in str(err.value)
    assert str(mdev_uuid_for("vm-d", 0)) not in _mdevs(host)
    assert host.read([path]).text(path) == ""


@dataclass(frozen=True)
class LearnedUndo(WriteMarker):
    """Its undo is made from the host's answer (here: it says what the kernel log held), not known beforehand."""

    kind: ClassVar[str] = "test-learned"
    undo_learned: ClassVar[bool] = True

    def item(self, wait_timeout: float) -> Planned:
        read = Op.exec(["dmesg"], read_only=True)
        return Planned("test.learned", self.path, (read, *self._write(self.text).ops),
                       lambda r: DeviceError(self.host, self.path, f"failed: {r.error}"))

    def undo_item(self, wait_timeout: float) -> None:
        return None

    def undo_from(self, results: tuple[OpResult, ...], wait_timeout: float) -> Planned | None:
        return self._write(f"learned from {len(results[0].stdout.splitlines())} lines") if results[0].ok else None


def test_an_undo_learned_from_the_answer_is_the_one_rolled_back(host: SimHost) -> None:
    path = "/etc/modprobe.d/vgpuvirt-test-learned.conf"
    lines = len(host.run(["dmesg"]).stdout.splitlines())
    r = Runner(host)
    r.run([LearnedUndo(host.name, "", path, "new", before="(unknown)")])
    assert host.read([path]).text(path) == "new"
    r.rollback()
    assert host.read([path]).text(path) == f"learned from {lines} lines"


def test_a_cut_batch_is_reread_and_only_what_happened_and_was_ours_is_undone() -> None:
    host = CutSimHost.from_profile("t4x2")
    assert isinstance(host, CutSimHost)
    host.cut_at = 1                    # the first writing batch runs, then the link drops
    before = _mdevs(host)
    steps = [_create(host, "vm-e", i) for i in range(2)]
    # the second mdev existed before the plan (another caller's): not ours, never removed
    ours = frozenset({str(steps[0].uuid)})
    with pytest.raises(ProvisioningError) as err:
        run_hosts({host.name: steps}, host, {}, ours={host.name: ours})
    assert all("outcome unknown" in c for c in err.value.completed)
    assert _mdevs(host) == before | {str(steps[1].uuid)}
    assert any(f"removed vGPU {steps[0].uuid}" in r for r in err.value.rollback)


def test_steps_after_one_that_did_not_take_effect_in_the_same_batch_are_rolled_back_too(host: SimHost) -> None:
    """The batch runs on past a step whose ops succeeded but which did not take effect (only a failed op stops it):
    the steps after it ran, so they are journaled and undone as well."""
    first, second = "/etc/modprobe.d/vgpuvirt-test-refused-first.conf", "/etc/modprobe.d/vgpuvirt-test-after.conf"
    r = Runner(host)
    with pytest.raises(DeviceError, match="the host ignored it"):
        r.run([WriteMarker(host.name, "", first, "x", "", refuse=True), WriteMarker(host.name, "", second, "y", "")])
    assert host.read([second]).text(second) == "y"               # it ran
    assert len(r.journal.entries) == 2
    r.rollback()
    assert host.read([first, second]).text(first) == "" and host.read([second]).text(second) == ""


@dataclass(frozen=True)
class HalfDone(WriteMarker):
    """Writes its file, then runs a program the host lacks: the step ran in part."""

    kind: ClassVar[str] = "test-half-done"

    def item(self, wait_timeout: float) -> Planned:
        ops = (*self._write(self.text).ops, Op.exec(["no-such-program"]))
        return Planned("test.half", self.path, ops, lambda r: DeviceError(self.host, self.path, "program missing"))


def test_items_that_stand_alone_keep_the_completed_ones_and_undo_only_the_half_done(host: SimHost) -> None:
    done, half = "/etc/modprobe.d/vgpuvirt-test-done.conf", "/etc/modprobe.d/vgpuvirt-test-half.conf"
    r = Runner(host)
    outcomes = r.run_items([WriteMarker(host.name, "", done, "kept", ""), HalfDone(host.name, "", half, "x", "")])
    assert outcomes[0].ok and not outcomes[1].ok and outcomes[1].wrote
    assert host.read([half]).text(half) == "x"
    lines = r.undo_partial()
    assert [ln.split(": ", 1)[1] for ln in lines] == [f"wrote '' back to {half}"]
    assert host.read([half]).text(half) == "" and host.read([done]).text(done) == "kept"
    assert [e.step.target for e in r.journal.entries] == [done]       # the completed item stays journaled


def test_the_report_and_a_step_say_the_same_in_json_for_every_verb(host: SimHost) -> None:
    """The one report format: its JSON keys and rounding, and a step's JSON (its VM named when it has one)."""
    step = _create(host, "vm-json")
    report = run_host(host, [step], what="test")
    d = report.to_dict()
    assert set(d) == {"done", "kept", "seconds", "host_seconds", "round_trips"}
    assert d["host_seconds"].keys() == {host.name} and d["round_trips"] == {host.name: 1}
    assert d["seconds"] == round(report.seconds, 3) and d["host_seconds"][host.name] == round(report.seconds, 3)
    assert step.to_dict() == {"action": "create-mdev", "host": host.name, "vm": "vm-json", "target": str(step.uuid),
                              "parent": str(PARENT), "type": str(T4_2Q)}
    assert "vm" not in WriteMarker(host.name, "", "/etc/modprobe.d/x.conf", "a", "").to_dict()
    with pytest.raises(ProvisioningError) as err:
        run_host(host, [_create(host, "vm-json2", i) for i in range(9)], what="test")   # one more than fits
    assert err.value.rollback and all(r.startswith(f"{host.name}: removed vGPU ") for r in err.value.rollback)
