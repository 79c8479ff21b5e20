"""A cloud-gaming VM: a whole GPU (with its HDMI audio function) passed through, pinned CPUs,
hugepages, no emulated display, and optionally an SR-IOV NIC VF.

    python examples/cloud_gaming.py                         # on the simulated desktop host
    python examples/cloud_gaming.py --nic-vf                # enables the NIC's VFs there (none are on)
    python examples/cloud_gaming.py --host ssh://root@rig --connect qemu+ssh://root@rig/system --cpus 4-11 --nic-vf

The GPU is chosen by placement: a GPU that is the host's boot VGA, has SR-IOV on, or carries vGPUs is
skipped (PF/VF exclusivity), and --explain shows why. The vCPUs are pinned to the GPU's local CPUs
unless --cpus says otherwise (or --no-pin). With --nic-vf the VF nearest the GPU is taken (same NUMA
node, then same PCIe switch); when no VF is free, a NIC whose SR-IOV is off gets its VFs enabled first
(and disabled again if the run fails).
"""

from __future__ import annotations

import argparse
import sys

from vgpuvirt.hosts import open_host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import NicRequest, VgpuRequest, VmRequest, provision, teardown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="sim:desktop")
    ap.add_argument("--connect", default="test:///default")
    ap.add_argument("--name", default="gaming-01")
    ap.add_argument("--cpus", default=None, help="host CPUs to pin the vCPUs to, e.g. 4-11")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the vCPUs to the GPU's local CPUs")
    ap.add_argument("--vcpus", type=int, default=8)
    ap.add_argument("--nic-vf", action="store_true", help="also pass an SR-IOV NIC VF (the host needs one)")
    ap.add_argument("--explain", action="store_true")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)

    host = open_host(a.host)
    conn = LibvirtConnection(a.connect)
    vm = VmRequest(a.name, gpus=(VgpuRequest(mode="passthrough"),), template="gaming", memory_mib=16384,
                   vcpus=a.vcpus, host_cpus=a.cpus, pin_cpus=False if a.no_pin else None,
                   nic=NicRequest(mac="52:54:00:6a:00:01") if a.nic_vf else None,
                   options={"kvm_hidden": True, "hyperv_vendor_id": "vgpuvirt", "disable_arch_capabilities": True})
    result = provision(host, conn, [vm])
    for c in result.plan.explain:
        if a.explain or c.reason.startswith(("NIC VF", "vCPUs")):
            print(f"  {c.verdict:8} {c.gpu}: {c.reason}")
    a0 = result.plan.assignments[0]
    print(f"{vm.name} on {a0.host}: GPU {a0.gpu} passed through with functions "
          f"{', '.join(str(f) for f in a0.functions)}")
    from vgpuvirt.xml import Domain
    devs = Domain.from_xml(conn.xml(vm.name)).gpu_devices()
    print(f"domain devices: PCI {[str(p) for p in devs.pci_addresses]}, NIC VFs {[str(n) for n in devs.interfaces]}")
    if not a.keep:
        ok = teardown(host, conn, [vm.name]).ok
        print("torn down" if ok else "teardown failed")
        if not ok:
            return 1
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
