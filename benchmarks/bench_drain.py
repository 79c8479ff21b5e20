"""Drain a simulated host with 16 GPU VMs to 3 others: round trips per host per phase, wall time with parallel
migrations against one at a time (the baseline, measured in the same run), and the orchestration's own time
(pre-checks + reservation + release) against the migration itself.

    .venv/bin/python benchmarks/bench_drain.py [--vms 16] [--parallel 4] [--transfer-ms 300]

The GPU side is four in-process simulated hosts (t4x2: 16 x T4-2Q fit on each). No libvirt here can migrate
a domain between two simulated hosts, so the libvirt side is a stand-in connection that keeps each host's
domains in memory and whose migration takes ``--transfer-ms`` (what QEMU's RAM + framebuffer copy would
take); everything else (reads, pre-checks, placement, the engine's reservation batch and journal, the
release) is vgpuvirt's real code. The real libvirt migration is measured by the integration tests on the
testbed's migration hosts, not here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vgpuvirt.change.identity import mdev_uuid_for
from vgpuvirt.change.mdev import CreateMdev
from vgpuvirt.libvirt_conn import DomainInfo, LibvirtConnection
from vgpuvirt.model import MdevTypeId, PciAddress
from vgpuvirt.provision.mobility import Side, migrate
from vgpuvirt.provision.mobility.drain import drain
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.sim import SimHost

GPUS = (PciAddress.parse("0000:3b:00.0"), PciAddress.parse("0000:d8:00.0"))
_REGISTRY: dict[str, StandIn] = {}


class StandIn(LibvirtConnection):
    """libvirt for one simulated host: domains in memory; a migration sleeps, then moves the domain."""

    def __init__(self, uri: str, transfer_s: float) -> None:
        super().__init__(uri)
        self.transfer_s = transfer_s
        self.doms: dict[str, tuple[str, bool]] = {}
        _REGISTRY[uri] = self

    def host_facts(self) -> dict[str, Any]:
        return {"libvirt": 10_000_000, "hypervisor": 8_002_000, "host_uuid": self.uri}

    def domains(self) -> list[DomainInfo]:
        return [DomainInfo(n, n, a, True, x) for n, (x, a) in sorted(self.doms.items())]

    def xml(self, name: str, *, inactive: bool = False, migratable: bool = False) -> str:
        return self.doms[name][0]

    def exists(self, name: str) -> bool:
        return name in self.doms

    def define(self, xml: str) -> str:
        name = xml.split("<name>", 1)[1].split("<", 1)[0]
        self.doms[name] = (xml, False)
        return name

    def undefine(self, name: str, *, remove_storage: bool = False) -> list[str]:
        self.doms.pop(name, None)
        return []

    def migrate(self, name: str, dest_uri: str, *, dest_xml: str, persist_xml: str, live: bool = True,
                bandwidth_mib: int | None = None, max_downtime_ms: int | None = None,
                on_job: Any = None, poll_s: float = 0.25) -> None:
        time.sleep(self.transfer_s)
        _REGISTRY[dest_uri].doms[name] = (dest_xml, True)
        del self.doms[name]

    def close(self) -> None:
        pass


def vm_xml(vm: str, uuids: list[str]) -> str:
    devs = "".join(f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/>"
                   "</source></hostdev>" for u in uuids)
    return (f"<domain type='kvm'><name>{vm}</name><memory unit='MiB'>4096</memory><os><type arch='x86_64' "
            f"machine='pc-q35-8.2'>hvm</type></os><devices>{devs}</devices></domain>")


def fleet(n_vms: int, gpus_per_vm: int, transfer_s: float, tag: str) -> tuple[Side, list[Side]]:
    typ = MdevTypeId.parse("nvidia-231" if gpus_per_vm == 1 else "nvidia-230")   # 2Q: 8/GPU; 1Q: 16/GPU
    sides = [Side(SimHost.from_profile("t4x2", name=f"{tag}{i}"), StandIn(f"standin:///{tag}{i}", transfer_s))
             for i in range(4)]
    src = sides[0]
    items = []
    for v in range(n_vms):
        vm = f"vm{v:02d}"
        uuids = []
        for k in range(gpus_per_vm):
            u = mdev_uuid_for(vm, k)
            items.append(CreateMdev(src.name, vm, u, GPUS[(v * gpus_per_vm + k) % 2], typ).item(5.0))
            uuids.append(str(u))
        src.conn.doms[vm] = (vm_xml(vm, uuids), True)          # type: ignore[attr-defined]
    assert all(o.ok for o in apply_items(src.host, items))
    return src, sides[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vms", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--transfer-ms", type=int, default=300)
    a = ap.parse_args()
    transfer = a.transfer_ms / 1000

    print(f"drain {a.vms} VMs (one T4-2Q each) from a t4x2 host to 3 others; stand-in transfer {a.transfer_ms} ms")
    walls = {}
    for par in (1, a.parallel):
        src, others = fleet(a.vms, 1, transfer, f"p{par}-")
        t0 = time.perf_counter()
        res = drain(src, others, parallel=par)
        walls[par] = time.perf_counter() - t0
        assert res.ok and len(res.fates) == a.vms, res.to_dict()
        dests = {f.dest: 0 for f in res.fates}
        for f in res.fates:
            dests[f.dest] += 1
        rts = ", ".join(f"{h}: {n}" for h, n in res.round_trips.items())
        print(f"  parallel {par}: {walls[par]:.2f} s; VMs per destination {sorted(dests.values())}; "
              f"round trips {rts}")
    print(f"  speed-up, parallel {a.parallel} vs one at a time (baseline): {walls[1] / walls[a.parallel]:.2f}x "
          f"(ideal {min(a.parallel, a.vms)}x)")

    print("\nper migration (migrate(), one at a time): round trips per host per phase and the orchestration's time")
    for g in (1, 4):
        src, others = fleet(4, g, transfer, f"g{g}-")
        phases: dict[str, list[float]] = {}
        rt: list[dict[str, int]] = []
        for v in range(4):
            r = migrate(f"vm{v:02d}", src, others[v % 3])
            rt.append(r.round_trips)
            for k, s in r.phases.items():
                phases.setdefault(k, []).append(s)
        src_rt = {d[src.name] for d in rt}
        dst_rt = {next(v for k, v in d.items() if k != src.name) for d in rt}
        pre = statistics.mean(phases["pre-checks"]) * 1000
        reserve = (statistics.mean(phases["reserve+migrate"]) - transfer) * 1000
        release = statistics.mean(phases["release"]) * 1000
        orch = pre + reserve + release
        print(f"  {g} vGPU(s) per VM: round trips source {sorted(src_rt)} (read, NVML metadata, release), destination "
              f"{sorted(dst_rt)} (read, NVML verdict, reservation batch); pre-checks {pre:.1f} ms, "
              f"reservation {reserve:.1f} ms, "
              f"release {release:.1f} ms: orchestration {orch:.1f} ms = {orch / a.transfer_ms:.2f} of the "
              f"{a.transfer_ms} ms migration")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
