"""The ways one GPU can serve one GPU request, ranked, and what choosing one does to the GPU's state.

Shared by the greedy placement (:mod:`.placement`) and the exhaustive fallback (:mod:`.search`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from vgpuvirt.provision.request import TypeProfile, VgpuRequest, VmRequest, fit, smallest_key
from vgpuvirt.provision.state import GpuState, HostState, Slot
from vgpuvirt.usage import GpuUse

# Module names for the members the inner loops compare with: a lookup of ``GpuUse.X`` costs ~70 ns on Python 3.11
# (bench_placement's search ran 10% slower with it).
_WHOLE, _VF = GpuUse.WHOLE, GpuUse.VF

Policy = Literal["binpack", "spread"]
POLICIES = ("binpack", "spread")


class Candidate(NamedTuple):
    """One line of a plan's explanation. (A named tuple, not a frozen dataclass: a fleet's plan makes one per
    eligible GPU per VM, 16,000 for 32 hosts of 8 VMs, and a tuple is made in half the time.)"""

    vm: str
    host: str
    gpu: str
    verdict: Literal["chosen", "eligible", "skipped"]
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"vm": self.vm, "host": self.host, "gpu": self.gpu, "verdict": self.verdict, "reason": self.reason}


class _Eligible(NamedTuple):
    """The "eligible" lines of one VM, not yet made: every option it was offered but the chosen GPU's."""
    vm: str
    options: Sequence[tuple[tuple[object, ...], Option]]
    best_host: str
    best_gpu: object
    policy: str


class Explanation(Sequence[Candidate]):
    """A plan's explanation: its :class:`Candidate` lines in order, the "eligible" ones made when first read.

    A pool of VMs over a fleet offers every eligible GPU of the fleet to every VM: hosts x VMs lines (16,000
    for 32 hosts of 8 VMs), which made placement grow faster than the fleet. Only ``--explain`` and a plan's
    JSON read them; a plan that is applied pays for one reference per VM instead.
    """

    def __init__(self, items: Sequence[Candidate] = ()) -> None:
        self._items: list[Candidate | _Eligible] = list(items)
        self._lazy = False

    def append(self, c: Candidate) -> None:
        self._items.append(c)

    def extend(self, cs: Sequence[Candidate]) -> None:
        self._items.extend(cs)

    def add_eligible(self, vm: str, options: Sequence[tuple[tuple[object, ...], Option]], best: Option,
                     policy: str) -> None:
        """The lines of ``options`` (kept, not copied: the caller makes a new list per VM) except ``best``'s."""
        self._items.append(_Eligible(vm, options, best.gpu.host, best.gpu.address, policy))
        self._lazy = True

    def _lines(self) -> list[Candidate]:
        if self._lazy:
            made: list[Candidate] = []
            # one line's text per option, shared by every VM that was offered it (options carry over)
            text: dict[int, tuple[Option, str, str, str]] = {}
            for item in self._items:
                if isinstance(item, Candidate):
                    made.append(item)
                    continue
                for _, o in item.options:
                    line = text.get(id(o))
                    if line is None or line[0] is not o:
                        line = text[id(o)] = (o, o.gpu.host, str(o.gpu.address),
                                              f"{o.reason}; ranked lower ({item.policy})")
                    if line[1] != item.best_host or o.gpu.address != item.best_gpu:
                        made.append(Candidate(item.vm, line[1], line[2], "eligible", line[3]))
            self._items[:] = made
            self._lazy = False
        return self._items  # type: ignore[return-value]  # no _Eligible left

    def __len__(self) -> int:
        return len(self._lines())

    def __getitem__(self, i: Any) -> Any:
        return self._lines()[i]

    def __iter__(self) -> Iterator[Candidate]:
        return iter(self._lines())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Explanation):
            return self._lines() == other._lines()
        return isinstance(other, list) and self._lines() == other

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it replaces

    def __repr__(self) -> str:
        return f"Explanation({self._lines()!r})"


@dataclass(frozen=True)
class Option:
    gpu: GpuState
    slot: Slot
    type: TypeProfile
    numa_penalty: int
    reason: str


@functools.lru_cache(maxsize=4096)
def _fit(req: VgpuRequest, t: TypeProfile) -> str | None:
    return fit(req, t)


