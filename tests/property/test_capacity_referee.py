"""Capacity truth (issue 12): the simulator is the referee of the planner.

For every simulator profile, Hypothesis draws a host state (vGPUs created first through the simulated
kernel, mixed-size mode on or off) and a list of VMs asking for vGPUs by type or by need, whole GPUs,
plain VFs, MIG-backed types. Then:

* soundness: every device the plan proposes is accepted by the simulator when its host operations are
  run against the model (each vGPU step's create, each passthrough/VF's detach + IOMMU group
  viability), and every device is of a kind the request asked for; a planner refusal (NoCapacity) is
  always sound;
* completeness (small profiles): whenever an exhaustive search done with the simulator alone
  (sim_referee.everything_fits) finds that the whole request set fits, the planner does not refuse it;
  except, counted apart, where the host tells the planner too little to count exactly: a mixed-size GPU
  holding a vGPU whose type the host does not name, and a GVT-g pool with something planned on it.

The plan's host steps are run directly against the SimModel rather than through ``apply`` and libvirt:
it is the same kernel rule at a fraction of the cost (CI has 2 cores), and domain definition has no
capacity to check. Examples are derandomized (same cases on every run, no example database).
"""

from __future__ import annotations

import errno
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, note, reject, settings
from hypothesis import strategies as st
from sim_referee import (
    SearchBudgetExceeded,
    Want,
    everything_fits,
    functions_of,
    pass_through,
    satisfies,
    series_of,
    short_name,
    vendor_of,
)

from vgpuvirt import inventory
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.change.nvidia_mode import SetMixedSize
from vgpuvirt.change.vendor_vf import SetVfType
from vgpuvirt.errors import NoCapacity
from vgpuvirt.provision import VgpuRequest, VmRequest, plan
from vgpuvirt.provision.plan import Plan
from vgpuvirt.services.capacity.build import gpu_budgets
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.sim import Profile, SimHost, list_profiles, load_profile
from vgpuvirt.sim.model import SimModel
from vgpuvirt.usage import GpuUse

PROFILES = list_profiles()
# Small enough for an exhaustive search of every placement (few GPUs, few VFs).
SMALL_PROFILES = ["t4x2", "l4-hetero", "a30-mig", "a16", "gvtg", "mxgpu", "desktop", "server-shared-group"]
# The profiles whose cases took 15 s or more on a loaded 2-core machine (issue 25's xdist runs; t4x2's 200
# soundness cases were the inner loop's slowest test at 40 s): `slow`, so `pytest -m "not slow"` keeps the
# cheaper profiles of each property; CI runs every profile.
SLOW_SOUND = {"a100-sriov", "large", "a16", "mixed", "l40s-vgpu17", "l4-hetero", "mxgpu", "t4x2",
              "server-shared-group", "h200"}
SLOW_COMPLETE = {"a16", "t4x2"}


def _marked(profiles: list[str], slow: set[str]) -> list[object]:
    return [pytest.param(p, marks=pytest.mark.slow) if p in slow else p for p in profiles]
# Examples per profile: >= 2,000 cases in all; `large` (256 mdev parents) costs ~0.3 s a case.
SOUND_EXAMPLES = {"large": 30}
SOUND_DEFAULT = 200
COMPLETE_EXAMPLES = 150


