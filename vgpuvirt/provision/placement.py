"""Where each VM's GPUs go, and why: binpack or spread across GPUs and hosts, NUMA affinity,
the equal-size rule (or heterogeneous mode), PF/VF exclusivity.

:func:`place` is pure: it takes :class:`~vgpuvirt.provision.state.HostState` objects (mutating
them to account for what it plans) and returns one :class:`Assignment` per GPU request plus, per
VM, a :class:`Candidate` line for every GPU it looked at (chosen / skipped and why) - what
``--explain`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.bound import refusal
from vgpuvirt.provision.options import POLICIES, Candidate, EvalMemo, Option, Policy, commit, rank
from vgpuvirt.provision.request import TypeProfile, VmRequest
from vgpuvirt.provision.search import DEFAULT_LIMIT, search, worth_searching
from vgpuvirt.provision.state import HostState

__all__ = ["POLICIES", "Assignment", "Candidate", "Policy", "place"]


@dataclass(frozen=True)
class Assignment:
    vm: str
    index: int                      # which of the VM's GPU requests
    host: str
    gpu: PciAddress                 # the physical GPU
    slot: PciAddress                # where the instance is created / what is passed through
    kind: str                       # mdev | vendor-vf | vf | whole
    type: TypeProfile
    functions: tuple[PciAddress, ...] = ()
    numa_node: int | None = None


def _why_best(o: Option, policy: Policy, vm: VmRequest) -> str:
    bits = [o.reason, f"smallest fitting type {o.type.describe()}" if o.slot.kind in ("mdev", "vendor-vf") else "",
            f"{policy}: {o.gpu.used - 1} already on this GPU"]
    if vm.numa_node is not None:
        bits.append("same NUMA node" if o.numa_penalty == 0
                    else f"NUMA node {o.gpu.numa_node} (VM prefers {vm.numa_node})")
    return "; ".join(b for b in bits if b)


def place(vms: Sequence[VmRequest], hosts: Mapping[str, HostState], *, policy: Policy = "binpack",
          search_limit: int = DEFAULT_LIMIT) -> tuple[list[Assignment], list[Candidate]]:
    """Assign every GPU request of every VM: each VM takes its best-ranked option; when that leaves a later
    VM without room, a bounded search (:mod:`.search`) looks for a placement that fits everything. Raises
    NoCapacity (every GPU considered for the VM that did not fit, with its reason) when none is found.
    ``hosts`` is updated to account for what is placed."""
    if policy not in POLICIES:
        raise InvalidSpec("placement policy", policy, "binpack or spread")
    work = {k: v.clone() for k, v in hosts.items()}
    try:
        assignments, explain = _greedy(vms, work, policy)
    except NoCapacity as exc:
        if not worth_searching(vms):
            raise
        # The budgets first: where a count proves that nothing fits, say so now instead of searching (a
        # refusal on `large` took 1.2 s of search against 40 ms for the greedy pass).
        why = refusal(vms, hosts) if search_limit > 0 else None
        if why is not None:
            raise NoCapacity(exc.host, exc.device, f"{_reason(exc)}; no other placement fits either: {why}") from exc
        work = {k: v.clone() for k, v in hosts.items()}
        found = search(vms, work, policy=policy, limit=search_limit)
        if found is None:
            raise NoCapacity(exc.host, exc.device, f"{_reason(exc)}; the budgets allow a fit, but a search of "
                                                   f"up to {search_limit} choices found none") from exc
        assignments, explain = _searched(vms, found, policy)
    for name, h in hosts.items():
        h.gpus[:] = work[name].gpus
        h.free_nic_vfs[:] = work[name].free_nic_vfs
    return assignments, explain


def _reason(exc: NoCapacity) -> str:
    # DeviceError's text is "host: device: reason"; the reason alone, to extend it
    return str(exc).removeprefix(f"{exc.host}: {exc.device}: ")


def _searched(vms: Sequence[VmRequest], found: list[list[Option]], policy: Policy
              ) -> tuple[list[Assignment], list[Candidate]]:
    assignments: list[Assignment] = []
    explain: list[Candidate] = []
    for vm, picks in zip(vms, found, strict=True):
        first = picks[0]
        explain.append(Candidate(vm.name, first.gpu.host, str(first.gpu.address), "chosen",
                                 _why_best(first, policy, vm) + "; found by search (each VM's first choice "
                                 "left no room for a later one)"))
        for i, o in enumerate(picks):
            assignments.append(Assignment(vm.name, i, o.gpu.host, o.gpu.address, o.slot.address, o.slot.kind,
                                          o.type, o.slot.functions, o.gpu.numa_node))
    return assignments, explain


def _greedy(vms: Sequence[VmRequest], hosts: Mapping[str, HostState], policy: Policy
            ) -> tuple[list[Assignment], list[Candidate]]:
    """Each VM in order takes its best-ranked option. Raises NoCapacity (with the explanation of the VM that
    did not fit) when one cannot be placed; ``hosts`` is updated as it goes."""
    order = {name: i for i, name in enumerate(hosts)}
    host_list = list(hosts.values())
    assignments: list[Assignment] = []
    explain: list[Candidate] = []
    memo: EvalMemo = {}      # each VM changes one GPU: the others' evaluations carry over to the next VM
    lower: dict[int, tuple[Option, str]] = {}   # id(option) -> (option, its "ranked lower" line)
    for vm in vms:
        first, notes = rank(vm, vm.gpus[0], host_list, policy, order, memo)
        chosen: list[Option] | None = None
        for _, opt in first:
            # Every GPU of one VM sits on one host: try the remaining requests on the same host.
            trial = hosts[opt.gpu.host].clone() if len(vm.gpus) > 1 else None
            picks = [opt]
            if trial is not None:
                tgpu = next(g for g in trial.gpus if g.address == opt.gpu.address)
                tslot = next(s for s in tgpu.slots if s.address == opt.slot.address and s.kind == opt.slot.kind)
                topt = Option(tgpu, tslot, opt.type, opt.numa_penalty, opt.reason)
                commit(topt)
                picks = [topt]
                for req in vm.gpus[1:]:
                    more, _ = rank(vm, req, [trial], policy, order)
                    if not more:
                        break
                    commit(more[0][1])
                    picks.append(more[0][1])
                if len(picks) != len(vm.gpus):
                    continue
                hosts[opt.gpu.host].gpus[:] = trial.gpus  # adopt the trial's accounting
                hosts[opt.gpu.host].free_nic_vfs[:] = trial.free_nic_vfs
            else:
                commit(opt)
            chosen = picks
            break
        if chosen is None:
            for _, o in first:
                notes.append(Candidate(vm.name, o.gpu.host, str(o.gpu.address), "skipped",
                                       f"{o.reason}, but the VM's other GPUs do not fit on {o.gpu.host}"))
            explain.extend(notes)
            # Every GPU considered, with its budget's reason (the first 16; --explain lists them all).
            reasons = "; ".join(f"{c.host} {c.gpu}: {c.reason}" for c in notes[:16])
            if len(notes) > 16:
                reasons += f"; and {len(notes) - 16} more GPU(s) (--explain lists them all)"
            raise NoCapacity(", ".join(hosts) or "no host", vm.name,
                             f"no GPU can serve {vm.gpus[0].describe()}: {reasons or 'no GPUs at all'}")
        explain.append(Candidate(vm.name, chosen[0].gpu.host, str(chosen[0].gpu.address), "chosen",
                                 _why_best(chosen[0], policy, vm)))
        best = chosen[0].gpu
        for _, o in first:
            if o.gpu.host != best.host or o.gpu.address != best.address:   # the cheap test first
                # Options carry over from VM to VM (rank's memo): each one's line is worded once, not once per
                # VM (a fleet's pool of VMs lists every eligible GPU for every VM).
                worded = lower.get(id(o))
                if worded is None or worded[0] is not o:
                    worded = lower[id(o)] = (o, f"{o.reason}; ranked lower ({policy})")
                explain.append(Candidate(vm.name, o.gpu.host, str(o.gpu.address), "eligible", worded[1]))
        explain.extend(notes)
        for i, o in enumerate(chosen):
            assignments.append(Assignment(vm.name, i, o.gpu.host, o.gpu.address, o.slot.address, o.slot.kind,
                                          o.type, o.slot.functions, o.gpu.numa_node))
    return assignments, explain