def _passthrough(req: VgpuRequest, g: GpuState, numa_penalty: int) -> Option | str:
    whole = next((s for s in g.slots if s.kind is _WHOLE), None)
    if whole is None:
        return "cannot be passed through whole"
    if g.whole_taken:
        return f"whole GPU {g.whole_taken}"
    if g.boot_vga and not req.allow_boot_vga:
        return "boot VGA device (the host's console): not taken unless asked (boot_vga=yes)"
    if g.residents:
        return f"PF/VF exclusivity: {g.residents} vGPU(s) exist or are planned on it"
    if g.vfs_in_use:
        return f"PF/VF exclusivity: {g.vfs_in_use} of its VFs are in use"
    if g.whole_blocked:
        return f"not passed through whole: {g.whole_blocked}"
    along = [str(a) for a in whole.functions if a != g.address]
    return Option(g, whole, whole.profiles["passthrough"], numa_penalty,
                   "whole GPU is free, IOMMU group viable" + (f"; {', '.join(along)} go along" if along else ""))


def _fitting_types(req: VgpuRequest, g: GpuState) -> tuple[dict[str, TypeProfile], list[str]]:
    types: dict[str, TypeProfile] = {}
    misfit: list[str] = []
    for tid, prof in g.type_profiles.items():
        why = _fit(req, prof)
        if why is None:
            types[tid] = prof
        elif len(misfit) < 2:
            misfit.append(f"{tid} {why}")
    return types, misfit


def evaluate(vm: VmRequest, req: VgpuRequest, g: GpuState) -> Option | str:
    """The best way ``g`` can serve ``req``, or why it cannot."""
    if vm.host is not None and g.host != vm.host:
        return f"VM is pinned to host {vm.host}"
    if g.cordoned:
        return f"host {g.host} is cordoned: {g.cordoned}"
    if g.unhealthy:
        return f"unhealthy: {g.unhealthy}"
    if req.vendor and g.vendor != req.vendor:
        return f"vendor {g.vendor}, not {req.vendor}"
    numa_penalty = 0
    if vm.numa_node is not None and g.numa_node is not None and g.numa_node != vm.numa_node:
        if vm.numa_strict:
            return f"NUMA node {g.numa_node}, VM needs node {vm.numa_node}"
        numa_penalty = 1
    if req.mode == "passthrough":
        return _passthrough(req, g, numa_penalty)
    if g.whole_taken:
        return f"whole GPU {g.whole_taken}"
    if req.mode == "vf":
        for s in g.slots:
            if s.kind is _VF and s.available.get("vf", 0) > 0:
                return Option(g, s, s.profiles["vf"], numa_penalty, f"free VF {s.address}")
        return "no free VF" if any(s.kind is _VF for s in g.slots) else "has no plain VFs"
    opts = _vgpu_options(req, g, numa_penalty)
    return opts[0] if isinstance(opts, list) else opts


def options_for(vm: VmRequest, req: VgpuRequest, g: GpuState) -> list[Option]:
    """Every way ``g`` can serve ``req`` now (each fitting vGPU type, smallest first); [] when none."""
    first = evaluate(vm, req, g)
    if isinstance(first, str):
        return []
    if req.mode != "vgpu":
        return [first]
    opts = _vgpu_options(req, g, first.numa_penalty)
    return opts if isinstance(opts, list) else []


def _vgpu_options(req: VgpuRequest, g: GpuState, numa_penalty: int) -> list[Option] | str:
    """Every fitting type the GPU's budget still takes, smallest first, or why none."""
    types, misfit = _fitting_types(req, g)
    if not types:
        if not any(s.kind.is_vgpu for s in g.slots):
            if g.sriov_capable:
                return (f"offers no vGPU types yet: SR-IOV is off ({g.sriov_capable} VFs possible; "
                        "its vGPU types appear on the VFs once enabled)")
            return "offers no vGPU types"
        return "no type fits (" + "; ".join(misfit) + ("; ..." if misfit else "") + ")"
    # Why each fitting type was refused, smallest first: the smallest is what the user asked for, so its
    # reason leads the message; the larger ones are counted, not listed.
    refused: list[str] = []
    found: list[Option] = []
    mine = [s for s in g.slots if s.kind.is_vgpu]
    # Only the slots placement may use (a caller may have narrowed g.slots) and that are not blocked.
    allowed = ({str(s.address) for s in mine if s.blocked is None} if len(mine) != len(g.budget.places) else None)
    blocked = {str(s.address) for s in mine if s.blocked is not None} if allowed is None else set()
    for prof in sorted(types.values(), key=smallest_key):
        f = g.budget.fit(prof.id)
        if f.fits_now <= 0:
            refused.append(f"{prof.id}: {f.reason}")
            continue
        place = g.budget.free_place(prof.id, among=allowed, exclude=blocked)
        if place is None:
            refused.append(f"{prof.id}: {f.reason}, but no free place offers it")
            continue
        slot = next(s for s in g.slots if str(s.address) == place.address and s.kind.is_vgpu)
        found.append(Option(g, slot, prof, numa_penalty, f"{f.reason}; {f.fits_now - 1} left after this one"))
    if found:
        return found
    if not refused:
        return "no free instance"
    more = f" (and {len(refused) - 1} larger fitting type(s) refused)" if len(refused) > 1 else ""
    notes = f" [{'; '.join(g.budget.notes)}]" if g.budget.notes else ""
    return refused[0] + more + notes