def referee_settings(n: int) -> settings:
    return settings(max_examples=n, derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- what a profile offers, read from a fresh simulator ------------------------------------------


@dataclass(frozen=True)
class Menu:
    slot_types: tuple[tuple[str, str], ...]       # (mdev parent or vGPU 17+ VF, type sysfs id)
    spellings: tuple[str, ...]                    # ways to name a type: nvidia-231, 231, GRID T4-2Q, T4-2Q
    framebuffers: tuple[int, ...]
    series: tuple[str, ...]
    vendors: tuple[str, ...]                      # of the display-class PFs
    wholes: bool                                  # a display-class PF that is not the boot VGA
    plain_vfs: bool                               # a VF of a display-class PF without a vGPU backend


@functools.cache
def menu_of(profile: str) -> Menu:
    model = SimModel(load_profile(profile))
    slots: list[tuple[str, str]] = []
    types = {}
    for dev in model.devices.values():
        if model.mdev_table(dev) is not None or model.is_vendor_vf(dev):
            assert dev.gpu is not None
            for t in dev.gpu.table.types:
                slots.append((dev.addr, t.sysfs_id))
                types[t.sysfs_id] = t
    spellings: set[str] = set()
    for t in types.values():
        spellings |= {t.sysfs_id, t.name, short_name(t)}
        if t.number is not None:
            spellings.add(str(t.number))
    fbs = {t.framebuffer_mib for t in types.values() if t.framebuffer_mib} | {1500, 3000}
    vendors = {vendor_of(d) for d in model.devices.values() if d.physfn is None and d.spec.pci_class >> 16 == 0x03}
    vendors.discard("other")                      # a request names nvidia, intel or amd (ASPEED BMC VGA: other)
    pfs = [d for d in model.devices.values() if d.physfn is None and d.spec.pci_class >> 16 == 0x03]
    return Menu(tuple(slots), tuple(sorted(spellings)), tuple(sorted(fbs)),
                tuple(sorted({s for t in types.values() if (s := series_of(t))})), tuple(sorted(vendors)),
                any(not d.spec.boot_vga for d in pfs), any(d.numvfs and d.gpu is None for d in pfs))


@functools.cache
def profile_of(name: str) -> Profile:
    return load_profile(name)


# -- scenarios -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    profile: str
    heterogeneous: bool                           # the planner's flag (--heterogeneous)
    policy: str
    existing: tuple[tuple[str, str], ...]         # vGPUs created first (the simulator may refuse some)
    vms: tuple[VmRequest, ...]
    host_mixed: bool = False                      # the host's GPUs start in mixed-size mode where they can

    def describe(self) -> str:
        vms = "; ".join(f"{vm.name}: " + " + ".join(g.describe() for g in vm.gpus) for vm in self.vms)
        return (f"{self.profile}, heterogeneous={self.heterogeneous}, host_mixed={self.host_mixed}, "
                f"policy={self.policy}, "
                f"existing={list(self.existing)}, vms=[{vms}]")


@functools.cache   # one strategy object per menu: Hypothesis validates a strategy once, not at every draw
def gpu_requests(menu: Menu) -> st.SearchStrategy[VgpuRequest]:
    by_need = st.builds(VgpuRequest, min_framebuffer_mib=st.none() | st.sampled_from(menu.framebuffers),
                        series=st.none() | st.sampled_from(menu.series or ("Q",)),
                        mig_backed=st.none() | st.booleans())
    whole = st.builds(VgpuRequest, mode=st.just("passthrough"),
                      vendor=st.none() | st.sampled_from(menu.vendors or ("nvidia",)))
    # Only kinds the host could serve at all: one VM the planner must refuse makes the whole plan a refusal.
    kinds = [by_need]
    if menu.spellings:
        kinds.insert(0, st.sampled_from(menu.spellings).map(lambda s: VgpuRequest(type=s)))
    if menu.wholes:
        kinds.append(whole)
    if menu.plain_vfs:
        kinds.append(st.just(VgpuRequest(mode="vf")))
    return st.one_of(kinds)


@functools.cache
def existing_vgpus(menu: Menu) -> st.SearchStrategy[list[tuple[str, str]]]:
    return st.lists(st.sampled_from(menu.slot_types), max_size=4)


@functools.cache
def vm_gpus(menu: Menu) -> st.SearchStrategy[list[VgpuRequest]]:
    return st.lists(gpu_requests(menu), min_size=1, max_size=2)


@st.composite
def scenarios(draw: Callable, profile: str, max_kinds: int, max_gpus: int) -> Scenario:
    """Up to ``max_kinds`` kinds of VM (1-2 GPUs each), each asked for a number of times (a pool), at most
    ``max_gpus`` GPUs in all: counts are what overflows a GPU."""
    menu = menu_of(profile)
    existing = draw(existing_vgpus(menu)) if menu.slot_types else []
    vms: list[VmRequest] = []
    for _ in range(draw(st.integers(1, max_kinds))):
        gpus = tuple(draw(vm_gpus(menu)))
        room = (max_gpus - sum(len(vm.gpus) for vm in vms)) // len(gpus)
        if room < 1:
            break
        for _ in range(draw(st.integers(1, room))):
            vms.append(VmRequest(f"vm-{len(vms) + 1:03d}", gpus=gpus))
    return Scenario(profile, draw(st.booleans()), draw(st.sampled_from(("binpack", "spread"))), tuple(existing),
                    tuple(vms), host_mixed=draw(st.booleans()))


def prepared_host(sc: Scenario) -> SimHost:
    """A fresh simulated host in the scenario's state, reached through the simulated kernel itself."""
    return _prepared(sc.profile, sc.host_mixed, sc.existing)


def _prepared(profile: str, host_mixed: bool, existing: tuple[tuple[str, str], ...]) -> SimHost:
    host = SimHost(profile_of(profile))
    model = host.model
    if host_mixed:
        # The host starts in mixed-size mode wherever the board has it (EBUSY once vGPUs exist). Independently,
        # the planner's --heterogeneous flag lets it switch idle GPUs itself (its SetMixedSize steps below).
        for gpu in model.gpus.values():
            if gpu.table.heterogeneous:
                try:
                    model.set_heterogeneous(gpu, True)
                except OSError:
                    pass
    for i, (addr, type_id) in enumerate(existing):
        dev = model.devices[addr]
        assert dev.gpu is not None
        t = dev.gpu.table.get(type_id)
        assert t is not None
        try:
            if model.is_vendor_vf(dev):
                model.set_vendor_type(dev, str(t.number))
            else:
                model.create_mdev(dev, t, f"00000000-0000-4000-8000-{i:012d}")
        except OSError:
            pass                                   # not creatable in this state: the scenario just has fewer
    return host


@functools.lru_cache(maxsize=512)
def inventory_of(profile: str, host_mixed: bool, existing: tuple[tuple[str, str], ...]) -> Inventory:
    """The inventory of a prepared state, read through the simulated sysfs. Many cases start from the same state
    (no vGPUs yet, most of all), which is read once: the same host state reads as the same inventory, and planning
    leaves an inventory as it was (test_planning_leaves_the_inventory_as_it_was)."""
    return inventory(_prepared(profile, host_mixed, existing))


#: what a GVT-g budget says once its pool is estimated from the kernel's counts (services/capacity/budget.py)
GVTG_ESTIMATE = "(pool estimated from the kernel's counts)"


def unsized_in_use(sc: Scenario) -> bool:
    """Whether a GPU in mixed-size mode holds a vGPU whose size the inventory does not know."""
    inv = inventory_of(sc.profile, sc.host_mixed, sc.existing)
    return any(b.sizing == "mixed" and any(r.framebuffer_mib is None for r in b.residents) for b in gpu_budgets(inv))


def planned(sc: Scenario) -> Plan:
    return plan([inventory_of(sc.profile, sc.host_mixed, sc.existing)], list(sc.vms), policy=sc.policy,
                heterogeneous=sc.heterogeneous)


# -- soundness -----------------------------------------------------------------------------------


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


#: The uses a plan passes through as they are, and the request mode that asks for each.
PASSED_THROUGH = {GpuUse.WHOLE: "passthrough", GpuUse.VF: "vf"}


def refusals_of(model: SimModel, p: Plan, vms: tuple[VmRequest, ...]) -> list[str]:
    """Run the plan's device work on the simulator; every refusal, and every device that is not what was
    asked for, as one line each (empty: the simulator accepts the whole plan)."""
    asked = {(vm.name, i): g for vm in vms for i, g in enumerate(vm.gpus)}
    out: list[str] = []
    for a in p.assignments:
        req = asked[(a.vm, a.index)]
        dev = model.devices.get(str(a.slot))
        if a.kind.is_vgpu and dev is not None and dev.gpu is not None:
            t = dev.gpu.table.get(a.type.id)
            pf = model.devices[dev.physfn or dev.addr]
            if req.mode != "vgpu" or t is None or not satisfies(req, t, vendor_of(pf)):
                out.append(f"{a.vm} gpu {a.index}: asked {req.describe()}, planned {a.type.id} on {a.slot}")
        elif a.kind in PASSED_THROUGH and req.mode != PASSED_THROUGH[a.kind]:
            out.append(f"{a.vm} gpu {a.index}: asked {req.describe()}, planned {a.kind} {a.slot}")
    for s in p.steps:
        if isinstance(s, SetMixedSize):
            gpu = model.gpus.get(str(s.gpu))
            try:
                if gpu is None:
                    raise OSError(errno.ENODEV, "no such GPU")
                model.set_heterogeneous(gpu, True)     # what `nvidia-smi vgpu -shm 1` does in the simulator
            except OSError as exc:
                out.append(f"{s.describe()}: simulator says {_errno_name(exc)}")
            continue
        if not isinstance(s, (CreateMdev, SetVfType)):
            continue
        addr = str(s.parent if isinstance(s, CreateMdev) else s.vf)
        dev = model.devices.get(addr)
        try:
            if dev is None or dev.gpu is None:
                raise OSError(errno.ENODEV, "no such vGPU parent")
            if isinstance(s, CreateMdev):
                t = dev.gpu.table.get(str(s.type))
                if t is None:
                    raise OSError(errno.ENOENT, "no such type directory")
                model.create_mdev(dev, t, str(s.uuid))
            else:
                model.set_vendor_type(dev, str(s.type))
        except OSError as exc:
            out.append(f"{s.describe()}: simulator says {_errno_name(exc)}")
    taken: dict[str, str] = {}
    for a in p.assignments:
        if a.kind not in PASSED_THROUGH:
            continue
        req = asked[(a.vm, a.index)]
        addrs = [str(f) for f in a.functions] if a.kind is GpuUse.WHOLE and req.with_audio else [str(a.slot)]
        devs = [model.devices[x] for x in addrs if x in model.devices]
        why = "no such device" if len(devs) != len(addrs) else pass_through(model, devs, taken, a.vm)
        if why:
            out.append(f"{a.vm} gpu {a.index}: {a.kind} {', '.join(addrs)}: {why}")
    return out


@pytest.mark.parametrize("profile", _marked(PROFILES, SLOW_SOUND))
def test_planner_proposes_only_what_the_simulator_accepts(profile: str, referee_tally: Counter) -> None:
    @referee_settings(SOUND_EXAMPLES.get(profile, SOUND_DEFAULT))
    @given(scenarios(profile, max_kinds=3, max_gpus=12))
    def check(sc: Scenario) -> None:
        referee_tally["soundness cases"] += 1
        note(sc.describe())
        try:
            p = planned(sc)
        except NoCapacity:
            referee_tally["planner refusals"] += 1
            return
        note("plan:\n" + p.format())
        refused = refusals_of(prepared_host(sc).model, p, sc.vms)
        assert not refused, "the simulator refuses the plan:\n  " + "\n  ".join(refused)

    check()


# -- completeness --------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", _marked(SMALL_PROFILES, SLOW_COMPLETE))
def test_planner_places_whatever_the_simulator_can_hold(profile: str, referee_tally: Counter) -> None:
    @referee_settings(COMPLETE_EXAMPLES)
    @given(scenarios(profile, max_kinds=3, max_gpus=6))
    def check(sc: Scenario) -> None:
        referee_tally["completeness cases"] += 1
        note(sc.describe())
        host = prepared_host(sc)
        wants = [Want(vm.name, i, g) for vm in sc.vms for i, g in enumerate(vm.gpus)]
        try:
            fits = everything_fits(host.model, wants)
        except SearchBudgetExceeded:
            # the oracle cannot decide this one in its budget: not a case (Hypothesis draws another instead)
            referee_tally["request sets too big to decide"] += 1
            reject()
        if not fits:
            referee_tally["request sets that do not fit"] += 1
            return
        try:
            planned(sc)
        except NoCapacity as exc:
            # Two limits of what the host tells the planner, where it is sound, not complete (counted, and said in
            # the summary): a mixed-size GPU holding a vGPU whose type the host does not name (its VFs list only
            # what is still creatable), and a GVT-g pool once something is planned on it (the kernel counts the
            # free instances of each type, not the pool: the planner estimates it from below).
            if unsized_in_use(sc):
                referee_tally["refusals on a host that does not size a vGPU in use"] += 1
                return
            if GVTG_ESTIMATE in str(exc):
                referee_tally["refusals on an estimated GVT-g pool"] += 1
                return
            raise AssertionError(f"the simulator can hold every request, the planner refuses: {exc}") from None

    check()


@pytest.mark.parametrize("profile", ["t4x2", "a30-mig", "l40s-vgpu17", "mixed", "desktop"])
def test_planning_leaves_the_inventory_as_it_was(profile: str) -> None:
    # what lets the referee read each host state once (inventory_of): a plan, or a refusal, changes no inventory
    inv = inventory(SimHost.from_profile(profile))
    before = inv.to_dict()
    menu = menu_of(profile)
    asks = [VgpuRequest(type=t) for t in menu.spellings[:3]] + [VgpuRequest(min_framebuffer_mib=1500)]
    if menu.wholes:
        asks.append(VgpuRequest(mode="passthrough"))
    for n in (1, 4, 40):
        for ask in asks:
            for policy in ("binpack", "spread"):
                try:
                    plan([inv], [VmRequest(f"vm-{i}", gpus=(ask,)) for i in range(n)], policy=policy,
                         heterogeneous=True)
                except NoCapacity:
                    pass
                assert inv.to_dict() == before, (n, ask, policy)


def test_exhaustive_search_sees_the_textbook_cases() -> None:
    """The oracle itself: 6 x 8 GiB fit one L40S (48 GiB), 7 do not; two L40S hold 12."""
    l40s = SimHost.from_profile("l40s-vgpu17").model
    assert everything_fits(l40s, [Want(f"v{i}", 0, VgpuRequest(type="L40S-8Q")) for i in range(12)])
    assert not everything_fits(l40s, [Want(f"v{i}", 0, VgpuRequest(type="L40S-8Q")) for i in range(13)])
    # desktop: the RTX (group 1, with its audio and a root port) can go; the RX 580's group holds a NIC
    # and a USB controller bound to host drivers; the iGPU is the boot VGA.
    desk = SimHost.from_profile("desktop").model
    assert everything_fits(desk, [Want("g", 0, VgpuRequest(mode="passthrough"))])
    assert not everything_fits(desk, [Want(f"g{i}", 0, VgpuRequest(mode="passthrough")) for i in range(2)])
    assert not everything_fits(desk, [Want("g", 0, VgpuRequest(mode="passthrough", vendor="amd"))])
    assert [d.addr for d in functions_of(desk, desk.devices["0000:01:00.0"])] == ["0000:01:00.0", "0000:01:00.1"]
    # a30-mig: two 1g.6gb GPU instances, so two MIG-backed vGPUs and no third; no time-sliced type while MIG is on.
    a30 = SimHost.from_profile("a30-mig").model
    assert everything_fits(a30, [Want(f"m{i}", 0, VgpuRequest(type="A30-1-6C")) for i in range(2)])
    assert not everything_fits(a30, [Want(f"m{i}", 0, VgpuRequest(type="A30-1-6C")) for i in range(3)])
    assert not everything_fits(a30, [Want("t", 0, VgpuRequest(type="A30-6C"))])
    # l4-hetero (mixed-size on): 16 + 8 GiB share the 24 GiB L4.
    l4 = SimHost.from_profile("l4-hetero").model
    assert everything_fits(l4, [Want("a", 0, VgpuRequest(type="L4-12Q")), Want("b", 0, VgpuRequest(type="L4-8Q")),
                                Want("c", 0, VgpuRequest(type="L4-4Q"))])
    # the search leaves the model as it found it
    assert not l40s.mdevs and not any(d.vendor_type for d in l40s.devices.values())
    assert desk.devices["0000:01:00.0"].driver == "nvidia"
