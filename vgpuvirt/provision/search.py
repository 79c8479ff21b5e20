"""When the greedy placement refuses, look for a placement that fits anyway: a bounded depth-first
search over every way each GPU request can be served, in the greedy ranking's order.

Greedy can paint itself into a corner: on two empty T4s, "any vGPU" takes a 1 GiB type on one GPU and a
later VM asking for 2 GiB + 4 GiB on one host has nowhere to go, though a 2 GiB type for the first VM
would have left room. The search tries the alternatives (other types, other GPUs), remembers states
already known to fail (VMs of a pool are alike, so the same states recur), and gives up after
``limit`` choices; the caller then keeps the greedy's refusal and its reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vgpuvirt.provision.options import Option, Policy, commit, options_for, rank_key
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.provision.state import GpuState, HostState

#: Choices tried before the search gives up (it runs only after the greedy placement failed). Each choice
#: ranks every GPU's options again, ~1-7 ms on the large profile: the limit keeps a refusal within seconds.
DEFAULT_LIMIT = 2_000


def worth_searching(vms: Sequence[VmRequest]) -> bool:
    """Whether a greedy refusal can hide a placement that fits. Not for a pool of VMs that all ask for the
    same single GPU: each GPU then holds the most of them with the smallest type it still takes, which is
    what the greedy pass gives it (the property tests check it against an exhaustive search)."""
    kinds = {(vm.gpus, vm.host, vm.numa_node, vm.numa_strict) for vm in vms}
    return len(kinds) > 1 or any(len(vm.gpus) > 1 for vm in vms)


class _GaveUp(Exception):
    pass


def _save(g: GpuState, o: Option) -> tuple[Any, ...]:
    return (g.budget, g.whole_taken, g.vfs_in_use, o.slot.blocked, dict(o.slot.available))


def _restore(g: GpuState, o: Option, saved: tuple[Any, ...]) -> None:
    g.budget, g.whole_taken, g.vfs_in_use, o.slot.blocked, available = saved
    o.slot.available.clear()
    o.slot.available.update(available)


def _signature(hosts: Sequence[HostState]) -> tuple[Any, ...]:
    # Which VF holds a vGPU does not matter (a GPU's VFs are alike): the residents' types and the whole/VF use do.
    return tuple((g.address, tuple(sorted(r.type_id for r in g.budget.residents)), g.whole_taken is not None,
                  g.vfs_in_use) for h in hosts for g in h.gpus)


def search(vms: Sequence[VmRequest], hosts: Mapping[str, HostState], *, policy: Policy,
           limit: int = DEFAULT_LIMIT) -> list[list[Option]] | None:
    """A choice of options per VM (one per GPU request, all on one host) that places every VM, with
    ``hosts`` updated to it; None when there is none or ``limit`` choices did not find one (``hosts`` is
    then as it was)."""
    order = {name: i for i, name in enumerate(hosts)}
    host_list = list(hosts.values())
    failed: set[tuple[Any, ...]] = set()
    chosen: list[list[Option]] = []
    tries = 0

    def ranked(vm: VmRequest, req_index: int, on: Sequence[HostState]) -> list[Option]:
        found = [(rank_key(o, h, policy, order), o) for h in on for g in h.gpus
                 for o in options_for(vm, vm.gpus[req_index], g)]
        found.sort(key=lambda kv: kv[0])  # type: ignore[arg-type,return-value]
        return [o for _, o in found]

    def place_vm(i: int) -> bool:
        if i == len(vms):
            return True
        key = (i, _signature(host_list))
        if key in failed:
            return False
        if place_request(i, 0, host_list, []):
            return True
        failed.add(key)
        return False

    def place_request(i: int, j: int, on: Sequence[HostState], picks: list[Option]) -> bool:
        nonlocal tries
        vm = vms[i]
        if j == len(vm.gpus):
            chosen.append(list(picks))
            if place_vm(i + 1):
                return True
            chosen.pop()
            return False
        for o in ranked(vm, j, on):
            tries += 1
            if tries > limit:
                raise _GaveUp
            saved = _save(o.gpu, o)
            commit(o)
            picks.append(o)
            host = hosts[o.gpu.host]
            if place_request(i, j + 1, [host], picks):
                return True
            picks.pop()
            _restore(o.gpu, o, saved)
        return False

    try:
        return chosen if place_vm(0) else None
    except _GaveUp:
        return None