def _policy_key(o: Option, host: HostState, policy: Policy, host_used: int | None = None) -> tuple[int, ...]:
    used = host.used if host_used is None else host_used
    if policy == "spread":
        return (used, o.gpu.used)
    return (-o.gpu.used, -used)


def rank_key(o: Option, host: HostState, policy: Policy, order: Mapping[str, int]) -> tuple[object, ...]:
    """NUMA match, smallest framebuffer, the policy, host order, address: lower is better."""
    return (o.numa_penalty, o.type.framebuffer_mib or 0, _policy_key(o, host, policy), order[host.name], o.gpu.address)


def commit(o: Option) -> None:
    g, s, t = o.gpu, o.slot, o.type
    if s.kind is _WHOLE:
        g.whole_taken = "planned for passthrough"
        g.budget = g.budget.whole_taken("(planned)")
        return
    if s.kind is _VF:
        s.available["vf"] = 0
        g.vfs_in_use += 1
        return
    g.budget = g.budget.with_vgpu(t.id, str(s.address))
    if s.is_vf:
        s.blocked = "VF holds a planned vGPU"


#: What :func:`evaluate` found for one GPU, kept while the GPU's state stays as it was: per kind of request
#: (what of the VM and its request evaluate reads), the GPU's id -> the state it was found in and the answer.
EvalMemo = dict[object, dict[int, tuple[tuple[object, ...], "Option | str"]]]


def _state_of(g: GpuState) -> tuple[object, ...]:
    # commit() changes a GPU only through these (the budget is replaced, never changed in place). The GPU and
    # its budget are held and compared by identity: a clone shares its original's budget, and a dead GPU's
    # id may be given to a new one, so neither id nor equality alone would do.
    return (g, g.budget, g.whole_taken, g.vfs_in_use, g.unhealthy, g.whole_blocked)


def rank(vm: VmRequest, req: VgpuRequest, hosts: Sequence[HostState], policy: Policy,
         order: Mapping[str, int], memo: EvalMemo | None = None
         ) -> tuple[list[tuple[tuple[object, ...], Option]], list[Candidate]]:
    """Every GPU's best way to serve ``req``, best first, and the skipped GPUs with their reasons. With
    ``memo`` (one dict for a whole placement pass), a GPU whose state did not change since it was evaluated
    for an alike VM is not evaluated again: a pool of VMs changes one GPU per VM, so re-evaluating every GPU
    of every host for each VM made a fleet's placement grow with hosts x VMs. What is still done per GPU
    per VM (the memo's look-up, the ranking key) is kept to a few field reads: it is hosts x VMs."""
    options: list[tuple[tuple[object, ...], Option]] = []
    notes: list[Candidate] = []
    # the request's kind is hashed once per call (its dataclasses hash in Python), not once per GPU
    seen = memo.setdefault((req, vm.host, vm.numa_node, vm.numa_strict), {}) if memo is not None else None
    spread = policy == "spread"
    for h in hosts:
        host_used = h.used           # once per host, not per GPU: it sums over the host's GPUs
        host_order = order[h.name]
        for g in h.gpus:
            r: Option | str
            if seen is None:
                r = evaluate(vm, req, g)
            else:
                hit = seen.get(id(g))
                if hit is not None and hit[0][0] is g and hit[0][1] is g.budget and hit[0][2] == g.whole_taken \
                        and hit[0][3] == g.vfs_in_use and hit[0][4] == g.unhealthy and hit[0][5] == g.whole_blocked:
                    r = hit[1]
                else:
                    r = evaluate(vm, req, g)
                    seen[id(g)] = (_state_of(g), r)
            if isinstance(r, str):
                notes.append(Candidate(vm.name, h.name, str(g.address), "skipped", r))
            else:
                used = g.used   # what _policy_key reads, inlined: this runs hosts x VMs times
                policy_key = (host_used, used) if spread else (-used, -host_used)
                key_ = (r.numa_penalty, r.type.framebuffer_mib or 0, policy_key, host_order, g.address)
                options.append((key_, r))
    options.sort(key=lambda kv: kv[0])  # type: ignore[arg-type,return-value]
    return options, notes
