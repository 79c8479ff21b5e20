"""Where a VM's vCPUs run: on the host CPUs nearest its GPU, by default for the templates that want it.

A gaming VM moves every frame between its vCPUs and the GPU; on a two-socket host, vCPUs on the other
socket pay the interconnect on every transfer. So unless the caller names CPUs (``host_cpus``) or opts
out (``pin_cpus=False``, CLI ``--no-pin``), such a VM's vCPUs are pinned to its GPU's ``local_cpulist``.

Two such VMs must not share CPUs (each would halve the other's frame rate), so :class:`PinLedger` counts the
CPUs the host's defined domains are pinned to and those given to the VMs planned before, and a VM takes the
first local CPUs nobody else holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from lxml import etree

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.model import parse_cpulist
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.xml.domain import Domain

#: Templates whose VMs are pinned to their GPU's local CPUs unless asked otherwise (``pin_cpus=False``).
PIN_BY_DEFAULT = frozenset({"gaming"})


def gpu_cpu_pinning(vm: VmRequest, local_cpus: str | None,
                    taken: frozenset[int] = frozenset()) -> tuple[str | None, str]:
    """The host CPUs to pin ``vm``'s vCPUs to, and why (for the explanation). Given ``host_cpus`` win;
    otherwise a gaming VM (or one with ``pin_cpus=True``) takes the first of its GPU's local CPUs, one
    per vCPU, so its frames and interrupts stay on the GPU's NUMA node; CPUs in ``taken`` (other VMs' pins)
    are skipped."""
    if vm.host_cpus:
        return vm.host_cpus, f"vCPUs pinned to the CPUs asked for ({vm.host_cpus})"
    if vm.pin_cpus is False or (vm.pin_cpus is None and vm.template not in PIN_BY_DEFAULT):
        return None, ""
    local = sorted(parse_cpulist(local_cpus)) if local_cpus else []
    cpus = [c for c in local if c not in taken]
    if len(cpus) < vm.vcpus:
        held = f", {len(local) - len(cpus)} of them pinned by other VMs" if len(cpus) < len(local) else ""
        return None, (f"vCPUs not pinned: the GPU's local CPUs ({local_cpus or 'unknown'}{held}) are fewer "
                      f"than the VM's {vm.vcpus} vCPUs")
    chosen = ",".join(map(str, cpus[: vm.vcpus]))
    return chosen, f"vCPUs pinned to the GPU's local CPUs {chosen} (of {local_cpus}; opt out: pin_cpus=False, --no-pin)"


def _pinned_cpus(xml: str) -> frozenset[int]:
    try:
        pinning = Domain.from_xml(xml).cpu_pinning()
    except (VgpuvirtError, etree.XMLSyntaxError, ValueError):
        return frozenset()          # a domain we cannot read pins nothing we could honour anyway
    return pinning.all_cpus if pinning is not None else frozenset()


class PinLedger:
    """Host CPUs already pinned, per host: by its defined domains (name -> XML) and by the VMs planned so far.
    A VM's own domain (a rerun) does not count against it, so a rerun picks the same CPUs again."""

    def __init__(self, domains: Mapping[str, Mapping[str, str]]) -> None:
        self._pins: dict[str, dict[str, frozenset[int]]] = {
            host: {name: _pinned_cpus(xml) for name, xml in doms.items()} for host, doms in domains.items()}

    def choose(self, host: str, vm: VmRequest, local_cpus: str | None) -> tuple[str | None, str]:
        pins = self._pins.setdefault(host, {})
        taken = frozenset().union(*(cpus for name, cpus in pins.items() if name != vm.name))
        pin, why = gpu_cpu_pinning(vm, local_cpus, taken)
        pins[vm.name] = parse_cpulist(pin) if pin else frozenset()
        return pin, why
