"""Where each VM's GPUs go, and why: binpack or spread across GPUs and hosts, NUMA affinity,
the equal-size rule (or heterogeneous mode), PF/VF exclusivity.

:func:`place` is pure: it takes :class:`~vgpuvirt.provision.state.HostState` objects (mutating
them to account for what it plans) and returns one :class:`Assignment` per GPU request plus, per
VM, a :class:`Candidate` line for every GPU it looked at (chosen / skipped and why) - what
``--explain`` prints.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vgpuvirt.errors import NoCapacity
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.request import TypeProfile, VgpuRequest, VmRequest, fit, smallest_key
from vgpuvirt.provision.state import GpuState, HostState, Slot

Policy = Literal["binpack", "spread"]
POLICIES = ("binpack", "spread")


@dataclass(frozen=True)
class Candidate:
    vm: str
    host: str
    gpu: str
    verdict: Literal["chosen", "eligible", "skipped"]
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"vm": self.vm, "host": self.host, "gpu": self.gpu, "verdict": self.verdict, "reason": self.reason}


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


@dataclass(frozen=True)
class _Option:
    gpu: GpuState
    slot: Slot
    type: TypeProfile
    numa_penalty: int
    reason: str


@functools.lru_cache(maxsize=4096)
def _fit(req: VgpuRequest, t: TypeProfile) -> str | None:
    return fit(req, t)


def _passthrough(req: VgpuRequest, g: GpuState, numa_penalty: int) -> _Option | str:
    whole = next((s for s in g.slots if s.kind == "whole"), None)
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
    return _Option(g, whole, whole.profiles["passthrough"], numa_penalty,
                   "whole GPU is free, IOMMU group viable" + (f"; {', '.join(along)} go along" if along else ""))


def _fitting_types(req: VgpuRequest, g: GpuState) -> tuple[dict[str, TypeProfile], list[str]]:
    types: dict[str, TypeProfile] = {}
    misfit: list[str] = []
    for s in g.slots:
        if s.kind not in ("mdev", "vendor-vf"):
            continue
        for tid, prof in s.profiles.items():
            if tid in types:
                continue
            why = _fit(req, prof)
            if why is None:
                types[tid] = prof
            elif len(misfit) < 2 and not any(m.startswith(f"{tid} ") for m in misfit):
                misfit.append(f"{tid} {why}")
    return types, misfit


def _evaluate(vm: VmRequest, req: VgpuRequest, g: GpuState) -> _Option | str:
    """The best way ``g`` can serve ``req``, or why it cannot."""
    if vm.host is not None and g.host != vm.host:
        return f"VM is pinned to host {vm.host}"
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
            if s.kind == "vf" and s.available.get("vf", 0) > 0:
                return _Option(g, s, s.profiles["vf"], numa_penalty, f"free VF {s.address}")
        return "no free VF" if any(s.kind == "vf" for s in g.slots) else "has no plain VFs"
    # vGPU: every fitting type, smallest first, counted by the GPU's budget.
    types, misfit = _fitting_types(req, g)
    if not types:
        if not any(s.kind in ("mdev", "vendor-vf") for s in g.slots):
            if g.sriov_capable:
                return (f"offers no vGPU types yet: SR-IOV is off ({g.sriov_capable} VFs possible; "
                        "its vGPU types appear on the VFs once enabled)")
            return "offers no vGPU types"
        return "no type fits (" + "; ".join(misfit) + ("; ..." if misfit else "") + ")"
    # Why each fitting type was refused, smallest first: the smallest is what the user asked for, so its
    # reason leads the message; the larger ones are counted, not listed.
    refused: list[str] = []
    allowed = {str(s.address) for s in g.slots if s.kind in ("mdev", "vendor-vf") and s.blocked is None}
    for prof in sorted(types.values(), key=smallest_key):
        f = g.budget.fit(prof.id)
        if f.fits_now <= 0:
            refused.append(f"{prof.id}: {f.reason}")
            continue
        place = g.budget.free_place(prof.id, among=allowed)
        if place is None:
            refused.append(f"{prof.id}: {f.reason}, but no free place offers it")
            continue
        slot = next(s for s in g.slots if str(s.address) == place.address and s.kind in ("mdev", "vendor-vf"))
        return _Option(g, slot, prof, numa_penalty, f"{f.reason}; {f.fits_now - 1} left after this one")
    if not refused:
        return "no free instance"
    more = f" (and {len(refused) - 1} larger fitting type(s) refused)" if len(refused) > 1 else ""
    notes = f" [{'; '.join(g.budget.notes)}]" if g.budget.notes else ""
    return refused[0] + more + notes


def _policy_key(o: _Option, host: HostState, policy: Policy) -> tuple[int, ...]:
    if policy == "spread":
        return (host.used, o.gpu.used)
    return (-o.gpu.used, -host.used)


def _commit(o: _Option) -> None:
    g, s, t = o.gpu, o.slot, o.type
    if s.kind == "whole":
        g.whole_taken = "planned for passthrough"
        g.budget = g.budget.whole_taken("(planned)")
        return
    if s.kind == "vf":
        s.available["vf"] = 0
        g.vfs_in_use += 1
        return
    g.budget = g.budget.with_vgpu(t.id, str(s.address))
    if s.is_vf:
        s.blocked = "VF holds a planned vGPU"
    g.planned += 1


def _rank(vm: VmRequest, req: VgpuRequest, hosts: Sequence[HostState], policy: Policy,
          order: Mapping[str, int]) -> tuple[list[tuple[tuple[object, ...], _Option]], list[Candidate]]:
    options: list[tuple[tuple[object, ...], _Option]] = []
    notes: list[Candidate] = []
    for h in hosts:
        for g in h.gpus:
            r = _evaluate(vm, req, g)
            if isinstance(r, str):
                notes.append(Candidate(vm.name, h.name, str(g.address), "skipped", r))
            else:
                key = (r.numa_penalty, r.type.framebuffer_mib or 0, _policy_key(r, h, policy), order[h.name], g.address)
                options.append((key, r))
    options.sort(key=lambda kv: kv[0])  # type: ignore[arg-type,return-value]
    return options, notes


def _why_best(o: _Option, policy: Policy, vm: VmRequest) -> str:
    bits = [o.reason, f"smallest fitting type {o.type.describe()}" if o.slot.kind in ("mdev", "vendor-vf") else "",
            f"{policy}: {o.gpu.used - 1} already on this GPU"]
    if vm.numa_node is not None:
        bits.append("same NUMA node" if o.numa_penalty == 0
                    else f"NUMA node {o.gpu.numa_node} (VM prefers {vm.numa_node})")
    return "; ".join(b for b in bits if b)


def place(vms: Sequence[VmRequest], hosts: Mapping[str, HostState], *, policy: Policy = "binpack"
          ) -> tuple[list[Assignment], list[Candidate]]:
    """Assign every GPU request of every VM, in order. Raises NoCapacity (with the explanation of
    the VM that did not fit) when one cannot be placed; ``hosts`` is updated as it goes."""
    if policy not in POLICIES:
        from vgpuvirt.errors import InvalidSpec
        raise InvalidSpec("placement policy", policy, "binpack or spread")
    order = {name: i for i, name in enumerate(hosts)}
    host_list = list(hosts.values())
    assignments: list[Assignment] = []
    explain: list[Candidate] = []
    for vm in vms:
        first, notes = _rank(vm, vm.gpus[0], host_list, policy, order)
        chosen: list[_Option] | None = None
        for _, opt in first:
            # Every GPU of one VM sits on one host: try the remaining requests on the same host.
            trial = hosts[opt.gpu.host].clone() if len(vm.gpus) > 1 else None
            picks = [opt]
            if trial is not None:
                tgpu = next(g for g in trial.gpus if g.address == opt.gpu.address)
                tslot = next(s for s in tgpu.slots if s.address == opt.slot.address and s.kind == opt.slot.kind)
                topt = _Option(tgpu, tslot, opt.type, opt.numa_penalty, opt.reason)
                _commit(topt)
                picks = [topt]
                for req in vm.gpus[1:]:
                    more, _ = _rank(vm, req, [trial], policy, order)
                    if not more:
                        break
                    _commit(more[0][1])
                    picks.append(more[0][1])
                if len(picks) != len(vm.gpus):
                    continue
                hosts[opt.gpu.host].gpus[:] = trial.gpus  # adopt the trial's accounting
                hosts[opt.gpu.host].free_nic_vfs[:] = trial.free_nic_vfs
            else:
                _commit(opt)
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
        for _, o in first:
            if (o.gpu.host, o.gpu.address) != (chosen[0].gpu.host, chosen[0].gpu.address):
                explain.append(Candidate(vm.name, o.gpu.host, str(o.gpu.address), "eligible",
                                         f"{o.reason}; ranked lower ({policy})"))
        explain.extend(notes)
        for i, o in enumerate(chosen):
            assignments.append(Assignment(vm.name, i, o.gpu.host, o.gpu.address, o.slot.address, o.slot.kind,
                                          o.type, o.slot.functions, o.gpu.numa_node))
    return assignments, explain
