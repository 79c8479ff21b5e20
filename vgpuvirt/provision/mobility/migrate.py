"""Move a VM with its vGPUs from one host to another: pre-checks, reservation, libvirt migration, cleanup.

::

    facts = read both hosts in parallel (one inventory read + one libvirt query each)
    plan  = plan_migration(...)        pure: every refusal at once, the destination's vGPUs, the rewritten XML
    apply(plan.steps)                  the destination's vGPUs (CreateMdev / SetVfType) in one locked batch,
                                       then MigrateDomain (live, peer-to-peer) or DefineDomain (--offline);
                                       a failure undoes the reservation (the one engine's journal and rollback)
    release the source's vGPUs         only once the VM runs (or is defined) on the destination

libvirt keeps a failed migration on the source: it resumes the domain there and kills the destination's
incoming QEMU. The reservation on the destination is the journal's to undo, so a failure at any point leaves
the VM on the source and nothing reserved on the destination.

The mdev UUID is host-local: the destination gets one of the same type, under the same UUID when it is free
there (vgpuvirt derives UUIDs from the VM's name, so usually it is), else the next UUID derived for the VM.
A vGPU 17+ VF is replaced by a free VF of the same board given the same type. The domain XML sent along
names the destination's devices, and so does its provenance metadata (the ownership record teardown reads).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.device_removal import RemoveDevice
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.runner import Runner
from vgpuvirt.change.step import DeviceStep
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import InvalidSpec, VgpuvirtError
from vgpuvirt.model import MdevTypeId, MdevUuid, PciAddress, VgpuTypeId
from vgpuvirt.provision.mobility.checks import MigrationPlan, Move, Side, plan_migration, read_both
from vgpuvirt.provision.mobility.steps import JobProgress, MigrateDomain
from vgpuvirt.provision.plan import Plan
from vgpuvirt.usage import GpuUse

# -- run it ---------------------------------------------------------------------------------------


@dataclass
class MigrationResult:
    plan: MigrationPlan
    done: list[str]
    released: list[str]
    seconds: float
    phases: dict[str, float]
    round_trips: dict[str, int]
    last_job: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "done": self.done, "released": self.released,
                "seconds": round(self.seconds, 3), "phases": {k: round(v, 3) for k, v in self.phases.items()},
                "round_trips": self.round_trips,
                "downtime_ms": self.last_job.get("downtime"), "memory_remaining": self.last_job.get("memory_remaining")}


class MigrationRefused(VgpuvirtError):
    """The pre-checks refused the migration; ``reasons`` lists every one."""

    def __init__(self, plan: MigrationPlan) -> None:
        self.plan = plan
        self.reasons = list(plan.refusals)
        super().__init__(f"cannot migrate {plan.vm} from {plan.source} to {plan.dest}: " + "; ".join(plan.refusals))


def release_source(side: Side, moves: list[Move], vm: str, *, attempts: int = 5, wait_s: float = 0.5) -> list[str]:
    """Free the source's vGPUs once the VM left. A VF's type is reset only after QEMU has let go of it, which
    is not always at once: retried ``attempts`` times."""
    todo: list[DeviceStep] = []
    for m in moves:
        if m.kind == GpuUse.MDEV and m.source_parent:
            todo.append(CreateMdev(side.name, vm, MdevUuid.parse(m.source), PciAddress.parse(m.source_parent),
                                   MdevTypeId.parse(m.type)))
        elif m.kind == GpuUse.VENDOR_VF:
            todo.append(SetVfType(side.name, vm, PciAddress.parse(m.source), VgpuTypeId.parse(m.type)))
    out: list[str] = []
    runner = Runner(side.host)
    for n in range(attempts):
        if not todo:
            break
        # each removal stands alone (nothing is put back: the VM runs on the destination); the ones QEMU still
        # holds are tried again
        outcomes = runner.run_items([RemoveDevice(side.name, vm, s) for s in todo], standalone=True)
        out += [f"{side.name}: {s.undone()}" for s, o in zip(todo, outcomes, strict=True) if o.ok]
        todo = [s for s, o in zip(todo, outcomes, strict=True) if not o.ok]
        if todo and n + 1 < attempts:
            time.sleep(wait_s)
    out += [f"{side.name}: FAILED to release {s.target} (still held after {attempts} tries)" for s in todo]
    return out


def migrate(vm: str, source: Side, dest: Side, *, live: bool | None = None, dry_run: bool = False,
            postcopy: bool = False, max_downtime_ms: int | None = None, bandwidth_mib: int | None = None,
            peer_uri: str | None = None, on_job: JobProgress | None = None) -> MigrationResult:
    """Move ``vm`` from ``source`` to ``dest``. Raises :class:`MigrationRefused` with every reason when a
    pre-check fails, ProvisioningError (with the rollback's report) when the move fails; then the VM is
    still on the source and nothing is reserved on the destination."""
    from vgpuvirt.provision.apply import apply

    for what, v in (("--max-downtime", max_downtime_ms), ("--bandwidth", bandwidth_mib)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 10**6):
            raise InvalidSpec(what, v, "a positive whole number (milliseconds / MiB per second)")
    if source.name == dest.name:
        raise InvalidSpec("--to", dest.name, "another host than the VM's own")
    t0 = time.monotonic()
    rt0 = {source.name: source.host.round_trips, dest.name: dest.host.round_trips}
    src, dst = read_both(source, dest, vms=(vm,))
    plan = plan_migration(vm, src, dst, live=live, postcopy=postcopy, max_downtime_ms=max_downtime_ms,
                          source_uri=source.conn.uri, peer_uri=peer_uri or dest.conn.uri, bandwidth_mib=bandwidth_mib)
    if plan.ok:
        from vgpuvirt.provision.mobility.nvml_check import nvml_verdicts
        refusals, plan.notes = nvml_verdicts(source, dest, dst, plan)
        plan.refusals += refusals
    if not plan.ok:
        plan.steps = []
        raise MigrationRefused(plan)
    t_read = time.monotonic()
    phases = {"pre-checks": t_read - t0}
    if dry_run:
        return MigrationResult(plan, [], [], time.monotonic() - t0, phases, _rts(source, dest, rt0))
    last: dict[str, Any] = {}

    def watch(stats: dict[str, Any]) -> None:
        last.clear()
        last.update(stats)
        if on_job is not None:
            on_job(stats)

    steps = [MigrateDomain(s.host, s.vm, xml=s.xml, source_uri=s.source_uri, peer_uri=s.peer_uri,
                           bandwidth_mib=s.bandwidth_mib, max_downtime_ms=s.max_downtime_ms, source=source.conn,
                           on_job=watch) if isinstance(s, MigrateDomain) else s for s in plan.steps]
    engine_plan = Plan(steps=steps, kept=[], assignments=[], explain=[], vms=[], hosts=[dest.name],
                       absent_before={dest.name: plan.absent_before})
    t1 = time.monotonic()
    result = apply(engine_plan, {dest.name: dest.host}, {dest.name: dest.conn})
    t2 = time.monotonic()
    if not plan.live:
        source.conn.undefine(vm)
    released = release_source(source, plan.moves, vm)
    t3 = time.monotonic()
    phases.update({"reserve+migrate": t2 - t1, "release": t3 - t2})
    return MigrationResult(plan, result.done, released, t3 - t0, phases, _rts(source, dest, rt0), dict(last))


def _rts(source: Side, dest: Side, rt0: dict[str, int]) -> dict[str, int]:
    return {source.name: source.host.round_trips - rt0[source.name], dest.name: dest.host.round_trips - rt0[dest.name]}


__all__ = ["MigrationRefused", "MigrationResult", "migrate", "release_source"]
