"""Where each VM's GPUs go, and why: binpack or spread across GPUs and hosts, NUMA affinity,
the equal-size rule (or heterogeneous mode), PF/VF exclusivity.

:func:`place` is pure: it reads :class:`~vgpuvirt.provision.state.HostState` objects (never changes
them) and returns a :class:`Placement`: one :class:`Assignment` per GPU request, per VM a
:class:`Candidate` line for every GPU it looked at (chosen / skipped and why; what ``--explain``
prints), and new host states that account for what it placed (the caller plans on with those).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.provision.attachment import Attachment, attachment
from vgpuvirt.provision.bound import refusal
from vgpuvirt.provision.options import POLICIES, Candidate, EvalMemo, Explanation, Option, Policy, commit, rank
from vgpuvirt.provision.request import TypeProfile, VmRequest
from vgpuvirt.provision.search import DEFAULT_LIMIT, search, worth_searching
from vgpuvirt.provision.state import HostState
from vgpuvirt.usage import GpuUse

__all__ = ["POLICIES", "Assignment", "Candidate", "Explanation", "Placement", "Policy", "place"]


@dataclass(frozen=True)
class Assignment:
    vm: str
    index: int                      # which of the VM's GPU requests
    host: str
    gpu: PciAddress                 # the physical GPU
    slot: PciAddress                # where the instance is created / what is passed through
    kind: GpuUse                    # MDEV, VENDOR_VF, VF or WHOLE
    type: TypeProfile
    functions: tuple[PciAddress, ...] = ()
    numa_node: int | None = None

    def attachment(self, uuid: MdevUuid | None = None, *, with_audio: bool = False, frl_off: bool = False,
                   display: bool = False) -> Attachment:
        """What this placed GPU gives the VM: the step that makes its device, its hostdevs, its provenance
        entry (:mod:`.attachment`). ``uuid``: an mdev's, by default the one derived from the VM's name and
        this request's index."""
        if uuid is None and self.kind is GpuUse.MDEV:
            uuid = mdev_uuid_for(self.vm, self.index)
        return attachment(self.host, self.vm, self.kind, self.slot, self.type.id, functions=self.functions,
                          uuid=uuid, with_audio=with_audio, frl_off=frl_off, display=display)


class Placement(NamedTuple):
    """What :func:`place` decided; ``hosts``: copies of the states it was given, with what it placed taken."""

    assignments: list[Assignment]
    explain: Explanation
    hosts: dict[str, HostState]


def _why_best(o: Option, policy: Policy, vm: VmRequest) -> str:
    bits = [o.reason, f"smallest fitting type {o.type.describe()}" if o.slot.kind.is_vgpu else "",
            f"{policy}: {o.gpu.used - 1} already on this GPU"]
    if vm.numa_node is not None:
        bits.append("same NUMA node" if o.numa_penalty == 0
                    else f"NUMA node {o.gpu.numa_node} (VM prefers {vm.numa_node})")
    return "; ".join(b for b in bits if b)


def place(vms: Sequence[VmRequest], hosts: Mapping[str, HostState], *, policy: Policy = "binpack",
          search_limit: int = DEFAULT_LIMIT) -> Placement:
    """Assign every GPU request of every VM: each VM takes its best-ranked option; when that leaves a later
    VM without room, a bounded search (:mod:`.search`) looks for a placement that fits everything. Raises
    NoCapacity (every GPU considered for the VM that did not fit, with its reason) when none is found.
    ``hosts`` is left as it was: the states after placement are the result's ``hosts``."""
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
    return Placement(assignments, explain, work)


def _reason(exc: NoCapacity) -> str:
    # DeviceError's text is "host: device: reason"; the reason alone, to extend it
    return str(exc).removeprefix(f"{exc.host}: {exc.device}: ")


def _searched(vms: Sequence[VmRequest], found: list[list[Option]], policy: Policy
              ) -> tuple[list[Assignment], Explanation]:
    assignments: list[Assignment] = []
    explain = Explanation()
    for vm, picks in zip(vms, found, strict=True):
        first = picks[0]
        explain.append(Candidate(vm.name, first.gpu.host, str(first.gpu.address), "chosen",
                                 _why_best(first, policy, vm) + "; found by search (each VM's first choice "
                                 "left no room for a later one)"))
        for i, o in enumerate(picks):
            assignments.append(Assignment(vm.name, i, o.gpu.host, o.gpu.address, o.slot.address, o.slot.kind,
                                          o.type, o.slot.functions, o.gpu.numa_node))
    return assignments, explain


