"""Build + schema-validate N domains (default 1,000) on one core; print per-domain time, domains/s, baselines.

Baselines measured in the same run: (a) schema validation alone of already-built domains, (b) parsing the
template text with lxml (what each build would cost if templates were reparsed instead of deep-copied), and
(c) the same builds and validations in two batches (all builds, then all validations): a validation run right
after a build costs more than one run after another validation (the schema's tables leave the CPU cache
while Python builds), so (c) against the full figure shows that share.
The domains are a pool: three request shapes, each VM with its own name, UUIDs and host addresses, so a build
stamps the VM's values into its shape's kept tree. ``first build of a shape`` is the same builds with every
kept template and shape forgotten before each (what a process pays once per shape).
Each measure runs ROUNDS times, interleaved with the others, and the best round counts; times are this
process's CPU time (``time.process_time``), which the load of other processes on a shared machine barely moves.

    .venv/bin/python benchmarks/bench_xml.py [N [ROUNDS]] [--profile-top K]

``--profile-top K`` adds a cProfile of N builds from kept shapes: the function calls per build and the K
functions that take the most time of their own.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
import uuid

from lxml import etree

from vgpuvirt.model import MacAddress, MdevUuid, PciAddress
from vgpuvirt.xml import (
    CpuPinning,
    DomainOptions,
    HostdevInterface,
    MdevHostdev,
    PciHostdev,
    build_domain,
    validate,
)
from vgpuvirt.xml.schema import schema
from vgpuvirt.xml.templates import clear_caches, template_path

HOST_CPUS = frozenset(range(64))


def build(i: int) -> object:
    """Alternate the three templates with realistic device mixes."""
    kind = i % 3
    name = f"bench-{i:05d}"
    if kind == 0:
        return build_domain("vdi", name=name, memory_mib=8192, vcpus=4,
                            mdevs=[MdevHostdev(MdevUuid(str(uuid.UUID(int=i + 1))), display=True, ramfb=True)],
                            options=DomainOptions(tpm=True, secure_boot=True))
    if kind == 1:
        bus = 0x10 + (i % 200)
        return build_domain("gaming", name=name, memory_mib=16384, vcpus=8, host_cpus=HOST_CPUS,
                            cpu_pinning=CpuPinning.from_cpulist("8-15", emulator="0-1"),
                            pci=[PciHostdev(PciAddress(0, bus, 0, 0)), PciHostdev(PciAddress(0, bus, 0, 1))],
                            nics=[HostdevInterface(PciAddress(0, 0x5e, 2, 1), mac=MacAddress("52:54:00:00:00:01"),
                                                   vlan=10)],
                            options=DomainOptions(kvm_hidden=True, hyperv_vendor_id="vgpuvirt"))
    return build_domain("compute", name=name, memory_mib=262144, vcpus=32, numa_node=1,
                        mdevs=[MdevHostdev(MdevUuid(str(uuid.UUID(int=(i << 8) + k)))) for k in range(4)])


def _round(fn: object, n: int) -> float:
    """CPU seconds of this process for one round (other processes' load barely moves it: CI has 2 shared cores)."""
    t0 = time.process_time()
    fn()  # type: ignore[operator]
    return time.process_time() - t0


def profile(n: int, top: int) -> None:
    """Function calls per build, and the ``top`` functions by their own time, of n builds (shapes already kept)."""
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        build(i)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    print(f"cProfile of {n} builds: {stats.total_calls / n:,.0f} function calls per build")  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=1000)
    ap.add_argument("rounds", nargs="?", type=int, default=5)
    ap.add_argument("--profile-top", type=int, default=0)
    a = ap.parse_args()
    n, rounds = a.n, a.rounds
    schema()  # compile once, outside the timed loop (a long-running caller pays this once: ~10 ms)
    for i in range(30):  # warm the template cache
        validate(build(i))
    built = [build(i) for i in range(n)]     # the validate-only baseline's input, built once
    texts = [template_path(t).read_bytes() for t in ("vdi", "gaming", "compute")]
    parser = etree.XMLParser(remove_blank_text=True)

    def full() -> None:
        for i in range(n):
            validate(build(i))    # not kept: keeping n domains alive makes the collector's passes the cost

    def build_only() -> None:
        for i in range(n):
            build(i)

    def validate_only() -> None:
        for dom in built:
            validate(dom)

    def batch() -> None:
        # the same work as full(), every build first: the schema's tables stay in the CPU cache while the
        # domains are validated one after another, as in validate_only()
        doms = [build(i) for i in range(n)]
        for dom in doms:
            validate(dom)

    def first_of_shape() -> None:
        for i in range(n):
            clear_caches()
            build(i)

    def parse() -> None:
        for i in range(n):
            etree.fromstring(texts[i % 3], parser)

    # interleaved rounds, the best of each: a burst of load from elsewhere hits one round, not one measure
    times: dict[str, list[float]] = {"full": [], "build": [], "validate": [], "parse": [], "batch": [], "first": []}
    for _ in range(rounds):
        for key, fn in (("full", full), ("build", build_only), ("validate", validate_only), ("parse", parse),
                        ("batch", batch), ("first", first_of_shape)):
            times[key].append(_round(fn, n))
    t_full, t_build, t_validate, t_parse, t_batch, t_first = (
        min(times[k]) for k in ("full", "build", "validate", "parse", "batch", "first"))

    per = t_full / n * 1e3
    print(f"domains                         {n} per round, best of {rounds} rounds (CPU time of this process)")
    print(f"build + validate                {t_full:.3f} s   {per:.3f} ms/domain   {n / t_full:,.0f} domains/s")
    print(f"  build only                    {t_build:.3f} s   {t_build / n * 1e3:.3f} ms/domain"
          f"   ratio build/validate = {t_build / t_validate:.2f}x")
    print(f"baseline: validate only         {t_validate:.3f} s   {t_validate / n * 1e3:.3f} ms/domain"
          f"   ratio full/validate = {t_full / t_validate:.2f}x")
    print(f"  validate within build + validate {(t_full - t_build) / n * 1e3:.3f} ms/domain"
          f"   = {(t_full - t_build) / t_validate:.2f}x validate only (a build between two validations)")
    print(f"  all builds, then all validations {t_batch:.3f} s   {t_batch / n * 1e3:.3f} ms/domain"
          f"   ratio batch/validate = {t_batch / t_validate:.2f}x (the same work, validations in a row)")
    print(f"  first build of a shape        {t_first:.3f} s   {t_first / n * 1e3:.3f} ms/domain"
          f"   = {t_first / t_build:.1f}x a build from a kept shape (once per shape and process)")
    print(f"baseline: parse template text   {t_parse:.3f} s   {t_parse / n * 1e3:.3f} ms/domain"
          f"   ratio full/parse = {t_full / t_parse:.1f}x")
    print(f"target >= 1,000 domains/s: {'met' if n / t_full >= 1000 else 'NOT met'}; "
          f"build + validate <= 1.6x validate: {'met' if t_full / t_validate <= 1.6 else 'NOT met'}")
    if a.profile_top:
        profile(n, a.profile_top)


if __name__ == "__main__":
    main()
