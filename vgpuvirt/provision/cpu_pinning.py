"""Where a VM's vCPUs run: on the host CPUs nearest its GPU, by default for the templates that want it.

A gaming VM moves every frame between its vCPUs and the GPU; on a two-socket host, vCPUs on the other
socket pay the interconnect on every transfer. So unless the caller names CPUs (``host_cpus``) or opts
out (``pin_cpus=False``, CLI ``--no-pin``), such a VM's vCPUs are pinned to its GPU's ``local_cpulist``.

The unit a VM takes is a whole core: two SMT threads share one core's caches and execution units, so a
sibling left to another VM (or to the host) steals frame time from the one pinned next to it. A VM takes
free cores only (a core with any CPU held is not free), its vCPUs on the cores' threads in order (the guest
is then told the same threads per core), and the first local core (the lowest CPU: where the host's own
interrupts and housekeeping run) last. The emulator threads (QEMU's main loop, I/O) are pinned to that
housekeeping core, away from the vCPUs, and shared by the VMs near one GPU node.

Two such VMs must not share cores (each would halve the other's frame rate), so :class:`PinLedger` counts the
CPUs the host's defined domains pin their vCPUs to and those given to the VMs planned before.
"""

from __future__ import annotations

from collections.abc import Mapping

from lxml import etree

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.model import format_cpulist, parse_cpulist
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.xml.domain import Domain
from vgpuvirt.xml.parts import CpuPinning

#: Templates whose VMs are pinned to their GPU's local CPUs unless asked otherwise (``pin_cpus=False``).
PIN_BY_DEFAULT = frozenset({"gaming"})


def cores_of(cpus: list[int], siblings: Mapping[int, frozenset[int]]) -> list[tuple[int, ...]]:
    """``cpus`` grouped by core (each core's threads in order), cores in the order of their lowest CPU; a CPU
    whose siblings are not known is a core of its own."""
    seen: set[int] = set()
    out: list[tuple[int, ...]] = []
    for c in sorted(cpus):
        if c in seen:
            continue
        core = tuple(sorted((siblings.get(c) or frozenset({c})) & set(cpus) | {c}))
        seen.update(core)
        out.append(core)
    return out


def gpu_cpu_pinning(vm: VmRequest, local_cpus: str | None, taken: frozenset[int] = frozenset(),
                    siblings: Mapping[int, frozenset[int]] | None = None) -> tuple[CpuPinning | None, str]:
    """The pinning of ``vm``'s vCPUs and emulator, and why (for the explanation). Given ``host_cpus`` win;
    otherwise a gaming VM (or one with ``pin_cpus=True``) takes whole free cores among its GPU's local CPUs
    (module docstring); CPUs in ``taken`` (other VMs' vCPUs) make their core unavailable."""
    if vm.host_cpus:
        cpus = sorted(parse_cpulist(vm.host_cpus))
        # fewer CPUs than vCPUs is refused by the domain builder ("exactly one host CPU per vCPU")
        return CpuPinning(tuple(cpus[: vm.vcpus])), f"vCPUs pinned to the CPUs asked for ({vm.host_cpus})"
    if vm.pin_cpus is False or (vm.pin_cpus is None and vm.template not in PIN_BY_DEFAULT):
        return None, ""
    local = sorted(parse_cpulist(local_cpus)) if local_cpus else []
    cores = cores_of(local, siblings or {})
    housekeeping = cores[0] if cores else ()
    order = [*cores[1:], *cores[:1]]              # the host's core last
    free = [core for core in order if not set(core) & taken]
    chosen: list[tuple[int, ...]] = []
    for core in free:
        if sum(map(len, chosen)) >= vm.vcpus:
            break
        chosen.append(core)
    vcpus = [c for core in chosen for c in core][: vm.vcpus]
    if len(vcpus) < vm.vcpus:
        held = len([c for c in local if c in taken])
        more = f", {held} of them pinned by other VMs" if held else ""
        return None, (f"vCPUs not pinned: the GPU's local CPUs ({local_cpus or 'unknown'}{more}) have fewer free "
                      f"whole cores than the VM's {vm.vcpus} vCPUs need")
    pinning = CpuPinning(tuple(vcpus), frozenset(housekeeping))
    smt = max(map(len, chosen))
    cores_text = f"{len(chosen)} whole core(s)" + (f" with their SMT siblings ({smt} threads each)" if smt > 1 else "")
    return pinning, (f"vCPUs pinned to {cores_text} of the GPU's local CPUs: {format_cpulist(frozenset(vcpus))} "
                     f"(of {local_cpus}); emulator threads on the host's core {format_cpulist(frozenset(housekeeping))}"
                     " (opt out: pin_cpus=False, --no-pin)")


def threads_per_core(pinning: CpuPinning, siblings: Mapping[int, frozenset[int]]) -> int:
    """How many threads of one core each consecutive group of vCPUs holds (the guest topology to declare), or 1
    when the vCPUs do not fill whole cores evenly."""
    cpus = list(pinning.vcpu_cpus)
    cores = cores_of(cpus, siblings)
    sizes = {len(c) for c in cores}
    if len(sizes) != 1 or [c for core in cores for c in core] != cpus:
        return 1
    return sizes.pop()


def _pinned_cpus(xml: str) -> frozenset[int]:
    try:
        pinning = Domain.from_xml(xml).cpu_pinning()
    except (VgpuvirtError, etree.XMLSyntaxError, ValueError):
        return frozenset()          # a domain we cannot read pins nothing we could honour anyway
    # the emulator's CPUs are the shared housekeeping core: they take no core from a VM's vCPUs
    return frozenset(pinning.vcpu_cpus) if pinning is not None else frozenset()


class PinLedger:
    """Host CPUs already pinned, per host: by its defined domains (name -> XML) and by the VMs planned so far.
    A VM's own domain (a rerun) does not count against it, so a rerun picks the same CPUs again."""

    def __init__(self, domains: Mapping[str, Mapping[str, str]],
                 siblings: Mapping[str, Mapping[int, frozenset[int]]] | None = None) -> None:
        self._pins: dict[str, dict[str, frozenset[int]]] = {
            host: {name: _pinned_cpus(xml) for name, xml in doms.items()} for host, doms in domains.items()}
        self._siblings = siblings or {}

    def choose(self, host: str, vm: VmRequest, local_cpus: str | None) -> tuple[CpuPinning | None, str]:
        pins = self._pins.setdefault(host, {})
        sib = self._siblings.get(host, {})
        taken = frozenset().union(*(cpus for name, cpus in pins.items() if name != vm.name))
        pin, why = gpu_cpu_pinning(vm, local_cpus, taken, sib)
        # the whole cores are the VM's, an odd vCPU count's idle sibling included
        pins[vm.name] = frozenset(c for v in pin.vcpu_cpus for c in sib.get(v, frozenset({v}))) \
            if pin is not None else frozenset()
        return pin, why

    def siblings(self, host: str) -> Mapping[int, frozenset[int]]:
        return self._siblings.get(host, {})
