"""The layout verbs over hosts: ``export``, ``plan``, ``apply``, ``assert`` (docs/layouts.md).

Per host, in its own thread (all hosts in parallel), one round trip per phase whatever the number of
GPUs: a read (the inventory), the phase-1 batch (vGPUs that go, sizing, SR-IOV, driver binding, MIG), a
fresh read when phase 1 ran (the VFs it made), the phase-2 batch (vGPU types on VFs, mdevs, the scheduler).
The batches run on the change engine's :class:`~vgpuvirt.change.runner.Runner`: it journals every step
that ran; on a failure it undoes the journal in reverse, in one batch, and :class:`ProvisioningError` says
what had run and what the rollback did. A rerun plans nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from vgpuvirt.change.runner import Runner
from vgpuvirt.errors import HostError, InvalidSpec, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.layout.model import Layout, LayoutConfig
from vgpuvirt.layout.observe import GpuNow, export_layout, gpus_now, missing_claims, with_claims
from vgpuvirt.layout.planner import HostPlan, LayoutStep, plan_host
from vgpuvirt.layout.steps import WAIT
from vgpuvirt.services.capacity.build import physical_gpus
from vgpuvirt.services.inventory.host_read import MIG_TABLES, Want, read_host
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.scheduler import service as vgpu_scheduler

Domains = Iterable[tuple[str, str]] | None
#: Rounds of preparation at most: SR-IOV/driver/MIG mode, then GPU instances on a GPU whose MIG mode it turned on.
MAX_ROUNDS = 3


@dataclass
class HostApply:
    """What ``apply`` did on one host."""

    host: str
    plan: HostPlan
    done: list[LayoutStep] = field(default_factory=list)
    round_trips: dict[str, int] = field(default_factory=dict)   # phase -> round trips it took

    @property
    def changed(self) -> bool:
        return bool(self.done)

    @property
    def pending_reload(self) -> list[LayoutStep]:
        """What was written but takes effect only at the next load of the driver (a scheduler registry key)."""
        return [s for s in self.done if s.reload_pending]

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "changed": self.changed, "plan": self.plan.to_dict(),
                "done": [s.text for s in self.done if not s.reload_pending],
                "pending_driver_reload": [s.text for s in self.pending_reload],
                "round_trips": dict(self.round_trips)}


def read_gpus(host: Host, domains: Domains = None) -> tuple[Inventory, list[GpuNow]]:
    """One round trip (:func:`~vgpuvirt.services.inventory.host_read.read_host`): the inventory and, where the host
    reads its real / (nvidia-smi describes that tree), nvidia-smi's report and MIG tables (``-q -x``,
    ``mig -lgi/-lci/-lgip/-lgipp``) in the same request; and every GPU's vGPU scheduler (NVML, modprobe.d, the
    module's registry parameters)."""
    domains = list(domains) if domains is not None else None      # read twice: the inventory, the claims
    real_root = host.sysfs_root == "/"      # elsewhere (a materialized tree) nvidia-smi would not describe it
    wants = {Want.SYSFS, Want.SCHEDULER, *((Want.NVIDIA_SMI, *MIG_TABLES) if real_root else ())}
    read = read_host(host, wants)
    if not any(p.startswith("/sys/bus/pci/devices/") for p in read.snapshot):
        raise HostError(host.name, f"no sysfs tree here: nothing under {host.sysfs_root.rstrip('/')}/sys/bus/pci")
    inv = read.inventory(domains)
    nvidia = [str(g.address) for g in physical_gpus(inv) if (g.vendor or "").lower() == "0x10de"]
    try:
        sched: vgpu_scheduler.SchedulerRead | None = vgpu_scheduler.parse_read(host.name, nvidia, read.scheduler,
                                                                               read.snapshot)
    except (InvalidSpec, ValueError):
        sched = None        # unreadable registry options: no layout reads them then, and one that sets a policy says so
    gpus = gpus_now(inv, read.mig_state() if real_root else None, sched)
    # the mdevs defined VMs name that are missing (a reboot): the plan makes those again, with their UUIDs
    return inv, with_claims(gpus, missing_claims(inv, domains)) if domains is not None else gpus


def export(host: Host, name: str = "exported", domains: Domains = None) -> Layout:
    inv, gpus = read_gpus(host, domains)
    return export_layout(inv, name, gpus)


def plan(host: Host, config: LayoutConfig, domains: Domains = None) -> HostPlan:
    _, gpus = read_gpus(host, domains)
    return plan_host(host.name, gpus, config)


@dataclass(frozen=True)
class LayoutDiff:
    """``before``: the GPUs a config governs, as the host has them, as a layout document (YAML); ``after``: the
    same document as applying the config leaves it (each GPU that differs takes its config entry, narrowed to
    that GPU's address). Both parse as layouts; a check-mode diff (Ansible's ``diff``) shows each change once,
    as the lines that differ between them."""

    before: str
    after: str
    differences: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.differences)


