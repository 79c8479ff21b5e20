"""The referee: what a simulated host accepts, decided by the simulator alone.

Nothing here imports the planner (``vgpuvirt.provision``) or the services it uses, so that the
exhaustive search below is an independent oracle: it tries placements with the SimModel's own
create/remove calls and lets the simulated kernel say yes or no. Requests are read by their fields
(duck typing on ``VgpuRequest``), never through the planner's ``fit``.

Passthrough has no sysfs write of its own in a plan (libvirt detaches the device when the domain
starts), so the referee performs that detach on the model (``driver_override`` = vfio-pci, unbind,
``drivers_probe``) and then applies the kernel's group-viability rule (>= 5.19, DMA ownership;
shared/hostdata/iommu_examples.txt section 4): every device of the group is unbound or bound to a
driver with ``driver_managed_dma``.
"""

from __future__ import annotations

import re
import uuid as _uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from vgpuvirt.sim.model import Dev, SimModel
from vgpuvirt.sim.profiles import VgpuType

# Drivers that keep an IOMMU group viable: driver_managed_dma (vfio-pci, pcieport) or stubs.
DMA_SAFE = frozenset({"vfio-pci", "pci-stub", "pcieport"})
VENDORS = {0x10DE: "nvidia", 0x8086: "intel", 0x1002: "amd"}
# "GRID T4-2Q", "NVIDIA L40S-24Q", "GRID T4-2B4", "GRID A100D-2-20C", "GRID A30-1-6CME": the series is
# the letter after the framebuffer figure.
_SERIES_RE = re.compile(r"-(?:\d+-)?\d+([QABC])(?:ME|\d)?$")
_REFEREE_NS = _uuid.UUID("0b3f6c1e-7d2a-4e59-8f10-2c4d6e8a9b01")


def series_of(t: VgpuType) -> str | None:
    m = _SERIES_RE.search(t.name)
    return m[1] if m else None


def short_name(t: VgpuType) -> str:
    """The name without the driver's prefix: ``T4-2Q`` for ``GRID T4-2Q``."""
    first, _, rest = t.name.partition(" ")
    return rest if first in ("GRID", "NVIDIA") and rest else t.name


def _res(text: str | None) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)x(\d+)", (text or "").strip())
    return (int(m[1]), int(m[2])) if m else None


def vendor_of(dev: Dev) -> str:
    return VENDORS.get(dev.spec.vendor, "other")


def satisfies(req: Any, t: VgpuType, vendor: str) -> bool:
    """Whether vGPU type ``t`` is what ``req`` asks for (docs/provision.md "Asking for a GPU")."""
    if req.vendor and req.vendor != vendor:
        return False
    if req.type is not None:
        want = req.type.strip().lower()
        if want.isdigit():
            want = f"nvidia-{want}"
        return want in {t.sysfs_id.lower(), t.name.lower(), short_name(t).lower()}
    if req.min_framebuffer_mib and (not t.framebuffer_mib or t.framebuffer_mib < req.min_framebuffer_mib):
        return False
    if req.min_heads and (not t.num_heads or t.num_heads < req.min_heads):
        return False
    if req.series and series_of(t) != req.series:
        return False
    if req.min_resolution:
        have, need = _res(t.max_resolution), _res(req.min_resolution)
        if have is None or need is None or have[0] < need[0] or have[1] < need[1]:
            return False
    return req.mig_backed is None or (t.mig_profile is not None) == req.mig_backed


def referee_uuid(*parts: object) -> str:
    return str(_uuid.uuid5(_REFEREE_NS, "/".join(map(str, parts))))


# -- one device, the way the kernel does it ---------------------------------------------------


def create_vgpu(model: SimModel, dev: Dev, t: VgpuType, uuid: str) -> None:
    """Create one vGPU of ``t`` on ``dev`` (an mdev parent or a vGPU 17+ VF); OSError when refused."""
    if model.is_vendor_vf(dev):
        assert t.number is not None
        model.set_vendor_type(dev, str(t.number))
    else:
        model.create_mdev(dev, t, uuid)


def remove_vgpu(model: SimModel, dev: Dev, uuid: str) -> None:
    if model.is_vendor_vf(dev):
        model.set_vendor_type(dev, "0")
    else:
        model.remove_mdev(uuid, "1")


