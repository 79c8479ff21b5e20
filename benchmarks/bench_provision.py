"""Provision 64 vGPU VMs on the `large` profile over real sshd (FUSE simulator) with 25 ms added RTT.

    .venv/bin/python benchmarks/bench_provision.py [--vms 64] [--rtt-ms 25] [--baseline-vms 4]
                                                   [--connect test:///default]

Needs the testbed (scripts/testbed.sh start; started here if needed). Prints, in one run:
* batched: ``provision()`` of --vms VMs (inventory, placement, every vGPU in one locked batch, XML,
  define + start on libvirt): wall time and SSH round trips (target: constant per host, < 3 s);
* per-VM baseline: the same VMs provisioned one call per VM (inventory + one batch each), on
  --baseline-vms of them, extrapolated linearly to --vms; and the ratio.
Everything is torn down afterwards (not timed).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_inventory import ssh_host, testbed_env  # noqa: E402

from vgpuvirt.libvirt_conn import LibvirtConnection  # noqa: E402
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown  # noqa: E402
from vgpuvirt.sim import fuse  # noqa: E402
from vgpuvirt.testing.delayproxy import DelayProxy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vms", type=int, default=64)
    ap.add_argument("--baseline-vms", type=int, default=4)
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--connect", default="test:///default")
    ap.add_argument("--gpu", default="fb>=2G,series=Q")
    a = ap.parse_args()

    env = testbed_env()
    gpu = VgpuRequest.parse(a.gpu)
    proxy = DelayProxy(("127.0.0.1", int(str(env["ssh_port"]))), rtt_ms=a.rtt_ms).start()
    port = proxy.address[1]
    mnt = tempfile.mkdtemp(prefix="bench-prov-", dir=str(env["mnt_dir"]))
    conn = LibvirtConnection(a.connect)
    try:
        fuse.start("large", mnt, pid_file=mnt + ".pid")
        host = ssh_host(env, port, mnt)
        t = time.monotonic()
        host.read(["/sys/module/nvidia/version"])   # connect + one exec: the RTT as measured
        rtt_probe = time.monotonic() - t
        t = time.monotonic()
        host.read(["/sys/module/nvidia/version"])
        one_exec = time.monotonic() - t

        vms = VmRequest.pool("bench", a.vms, gpu=gpu, memory_mib=256, vcpus=1)
        rt0 = host.round_trips
        t0 = time.monotonic()
        res = provision(host, conn, vms)
        batched = time.monotonic() - t0
        batched_rt = host.round_trips - rt0
        assert res.applied is not None and len(res.plan.assignments) == a.vms
        gpus_used = len({a_.gpu for a_ in res.plan.assignments})
        td = teardown(host, conn, [v.name for v in vms])
        assert td.ok, td.failed

        base = VmRequest.pool("base", a.baseline_vms, gpu=gpu, memory_mib=256, vcpus=1)
        rt0 = host.round_trips
        t0 = time.monotonic()
        for vm in base:
            provision(host, conn, [vm])
        per_vm_total = time.monotonic() - t0
        per_vm_rt = host.round_trips - rt0
        td = teardown(host, conn, [v.name for v in base])
        assert td.ok, td.failed
        host.close()
    finally:
        conn.close()
        proxy.stop()
        fuse.stop(mnt, pid_file=mnt + ".pid")
        os.rmdir(mnt)

    per_vm = per_vm_total / a.baseline_vms
    extrapolated = per_vm * a.vms
    print(f"profile large over real sshd + FUSE sim, added RTT {a.rtt_ms:.0f} ms (one exec measured "
          f"{one_exec * 1000:.0f} ms; first connect+exec {rtt_probe * 1000:.0f} ms); libvirt {a.connect}")
    print(f"batched : {a.vms} VMs ({gpu.describe()}) on {gpus_used} GPUs in {batched:.2f} s wall, "
          f"{batched_rt} SSH round trips "
          f"(inventory {res.inventory_seconds:.2f} s, plan {res.plan_seconds:.2f} s, "
          f"apply {res.applied.seconds:.2f} s)")
    print(f"per-VM  : {a.baseline_vms} VMs one call each: {per_vm_total:.2f} s, {per_vm_rt} round trips "
          f"({per_vm_rt / a.baseline_vms:.1f} per VM, {per_vm:.3f} s per VM) -> {a.vms} VMs ~ {extrapolated:.1f} s")
    print(f"ratio   : {extrapolated / batched:.1f}x faster batched; round trips {batched_rt} vs "
          f"~{per_vm_rt / a.baseline_vms * a.vms:.0f}")
    print(f"layer   : plan + apply (placement, one device batch, {a.vms} defines + starts) = "
          f"{res.plan_seconds + res.applied.seconds:.2f} s; the rest is the inventory read of the FUSE-served tree")
    print(f"target  : constant round trips per host ({'met' if batched_rt <= 2 else 'NOT met'}: {batched_rt}), "
          f"under 3 s ({'met' if batched < 3 else 'NOT met'}: {batched:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