_KEY = itemgetter(0)    # an option's ranking key, in (key, option)


class _Ranked(NamedTuple):
    kind: object                                        # what of the VM and its first request rank reads
    options: list[tuple[tuple[object, ...], Option]]
    notes: list[Candidate]
    changed: str | None                                 # the host the VM was placed on


def _rank_reusing(vm: VmRequest, host_list: Sequence[HostState], policy: Policy, order: Mapping[str, int],
                  memo: EvalMemo, last: _Ranked | None
                  ) -> tuple[list[tuple[tuple[object, ...], Option]], list[Candidate], _Ranked]:
    """rank() of every host for the VM's first request, reusing the previous VM's ranking when that VM was of
    the same kind: a placement changes only the host it lands on, and a ranking key reads only its own GPU
    and host, so only that host is ranked again. A pool of VMs over a fleet then ranks hosts + VMs GPUs,
    not hosts x VMs (what is still per GPU per VM is the merge: list copies and a sort of sorted runs)."""
    req = vm.gpus[0]
    kind = (req, vm.host, vm.numa_node, vm.numa_strict)
    if last is None or last.changed is None or last.kind != kind:
        options, notes = rank(vm, req, host_list, policy, order, memo)
        return options, notes, _Ranked(kind, options, notes, None)
    changed = last.changed
    again, fresh = rank(vm, req, [h for h in host_list if h.name == changed], policy, order, memo)
    options = [kv for kv in last.options if kv[1].gpu.host != changed]
    for kv in again:
        # the rest is still in order: the changed host's few options go in by bisection (a sort of the fleet's
        # options per VM, a Python key call each, grew with hosts x VMs); after equal keys, as a stable sort
        insort(options, kv, key=_KEY)
    notes = [Candidate(vm.name, c.host, c.gpu, c.verdict, c.reason) for c in last.notes if c.host != changed]
    notes += fresh
    notes.sort(key=lambda c: order[c.host])   # stable: in host order, as rank() lists them
    return options, notes, _Ranked(kind, options, notes, None)


def _greedy(vms: Sequence[VmRequest], hosts: Mapping[str, HostState], policy: Policy
            ) -> tuple[list[Assignment], Explanation]:
    """Each VM in order takes its best-ranked option. Raises NoCapacity (with the explanation of the VM that
    did not fit) when one cannot be placed; ``hosts`` is updated as it goes."""
    order = {name: i for i, name in enumerate(hosts)}
    host_list = list(hosts.values())
    assignments: list[Assignment] = []
    explain = Explanation()
    memo: EvalMemo = {}      # each VM changes one GPU: the others' evaluations carry over to the next VM
    last: _Ranked | None = None                  # the previous VM's ranking, and the host it went to
    for vm in vms:
        first, notes, last = _rank_reusing(vm, host_list, policy, order, memo, last)
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
            done = len({a.vm for a in assignments})
            raise NoCapacity(", ".join(hosts) or "no host", vm.name,
                             f"no GPU can serve {vm.gpus[0].describe()} ({done} of {len(vms)} VMs fit): "
                             f"{reasons or 'no GPUs at all'}", fit=done, wanted=len(vms))
        explain.append(Candidate(vm.name, chosen[0].gpu.host, str(chosen[0].gpu.address), "chosen",
                                 _why_best(chosen[0], policy, vm)))
        # a pool of VMs is offered every eligible GPU of the fleet: those lines are made when read
        explain.add_eligible(vm.name, first, chosen[0], policy)
        explain.extend(notes)
        last = last._replace(changed=chosen[0].gpu.host)
        for i, o in enumerate(chosen):
            assignments.append(Assignment(vm.name, i, o.gpu.host, o.gpu.address, o.slot.address, o.slot.kind,
                                          o.type, o.slot.functions, o.gpu.numa_node))
    return assignments, explain