def functions_of(model: SimModel, dev: Dev) -> list[Dev]:
    """The physical functions in the GPU's slot (GPU + HDMI audio ...), what passthrough takes along."""
    a = dev.spec.address
    return [d for d in model.devices.values() if d.physfn is None and d.spec.address.domain == a.domain
            and d.spec.address.bus == a.bus and d.spec.address.slot == a.slot]


def detach_losses(model: SimModel, dev: Dev) -> list[str]:
    """What unbinding ``dev``'s driver would destroy (the simulated driver's remove(): its mdevs, its VFs)."""
    lost = [f"vGPU {m.uuid} ({m.type.sysfs_id})" for m in model.mdevs_of(dev.addr)]
    if dev.numvfs:
        lost.append(f"{dev.numvfs} SR-IOV VFs")
    return lost


def group_problems(model: SimModel, devs: list[Dev], others_taken: set[str]) -> list[str]:
    """Why the IOMMU groups of ``devs`` are not viable for one VM (empty: viable)."""
    if not model.iommu:
        return ["the IOMMU is off"]
    mine = {d.addr for d in devs}
    out: list[str] = []
    for d in devs:
        if d.group is None:
            out.append(f"{d.addr} has no IOMMU group")
            continue
        for m in model.devices.values():
            if m.group != d.group or m.addr in mine:
                continue
            if m.addr in others_taken:
                out.append(f"group {d.group} member {m.addr} belongs to another VM")
            elif m.driver is not None and m.driver not in DMA_SAFE:
                out.append(f"group {d.group} member {m.addr} is bound to {m.driver}")
    return sorted(set(out))


def detach_to_vfio(model: SimModel, devs: list[Dev]) -> Callable[[], None]:
    """Bind ``devs`` to vfio-pci through sysfs (what libvirt's managed detach does); returns the undo."""
    before = [(d, d.driver, d.override) for d in devs]
    for d in devs:
        model.set_override(d, "vfio-pci")
        if d.driver is not None and d.driver != "vfio-pci":
            model.unbind(d.driver, d.addr)
        model.probe(d.addr)

    def undo() -> None:
        for d, drv, override in before:
            if d.driver is not None and d.driver != drv:
                model.unbind(d.driver, d.addr)
            model.set_override(d, override or "")
            if drv is not None and d.driver is None:
                model.bind(drv, d.addr)
    return undo


def pass_through(model: SimModel, devs: list[Dev], taken: dict[str, str], vm: str) -> str | None:
    """Give ``devs`` to ``vm`` as the kernel would; None on success, else why it is refused.

    ``taken`` maps every PCI address already handed to a VM to that VM, and is updated."""
    twice = [d.addr for d in devs if d.addr in taken]
    if twice:
        return f"{', '.join(twice)} already given to {taken[twice[0]]}"
    lost = [x for d in devs for x in detach_losses(model, d)]
    if lost:
        return "detaching it destroys " + ", ".join(lost)
    detach_to_vfio(model, devs)
    problems = group_problems(model, devs, {a for a, v in taken.items() if v != vm})
    if problems:
        return "IOMMU group not viable: " + "; ".join(problems)
    taken.update({d.addr: vm for d in devs})
    return None


# -- exhaustive search ------------------------------------------------------------------------


@dataclass(frozen=True)
class Want:
    """One GPU request of one VM, flattened for the search."""

    vm: str
    index: int
    req: Any


@dataclass(frozen=True)
class Move:
    do: Callable[[], bool]        # True when the simulator accepted it
    undo: Callable[[], None]


def _first_free_per_pf(model: SimModel, devs: list[Dev]) -> list[Dev]:
    """Free VFs of one PF are interchangeable (each its own group, capacity is the GPU's): keep one per PF."""
    out: list[Dev] = []
    seen: set[str] = set()
    for d in devs:
        if d.physfn is None:
            out.append(d)
        elif d.physfn not in seen and not model.mdevs_of(d.addr) and not d.vendor_type:
            seen.add(d.physfn)
            out.append(d)
    return out


