"""``nvidia-smi -q -x`` parsed once per read (issue 23): the parse a read does now against the parses it did before.

    .venv/bin/python benchmarks/bench_host_read.py [--repeat 50] [--profile large]

In one run, on the real H100's document (tests/fixtures/real/h100-580/raw/nvidia-smi-q.xml, one GPU, driver 580)
and on the simulator's for ``--profile`` (``large``: 8 GPUs), best of ``--repeat``:
* before: what one read parsed: the inventory's facts (``parse_nvidia_smi_xml``) and the readings
  (``parse_readings``) each parsed the document (a metrics scrape's first read: the facts and the kept
  fingerprint; a layout read: those and the MIG state, 3);
* after: one :class:`~vgpuvirt.services.nvidia.report.SmiReport` parse, shared by all of them;
* the ratio; and, for scale, a whole metrics collection (first and steady) and an inventory of the real H100
  capture (a replay: no link, no program time), with how many times the document was parsed in each.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lxml import etree  # noqa: E402

from vgpuvirt.host.base import Op, OpResult  # noqa: E402
from vgpuvirt.hosts import open_host  # noqa: E402
from vgpuvirt.observe.collect import Collector  # noqa: E402
from vgpuvirt.services.inventory.read import inventory  # noqa: E402
from vgpuvirt.services.nvidia.readings import parse_readings  # noqa: E402
from vgpuvirt.services.nvidia.report import SmiReport  # noqa: E402
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV, parse_nvidia_smi_xml  # noqa: E402

H100_XML = REPO / "tests/fixtures/real/h100-580/raw/nvidia-smi-q.xml"
H100_CAPTURE = REPO / "tests/fixtures/real/h100-580/capture/capture.json"


def best_ms(fn: Callable[[], Any], repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out) * 1000


def parses(fn: Callable[[], Any]) -> int:
    """How many times ``fn`` parses an nvidia-smi document."""
    real, count = etree.fromstring, [0]

    def counting(text: Any, *a: Any, **k: Any) -> Any:
        if b"<nvidia_smi_log" in (text.encode() if isinstance(text, str) else bytes(text)):
            count[0] += 1
        return real(text, *a, **k)

    etree.fromstring = counting
    try:
        fn()
    finally:
        etree.fromstring = real
    return count[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--profile", default="large")
    args = ap.parse_args()
    sim = open_host(f"sim:{args.profile}")
    docs = {"real H100 (1 GPU)": H100_XML.read_text(),
            f"sim {args.profile}": sim.run(list(NVIDIA_SMI_ARGV)).stdout}
    for name, text in docs.items():
        result = OpResult(Op.exec(NVIDIA_SMI_ARGV, read_only=True), True, rc=0, stdout=text)
        two = best_ms(lambda t=text: (parse_nvidia_smi_xml(t), parse_readings(t)), args.repeat)
        three = best_ms(lambda t=text: (parse_nvidia_smi_xml(t), parse_readings(t), parse_nvidia_smi_xml(t)),
                        args.repeat)
        once = best_ms(lambda r=result: SmiReport.parse(r), args.repeat)
        print(f"{name:<22} {len(text) / 1024:7.1f} KiB  before: 2 parses {two:7.2f} ms, 3 parses {three:7.2f} ms;"
              f"  after: 1 parse {once:7.2f} ms  ({two / once:.2f}x, {three / once:.2f}x)")
    host = open_host(f"capture:{H100_CAPTURE}")
    c = Collector()
    t = time.perf_counter()
    n1 = parses(lambda: c.collect(host))
    first = (time.perf_counter() - t) * 1000
    n2 = parses(lambda: c.collect(host))
    steady = best_ms(lambda: c.collect(host), args.repeat)
    n3 = parses(lambda: inventory(host))
    inv = best_ms(lambda: inventory(host), args.repeat)
    print(f"real H100 capture: metrics first {first:.1f} ms (parses: {n1}), steady best {steady:.1f} ms "
          f"(parses: {n2}; the capture has no --query-gpu, so -q -x is read each time); "
          f"inventory best {inv:.1f} ms (parses: {n3})")


if __name__ == "__main__":
    main()
