"""Layout apply on the `large` profile over real sshd (FUSE simulator) with 25 ms added RTT: round trips
per phase for 1, 2, 4 and 8 GPUs (constant), against a per-GPU baseline measured in the same run.

    .venv/bin/python benchmarks/bench_layout.py [--rtt-ms 25] [--gpus 1,2,4,8] [--scheduler]

Needs the testbed (scripts/testbed.sh start; started here if needed). For each GPU count N, on a fresh
FUSE mount of `large` (8 x A10, 32 VFs each): ``layout apply`` of a reshape of the first N GPUs (16 VFs
each, 6 x A10-4Q on them: every phase runs: read, prepare (SR-IOV), re-read, devices (mdevs)), then the
same apply again (a rerun: one read). Baseline: the same reshape applied one GPU at a time (one
``apply_host`` per GPU, as a per-device tool would), on a second fresh mount. Prints the round trips per
phase, the wall times and the ratio.

``--scheduler``: each entry also sets a vGPU scheduler policy (over SSH the agent has no NVML for the
FUSE root: the registry-key path), then a second table: the round trips per phase of the same reshape
with and without the policy on both of its paths (NVML; registry key), on the in-process simulator (the
same batch protocol). The policy's read rides in the read round trip and its write in the devices batch:
the round trips are the same as without it, whatever the number of GPUs.
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

from vgpuvirt.layout import parse_layout, verbs  # noqa: E402
from vgpuvirt.layout.model import LayoutConfig  # noqa: E402
from vgpuvirt.sim import fuse  # noqa: E402
from vgpuvirt.testing.delayproxy import DelayProxy  # noqa: E402

POLICY = "      scheduler: {policy: fixed-share, timeslice-ms: 2}\n"
EXTRA = {"": ""}


def config(indexes: list[int]) -> LayoutConfig:
    devs = ", ".join(str(i) for i in indexes)
    return parse_layout(f"version: v1\nconfigs:\n  reshape:\n    - devices: [{devs}]\n      mode: vgpu\n"
                        "      sriov-vfs: 16\n      vgpu-devices: {A10-4Q: 6}\n" + EXTRA[""]).config()


def on_fresh_mount(env: dict[str, object], rtt_ms: float, work: object) -> object:
    proxy = DelayProxy(("127.0.0.1", int(str(env["ssh_port"]))), rtt_ms=rtt_ms).start()
    mnt = tempfile.mkdtemp(prefix="bench-layout-", dir=str(env["mnt_dir"]))
    try:
        fuse.start("large", mnt, pid_file=mnt + ".pid")
        host = ssh_host(env, proxy.address[1], mnt)
        try:
            host.read(["/sys/module/nvidia/version"])           # connect (not timed)
            return work(host)  # type: ignore[operator]
        finally:
            host.close()
    finally:
        proxy.stop()
        fuse.stop(mnt, pid_file=mnt + ".pid")
        os.rmdir(mnt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--scheduler", action="store_true", help="a scheduler policy per GPU, and its table")
    a = ap.parse_args()
    EXTRA[""] = POLICY if a.scheduler else ""
    env = testbed_env()
    counts = [int(x) for x in a.gpus.split(",")]
    print(f"layout apply on profile large over real sshd + FUSE sim, added RTT {a.rtt_ms:.0f} ms"
          + (", a scheduler policy per GPU (registry key)" if a.scheduler else ""))
    print(f"{'GPUs':>4} | {'batched: round trips per phase':<52} | {'wall':>6} | {'rerun':>9} | "
          f"{'per-GPU baseline':>24} | ratio")
    for n in counts:
        cfg = config(list(range(n)))

        def batched(host: object, cfg: LayoutConfig = cfg, n: int = n) -> tuple[dict[str, int], float, int, float]:
            t0 = time.monotonic()
            r = verbs.apply_host(host, cfg)  # type: ignore[arg-type]
            wall = time.monotonic() - t0
            devices = [s for s in r.done if not s.item.action.startswith("scheduler.")]
            assert len(devices) == n * (1 + 6), [s.text for s in r.done][:5]
            assert len(r.done) - len(devices) == (1 if EXTRA[""] else 0), "one registry-key step"
            t0 = time.monotonic()
            again = verbs.apply_host(host, cfg)  # type: ignore[arg-type]
            assert not again.changed
            return r.round_trips, wall, sum(again.round_trips.values()), time.monotonic() - t0

        def per_gpu(host: object, n: int = n) -> tuple[int, float]:
            rt0 = host.round_trips  # type: ignore[attr-defined]
            t0 = time.monotonic()
            for i in range(n):
                verbs.apply_host(host, config([i]))  # type: ignore[arg-type]
            return host.round_trips - rt0, time.monotonic() - t0  # type: ignore[attr-defined]

        rts, wall, rerun_rt, rerun_wall = on_fresh_mount(env, a.rtt_ms, batched)  # type: ignore[misc]
        base_rt, base_wall = on_fresh_mount(env, a.rtt_ms, per_gpu)  # type: ignore[misc]
        phases = ", ".join(f"{k} {v}" for k, v in rts.items())
        total = sum(rts.values())
        print(f"{n:>4} | {phases + f' = {total}':<52} | {wall:5.2f}s | {rerun_rt} rt {rerun_wall:4.2f}s | "
              f"{base_rt:>3} rt {base_wall:6.2f}s ({base_rt / n:.0f}/GPU) | {base_wall / wall:4.1f}x")
    print("target: the batched round trips per phase do not grow with the number of GPUs; "
          "the per-GPU baseline's grow linearly")
    return scheduler_table(counts) if a.scheduler else 0


def scheduler_table(counts: list[int]) -> int:
    from vgpuvirt.sim.host import SimHost

    policy = POLICY
    print("\nlayout apply on profile large (in-process simulator): round trips per phase, without / with a "
          "scheduler policy per GPU")
    print(f"{'GPUs':>4} | {'path':<8} | {'without':<44} | {'with':<44} | scheduler steps")
    for n in counts:
        for nvml in (True, False):
            row = []
            steps = 0
            for extra in ("", policy):
                host = SimHost.from_profile("large")
                host.model.sched.nvml_supported = nvml
                cfg = parse_layout(f"version: v1\nconfigs:\n  r:\n    - devices: [{', '.join(map(str, range(n)))}]\n"
                                   "      mode: vgpu\n      sriov-vfs: 16\n      vgpu-devices: {A10-4Q: 6}\n"
                                   + extra).config()
                r = verbs.apply_host(host, cfg)
                steps = sum(1 for s in r.done if s.item.action.startswith("scheduler."))
                row.append(", ".join(f"{k} {v}" for k, v in r.round_trips.items())
                           + f" = {sum(r.round_trips.values())}")
            print(f"{n:>4} | {'nvml' if nvml else 'registry':<8} | {row[0]:<44} | {row[1]:<44} | {steps}")
    print("target: 'with' equals 'without' for every GPU count (the scheduler adds no round trip)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