def _vgpu_moves(model: SimModel, w: Want, salt: int) -> Iterator[Move]:
    slots = [d for d in model.devices.values() if model.mdev_table(d) is not None or model.is_vendor_vf(d)]
    for dev in _first_free_per_pf(model, slots):
        assert dev.gpu is not None
        vendor = vendor_of(model.devices[dev.physfn or dev.addr])
        for t in sorted(dev.gpu.table.types, key=lambda t: (t.framebuffer_mib, t.sysfs_id)):
            if not satisfies(w.req, t, vendor):
                continue
            uuid = referee_uuid("search", w.vm, w.index, salt)

            def do(dev: Dev = dev, t: VgpuType = t, uuid: str = uuid) -> bool:
                try:
                    create_vgpu(model, dev, t, uuid)
                except OSError:
                    return False
                return True

            yield Move(do, lambda dev=dev, uuid=uuid: remove_vgpu(model, dev, uuid))


def _passthrough_moves(model: SimModel, w: Want, taken: dict[str, str]) -> Iterator[Move]:
    if w.req.mode == "passthrough":
        # A whole GPU: a display-class PF; never the host's boot VGA (its console).
        cands = [d for d in model.devices.values() if d.physfn is None and d.spec.pci_class >> 16 == 0x03
                 and not d.spec.boot_vga]
    else:
        # A plain VF: a VF of a display-class PF that has no vGPU backend (MxGPU style).
        cands = _first_free_per_pf(model, [
            d for d in model.devices.values() if d.physfn is not None and d.addr not in taken
            and model.devices[d.physfn].spec.pci_class >> 16 == 0x03 and model.devices[d.physfn].gpu is None])
    for dev in cands:
        if w.req.vendor and vendor_of(model.devices[dev.physfn or dev.addr]) != w.req.vendor:
            continue
        devs = functions_of(model, dev) if w.req.mode == "passthrough" and w.req.with_audio else [dev]
        state: dict[str, Any] = {}

        def do(devs: list[Dev] = devs, state: dict[str, Any] = state) -> bool:
            if any(d.addr in taken for d in devs) or any(detach_losses(model, d) for d in devs):
                return False
            state["undo"] = detach_to_vfio(model, devs)
            if group_problems(model, devs, {a for a, v in taken.items() if v != w.vm}):
                state.pop("undo")()
                return False
            taken.update({d.addr: w.vm for d in devs})
            return True

        def undo(devs: list[Dev] = devs, state: dict[str, Any] = state) -> None:
            for d in devs:
                taken.pop(d.addr, None)
            state.pop("undo")()

        yield Move(do, undo)


def _state_key(model: SimModel, taken: dict[str, str], i: int) -> tuple[Any, ...]:
    """The model's state as far as the remaining requests can tell: which VF of a PF holds a vGPU does not
    matter (VFs are interchangeable), so vGPUs are keyed by their physical GPU."""
    def gpu_of(addr: str) -> str:
        return model.devices[addr].physfn or addr

    vgpus = [(gpu_of(m.parent), m.type.sysfs_id) for m in model.mdevs.values()]
    vgpus += [(gpu_of(d.addr), str(d.vendor_type)) for d in model.devices.values() if d.vendor_type]
    return (i, tuple(sorted(vgpus)), tuple(sorted(taken.items())))


class SearchBudgetExceeded(RuntimeError):
    """The search tried more placements than allowed: the scenario is too big to decide here."""


def everything_fits(model: SimModel, wants: list[Want], *, budget: int = 50_000) -> bool:
    """Whether some placement of every request is accepted by the simulator (backtracking, memoized on
    the model's state). Leaves the model as it found it."""
    taken: dict[str, str] = {}
    failed: set[tuple[Any, ...]] = set()
    tries = 0

    def search(i: int) -> bool:
        nonlocal tries
        if i == len(wants):
            return True
        key = _state_key(model, taken, i)
        if key in failed:
            return False
        w = wants[i]
        moves = _vgpu_moves(model, w, i) if w.req.mode == "vgpu" else _passthrough_moves(model, w, taken)
        for mv in moves:
            tries += 1
            if tries > budget:
                raise SearchBudgetExceeded(f"more than {budget} placements tried")
            if not mv.do():
                continue
            try:
                if search(i + 1):
                    return True
            finally:
                mv.undo()
        failed.add(key)
        return False

    return search(0)
