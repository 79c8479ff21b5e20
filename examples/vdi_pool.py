"""A VDI pool: N desktops, each with a >= 2 GiB Q-series vGPU, packed across several hosts.

    python examples/vdi_pool.py                                  # 40 desktops on 3 simulated 2xT4 hosts
    python examples/vdi_pool.py --host ssh://root@gpu1 --host ssh://root@gpu2 --connect qemu+ssh://root@gpu1/system \\
        --connect qemu+ssh://root@gpu2/system --count 40 --keep

vgpuvirt picks the smallest type that fits the need on each GPU (GRID T4-2Q here), fills one GPU
before the next (binpack), creates every vGPU of a host in one round trip, defines and starts the
desktops, and (unless --keep) tears everything down again.
"""

from __future__ import annotations

import argparse
import sys

from vgpuvirt.hosts import open_host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", action="append", help="default: sim:t4x2 three times")
    ap.add_argument("--connect", action="append", help="libvirt URI, one for all or one per --host")
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--policy", default="binpack", choices=["binpack", "spread"])
    ap.add_argument("--keep", action="store_true", help="leave the desktops running")
    a = ap.parse_args(argv)

    specs = a.host or ["sim:t4x2"] * 3
    hosts = []
    for i, spec in enumerate(specs):
        h = open_host(spec)
        if spec.startswith("sim:"):   # three simulated hosts need three names
            from vgpuvirt.sim import SimHost
            h = SimHost.from_profile(spec[4:], name=f"{spec}#{i + 1}")
        hosts.append(h)
    uris = a.connect or ["test:///default"]
    conns = {h.name: LibvirtConnection(uris[i] if len(uris) == len(hosts) else uris[0]) for i, h in enumerate(hosts)}

    desktops = VmRequest.pool("desk", a.count, gpu=VgpuRequest(min_framebuffer_mib=2048, series="Q"),
                              template="vdi", memory_mib=4096, vcpus=2)
    result = provision(hosts, conns, desktops, policy=a.policy)
    per_gpu: dict[tuple[str, str], int] = {}
    for row in result.rows():
        per_gpu[(row["host"], row["gpu"])] = per_gpu.get((row["host"], row["gpu"]), 0) + 1
    for (host, gpu), n in sorted(per_gpu.items()):
        print(f"{host} {gpu}: {n} desktops")
    types = sorted({f"{r['type']} ({r['type_name']})" for r in result.rows()})
    assert result.applied is not None
    print(f"{len(desktops)} desktops with {', '.join(types)}; device round trips per host: "
          f"{result.applied.round_trips}")
    if not a.keep:
        td = teardown(hosts, conns, [d.name for d in desktops])
        print(f"torn down: {sum('undefined' in x for x in td.removed)} domains, "
              f"{sum('removed vGPU' in x for x in td.removed)} vGPUs")
        if not td.ok:
            for line in td.failed:
                print(f"teardown failed: {line}", file=sys.stderr)
            return 1
    for c in conns.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
