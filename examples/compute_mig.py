"""Compute VMs on MIG-backed vGPUs (A100 with SR-IOV): headless, NUMA-aware.

    python examples/compute_mig.py                        # on the simulated a100-sriov host
    python examples/compute_mig.py --host ssh://root@a100 --connect qemu+ssh://root@a100/system --count 4

Each VM asks for a MIG-backed C-series vGPU with >= 10 GiB; vgpuvirt picks the smallest such type
that is creatable (a 1g.10gb instance here), on a VF of the GPU, and the compute template pins the
guest's memory to the GPU's NUMA node.
"""

from __future__ import annotations

import argparse
import sys

from vgpuvirt.hosts import open_host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="sim:a100-sriov")
    ap.add_argument("--connect", default="test:///default")
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)

    host = open_host(a.host)
    conn = LibvirtConnection(a.connect)
    vms = VmRequest.pool("mig", a.count, gpu=VgpuRequest(mig_backed=True, series="C", min_framebuffer_mib=10240),
                         template="compute", memory_mib=32768, vcpus=8)
    result = provision(host, conn, vms, policy="spread")
    for r in result.rows():
        print(f"{r['vm']}: {r['type']} ({r['type_name']}) on GPU {r['gpu']} NUMA {r['numa_node']}, mdev {r['device']}")
    if not a.keep:
        ok = teardown(host, conn, [v.name for v in vms]).ok
        print("torn down" if ok else "teardown failed")
        if not ok:
            return 1
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
