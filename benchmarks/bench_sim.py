"""Read the inventory globs of the `large` simulator profile three ways, against a static tree as the floor.

    .venv/bin/python benchmarks/bench_sim.py [--profile large] [--repeat 5] [--no-fuse]

Prints, in one run, for ``host.read(INVENTORY_GLOBS)`` (the inventory's single read):
* SimHost, in-process: the first read after a mutation (the model's version is bumped before each read, so
  no per-version cache helps) and a repeated read of an unchanged model;
* LocalHost over a live FUSE mount of the profile (needs root, /dev/fuse, fusermount3; mounted below a
  temporary directory): the first read after a mutation made through the mount (``driver_override`` of a
  device rewritten to its own value) and a repeated read;
* LocalHost over a materialized (static) tree of the same profile: the floor for reading through the
  kernel's VFS.
Each figure is the best and median of --repeat runs; ratios are against the static tree. The three
snapshots are checked to be equal (same paths, kinds, texts, link targets). Last, the shipped profiles' YAML
parsed with the profiles' loader against the pure-Python safe loader.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vgpuvirt.host.base import Snapshot  # noqa: E402
from vgpuvirt.host.local import LocalHost  # noqa: E402
from vgpuvirt.services.inventory.read import INVENTORY_GLOBS  # noqa: E402
from vgpuvirt.sim import SimHost, materialize  # noqa: E402

GLOBS = list(INVENTORY_GLOBS)


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return min(runs), statistics.median(runs)


def comparable(snap: Snapshot) -> dict[str, tuple[str, str | None, str | None, int | None]]:
    # /proc/cmdline is not part of the simulated tree: a mount or tree reads the real one, or nothing.
    return {p: (e.kind, e.text, e.target, e.errno) for p, e in snap.items() if not p.startswith("/proc/")}


def fuse_available() -> bool:
    import importlib.util
    return (os.geteuid() == 0 and os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
            and importlib.util.find_spec("mfusepy") is not None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="large")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-fuse", action="store_true", help="skip the FUSE mount figures")
    a = ap.parse_args()

    rows: list[tuple[str, float, float]] = []
    tmp = tempfile.mkdtemp(prefix="bench-sim-")
    try:
        tree = os.path.join(tmp, "tree")
        t = time.perf_counter()
        count = materialize(a.profile, tree)
        print(f"profile {a.profile}: {count} entries below /sys (materialized in {time.perf_counter() - t:.2f} s)")
        static = LocalHost(tree)
        ref = comparable(static.read(GLOBS))
        print(f"inventory globs: {len(GLOBS)} patterns, {len(ref)} paths read")
        rows.append(("static tree, LocalHost", *timed(lambda: static.read(GLOBS), a.repeat)))

        sim = SimHost.from_profile(a.profile)
        assert comparable(sim.read(GLOBS)) == ref, "SimHost snapshot differs from the materialized tree"

        def sim_cold() -> None:
            with sim.model.lock:
                sim.model.bump()
            sim.read(GLOBS)
        rows.append(("SimHost in-process, after a mutation", *timed(sim_cold, a.repeat)))
        rows.append(("SimHost in-process, unchanged model", *timed(lambda: sim.read(GLOBS), a.repeat)))

        if a.no_fuse:
            pass
        elif not fuse_available():
            print("FUSE figures skipped: needs root, /dev/fuse, fusermount3 and mfusepy")
        else:
            from vgpuvirt.sim import fuse
            mnt = os.path.join(tmp, "mnt")
            os.mkdir(mnt)
            t = time.perf_counter()
            fuse.start(a.profile, mnt, pid_file=mnt + ".pid")
            print(f"FUSE mount up in {time.perf_counter() - t:.2f} s")
            try:
                live = LocalHost(mnt)
                t = time.perf_counter()
                first = live.read(GLOBS)
                print(f"FUSE first read after mounting: {time.perf_counter() - t:.3f} s")
                assert comparable(first) == ref, "FUSE snapshot differs from the materialized tree"
                # Rewriting a device's driver_override with its own value is a mutation (version bump)
                # that changes nothing visible.
                dev = sorted(p for p in ref if p.endswith("/driver_override"))[0]
                value = ref[dev][1] or ""
                value = "" if value.strip() == "(null)" else value

                def fuse_cold() -> None:
                    with open(mnt + dev, "w", encoding="utf-8") as fh:
                        fh.write(value or "\n")
                    live.read(GLOBS)
                rows.append(("FUSE mount, LocalHost, after a mutation", *timed(fuse_cold, a.repeat)))
                rows.append(("FUSE mount, LocalHost, unchanged model", *timed(lambda: live.read(GLOBS), a.repeat)))
                assert comparable(live.read(GLOBS)) == ref, "FUSE snapshot changed after the no-op writes"
            finally:
                fuse.stop(mnt, pid_file=mnt + ".pid")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    floor = rows[0][1]
    print(f"\n{'read of INVENTORY_GLOBS':44s} {'best':>9s} {'median':>9s} {'best / static':>14s}")
    for name, best, med in rows:
        print(f"{name:44s} {best:8.3f}s {med:8.3f}s {best / floor:13.1f}x")
    parse_profiles(a.repeat)
    return 0


def parse_profiles(repeat: int) -> None:
    """Every shipped profile's YAML parsed with the loader profiles use (libyaml where PyYAML has it) against the
    pure-Python safe loader, the baseline; CPU time of this process."""
    import yaml

    from vgpuvirt.sim.profiles import list_profiles, profiles_dir
    from vgpuvirt.sim.type_tables import SAFE_LOADER
    texts = [profiles_dir().joinpath(f"{n}.yaml").read_text(encoding="utf-8") for n in list_profiles()]
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, loader in (("pure-Python SafeLoader (baseline)", yaml.SafeLoader),
                             (f"profiles' loader ({SAFE_LOADER.__name__})", SAFE_LOADER)):
            t = time.process_time()
            for text in texts:
                yaml.load(text, Loader=loader)  # both are safe loaders
            best[name] = min(best.get(name, 1e9), time.process_time() - t)
    base = best["pure-Python SafeLoader (baseline)"]
    print(f"\n{f'parse the {len(texts)} shipped profiles':44s} {'best CPU':>9s} {'x baseline':>11s}")
    for name, t in best.items():
        print(f"{name:44s} {t:8.3f}s {t / base:10.2f}x")


if __name__ == "__main__":
    sys.exit(main())