def diff_documents(host: Host, config: LayoutConfig, domains: Domains = None) -> LayoutDiff:
    """:class:`LayoutDiff` of ``host`` against ``config``, from one read."""
    from vgpuvirt.layout.model import GpuEntry, Selector
    from vgpuvirt.layout.schema import dump_layout

    inv, gpus = read_gpus(host, domains)
    mine = config.resolve([(g.address, g.product, g.pci_id) for g in gpus])
    p = plan_host(host.name, gpus, config)
    changed = {d.gpu for d in p.diffs}
    now = {e.devices[0].value: e for e in export_layout(inv, config.name, gpus).config().entries}
    before: list[GpuEntry] = []
    after: list[GpuEntry] = []
    for g in sorted(mine, key=str):
        was = now.get(str(g))
        if was is None:
            continue
        before.append(was)
        # the config's own words for a GPU it changes ("fill", its scheduler, ...), about that GPU alone
        after.append(replace(mine[g], devices=(Selector("address", str(g)),), vendor=None, device_filter=(),
                             line=None) if g in changed else was)
    differences = tuple(d.format() for d in p.diffs)
    return LayoutDiff(dump_layout(Layout.single(config.name, before, "host")),
                      dump_layout(Layout.single(config.name, after, "host")), differences)


def check(host: Host, config: LayoutConfig, domains: Domains = None) -> list[str]:
    """The differences between the host and the config (empty: the host is in that state)."""
    return check_notes(host, config, domains)[0]


def check_notes(host: Host, config: LayoutConfig, domains: Domains = None) -> tuple[list[str], list[str]]:
    """The differences, and the notes: what is in the state but not active yet (a scheduler policy written to
    the registry key, waiting for the next driver load: nothing apply could do, so not a difference)."""
    domains = list(domains) if domains is not None else None
    inv, gpus = read_gpus(host, domains)
    p = plan_host(host.name, gpus, config)
    # A defined VM whose vGPU is missing is a difference whatever the counts say (the VM would not start),
    # when the config makes vGPUs of its type on its GPU; otherwise (a VM a drain left unfit, a domain with no
    # vgpuvirt metadata saying parent and type) the config could not bring it back: a note.
    names = {t: g.short_name(t) for g in gpus for t in g.type_names}
    chosen = config.resolve([(g.address, g.product, g.pci_id) for g in gpus])
    makes: set[tuple[str, str]] = set()
    for g in gpus:
        e = chosen.get(g.address)
        if e is not None and e.layout.mode in ("vgpu", "mig-vgpu"):
            makes |= {(c.uuid, c.type_id or "") for c in g.claimed for vc in e.layout.vgpu_devices
                      if g.type_id(vc.type) == c.type_id and vc.count != 0}
    missing = missing_claims(inv, domains)
    diffs = [c.describe(names.get(c.type_id or "")) for c in missing if (c.uuid, c.type_id or "") in makes]
    notes = [c.describe(names.get(c.type_id or "")) + ": this config does not make it"
             for c in missing if (c.uuid, c.type_id or "") not in makes]
    return ([d.format() for d in p.diffs] + [f"{s.text}" for s in p.steps if not p.diffs]
            + [f"pending: {x}" for x in p.pending if not p.diffs] + diffs, list(p.notes) + notes)


def apply_host(host: Host, config: LayoutConfig, *, domains: Domains = None, dry_run: bool = False,
               before: Callable[[HostPlan], None] | None = None) -> HostApply:
    """Take one host to ``config``. ``before(plan)`` runs after the read and before any write (the drain
    hooks in there; it may raise to refuse)."""
    runner = Runner(host, wait_timeout=WAIT)
    with runner.counted("read"):
        _, gpus = read_gpus(host, domains)
    p = plan_host(host.name, gpus, config)
    result = HostApply(host.name, p, round_trips=runner.round_trips)
    if dry_run or p.empty:
        return result
    if before is not None:
        before(p)
    planned: dict[int, LayoutStep] = {}         # the runner journals the changes; the report names their steps

    def run(steps: list[LayoutStep], phase: str) -> None:
        planned.update((id(s.change), s) for s in steps)
        runner.run([s.change for s in steps], phase)

    try:
        first, second, rounds = p.phase(1), p.phase(2), 0
        run(first, "prepare")
        while first or (p.pending and rounds == 0):
            # what phase 1 made (VFs, MIG mode) is read again; the rest of the plan is made on it. A MIG mode
            # turned on takes a second round for its GPU instances (their placements are listed only then).
            with runner.counted("re-read"):
                _, gpus = read_gpus(host, domains)
            again = plan_host(host.name, gpus, config)
            rounds += 1
            nxt = again.phase(1)
            if nxt and (rounds >= MAX_ROUNDS or [s.text for s in nxt] == [s.text for s in first]):
                raise VgpuvirtError(f"{host.name}: the host did not reach the prepared state: "
                                    + "; ".join(s.text for s in nxt[:4]))
            first, second = nxt, again.phase(2)
            run(first, "prepare")
        run(second, "devices")
    except Exception as exc:  # every failure, even a bug, must trigger the rollback
        raise runner.fail(exc, f"layout {config.name}") from exc
    result.done = [planned[id(c)] for c in runner.done]
    return result


def apply(hosts: Sequence[Host], config: LayoutConfig, *, domains: Mapping[str, Domains] | None = None,
          dry_run: bool = False, before: Callable[[Host, HostPlan], None] | None = None) -> list[HostApply]:
    """``apply_host`` on every host at once (a thread each). A host that fails is rolled back alone; the
    first failure is raised after every host finished."""
    def one(h: Host) -> HostApply:
        hook = (lambda p: before(h, p)) if before is not None else None
        return apply_host(h, config, domains=(domains or {}).get(h.name), dry_run=dry_run, before=hook)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        futures = [pool.submit(one, h) for h in hosts]
        results: list[HostApply] = []
        first: BaseException | None = None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:  # every host finishes before the first error is raised
                first = first or exc
    if first is not None:
        raise first
    return results
