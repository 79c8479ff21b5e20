"""A bound on the budgets: a refusal proven before any search.

When the greedy placement refuses, :mod:`.search` looks for another placement, up to ``limit`` choices
(~1 s on the ``large`` profile). Often a count proves that none exists: the VMs together need more
framebuffer than every GPU can still give, or more of one kind of request than the GPUs can hold of it.
:func:`refusal` checks those counts on the state as it is; the search runs only when they allow a fit.

Each bound is an upper bound taken from the same budgets placement uses (so it can only be loose, never
refuse what fits); the property tests (tests/property/test_capacity_referee.py) hold the planner, this
bound included, to an exhaustive search with the simulator:

* **a request no GPU serves now** (every GPU considered, in the state as read): nothing placed later can
  make room for it;
* **framebuffer**: each GPU request takes at least the framebuffer of the smallest type any GPU offers it;
  a GPU gives at most ``max(fits_now x size)`` over its time-sliced types in equal-size mode (one size at
  a time), its free framebuffer in mixed-size mode, the sum over MIG-backed / GVT-g types (each capped by
  its own count), its own framebuffer when it can go whole, and each free plain VF's. Any size unknown:
  this bound says nothing;
* **per kind**: VMs that ask for the same single GPU (same request, host, NUMA wish) need that many
  instances; a GPU holds at most ``max(fits_now)`` of them in equal-size mode (the sum in the other modes),
  capped by its free VFs on SR-IOV boards, 1 when it goes whole, its free plain VFs for a VF request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from vgpuvirt.provision.options import Option, options_for
from vgpuvirt.provision.request import VgpuRequest, VmRequest
from vgpuvirt.provision.state import GpuState, HostState
from vgpuvirt.usage import GpuUse

# Module names for the members the inner loops compare with: a lookup of ``GpuUse.X`` costs ~70 ns on Python 3.11
# (bench_placement's search ran 10% slower with it).
_WHOLE, _VF = GpuUse.WHOLE, GpuUse.VF


def _gib(mib: int) -> str:
    return f"{mib / 1024:.0f} GiB" if mib % 1024 == 0 else f"{mib} MiB"


def _options(vm: VmRequest, req: VgpuRequest, gpus: Sequence[GpuState]) -> list[Option]:
    return [o for g in gpus for o in options_for(vm, req, g)]


def _gpu_framebuffer(g: GpuState, modes: Collection[str]) -> int | None:
    """The most framebuffer ``g`` can still give to new vGPUs, VFs or a whole-GPU VM (those of ``modes``,
    the request modes asked for); None: unknown."""
    b = g.budget
    sliced: list[int] = []
    pooled = 0
    for tid, t in b.types.items() if "vgpu" in modes else ():
        n = b.fit(tid).fits_now
        if n <= 0:
            continue
        if t.framebuffer_mib is None:
            return None
        if t.mig_profile is None and t.gvtg is None:
            sliced.append(n * t.framebuffer_mib)
        else:
            pooled += n * t.framebuffer_mib           # each of these types is capped by its own count
    if b.sizing == "mixed" and b.framebuffer_mib:
        used = sum(r.framebuffer_mib or 0 for r in b.residents if r.mig_profile is None)
        ts = min(sum(sliced), max(b.framebuffer_mib - used, 0))
    elif b.sizing == "mixed":
        ts = sum(sliced)
    else:
        ts = max(sliced, default=0)                    # equal-size: one size on the GPU at a time
    total = ts + pooled
    for s in g.slots:
        if s.kind is _WHOLE and "passthrough" in modes and not g.whole_taken and not g.whole_blocked:
            fb = s.profiles["passthrough"].framebuffer_mib
            if fb is None:
                return None
            total = max(total, fb)
        elif s.kind is _VF and "vf" in modes and s.available.get("vf", 0) > 0:
            fb = s.profiles["vf"].framebuffer_mib
            if fb is None:
                return None
            total += fb
    return total


def _gpu_count(vm: VmRequest, req: VgpuRequest, g: GpuState) -> int:
    """The most instances of ``req`` that ``g`` alone can still take."""
    opts = options_for(vm, req, g)
    if not opts:
        return 0
    if req.mode == "passthrough":
        return 1
    if req.mode == "vf":
        return sum(1 for s in g.slots if s.kind is _VF and s.available.get("vf", 0) > 0)
    b = g.budget
    fits = {o.type.id: b.fit(o.type.id).fits_now for o in opts}
    sliced = [n for tid, n in fits.items() if b.types[tid].mig_profile is None and b.types[tid].gvtg is None]
    pooled = sum(n for tid, n in fits.items() if tid not in b.types or b.types[tid].mig_profile is not None
                 or b.types[tid].gvtg is not None)
    n = (sum(sliced) if b.sizing == "mixed" else max(sliced, default=0)) + pooled
    if b.sriov:
        n = min(n, sum(1 for p in b.places if p.is_vf and not p.occupied and any(p.kernel.get(t, 0) > 0
                                                                                   for t in fits)))
    return n


def refusal(vms: Sequence[VmRequest], hosts: Mapping[str, HostState]) -> str | None:
    """Why no placement of ``vms`` on ``hosts`` (as they are) can exist, or None when the bound allows one."""
    gpus = [g for h in hosts.values() for g in h.gpus]
    kinds = Counter((vm.gpus, vm.host, vm.numa_node, vm.numa_strict) for vm in vms)
    first: dict[tuple[object, ...], VmRequest] = {}
    for vm in vms:
        first.setdefault((vm.gpus, vm.host, vm.numa_node, vm.numa_strict), vm)
    need = 0
    need_known = True
    for key, count in kinds.items():
        vm = first[key]
        for req in vm.gpus:
            opts = _options(vm, req, gpus)
            if not opts:
                return f"no GPU can serve {req.describe()} (for {vm.name}) in the hosts' present state"
            sizes = [o.type.framebuffer_mib for o in opts]
            if any(s is None for s in sizes):
                need_known = False
            else:
                need += count * min(s for s in sizes if s is not None)
        if len(vm.gpus) == 1:
            room = sum(_gpu_count(vm, vm.gpus[0], g) for g in gpus)
            if count > room:
                return (f"{count} VMs ask for {vm.gpus[0].describe()} (like {vm.name}); the GPUs can hold at most "
                        f"{room} of it")
    if need_known:
        modes = {req.mode for vm in first.values() for req in vm.gpus}
        give: int | None = 0
        for g in gpus:
            fb = _gpu_framebuffer(g, modes)
            if fb is None:
                give = None
                break
            give = (give or 0) + fb
        if give is not None and need > give:
            return (f"the VMs need at least {_gib(need)} of framebuffer (each request's smallest fitting type); "
                    f"the GPUs can give at most {_gib(give)}")
    return None
