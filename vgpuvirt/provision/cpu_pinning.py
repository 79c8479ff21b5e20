"""Where a VM's vCPUs run: on the host CPUs nearest its GPU, by default for the templates that want it.

A gaming VM moves every frame between its vCPUs and the GPU; on a two-socket host, vCPUs on the other
socket pay the interconnect on every transfer. So unless the caller names CPUs (``host_cpus``) or opts
out (``pin_cpus=False``, CLI ``--no-pin``), such a VM's vCPUs are pinned to its GPU's ``local_cpulist``.
"""

from __future__ import annotations

from vgpuvirt.model import parse_cpulist
from vgpuvirt.provision.request import VmRequest

#: Templates whose VMs are pinned to their GPU's local CPUs unless asked otherwise (``pin_cpus=False``).
PIN_BY_DEFAULT = frozenset({"gaming"})


def gpu_cpu_pinning(vm: VmRequest, local_cpus: str | None) -> tuple[str | None, str]:
    """The host CPUs to pin ``vm``'s vCPUs to, and why (for the explanation). Given ``host_cpus`` win;
    otherwise a gaming VM (or one with ``pin_cpus=True``) takes the first of its GPU's local CPUs, one
    per vCPU, so its frames and interrupts stay on the GPU's NUMA node."""
    if vm.host_cpus:
        return vm.host_cpus, f"vCPUs pinned to the CPUs asked for ({vm.host_cpus})"
    if vm.pin_cpus is False or (vm.pin_cpus is None and vm.template not in PIN_BY_DEFAULT):
        return None, ""
    cpus = sorted(parse_cpulist(local_cpus)) if local_cpus else []
    if len(cpus) < vm.vcpus:
        return None, (f"vCPUs not pinned: the GPU's local CPUs ({local_cpus or 'unknown'}) are fewer than "
                      f"the VM's {vm.vcpus} vCPUs")
    chosen = ",".join(map(str, cpus[: vm.vcpus]))
    return chosen, f"vCPUs pinned to the GPU's local CPUs {chosen} (of {local_cpus}; opt out: pin_cpus=False, --no-pin)"
