"""Reshape a pool of A100 hosts: vGPU desktops by day, whole-GPU and 7g MIG training VMs at night, and back.

    python examples/reshape_day_night.py                  # 3 simulated a100-sriov hosts, libvirt's test driver
    python examples/reshape_day_night.py --hosts 2 --desktops 6

Day: every A100 is shared as 10 x A100D-8C vGPUs (MIG off); desktops run on them. Night: GPU 0 of each
host is passed through whole, GPU 1 becomes one 7g.80gb MIG instance with an A100D-7-80C vGPU; the
layout is applied with ``drain="shutdown"``: the desktops are shut down, and as nothing of their type is
left they stay defined but stopped. Two training VMs per host start on the new devices. Morning: the
day layout comes back (draining the training VMs, which no longer fit), and the desktops start again on
the same vGPUs (a layout's mdev UUIDs are derived from parent, type and ordinal, so they come back).
Each host has its own libvirt test driver (``test:///DIR/HOST.xml``) and is worked in parallel.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from vgpuvirt.layout import parse_layout, verbs
from vgpuvirt.layout.drain import DrainReport, apply_with_drain
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.sim.host import SimHost

LAYOUT = parse_layout("""\
version: v1
configs:
  day:
    - devices: all
      mode: vgpu
      vgpu-devices: {A100D-8C: 10}
  night:
    - devices: [0]
      mode: passthrough
    - devices: [1]
      mode: mig-vgpu
      mig-devices: {"7g.80gb": 1}
      vgpu-devices: {A100D-7-80C: 1}
""", "reshape_day_night.py")

VM = ("<domain type='test'><name>{name}</name><memory unit='MiB'>1024</memory><os><type>hvm</type></os>"
      "<devices>{dev}</devices></domain>")
MDEV = "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{uuid}'/></source></hostdev>"
PCI = ("<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{d:04x}' bus='0x{b:02x}' "
       "slot='0x{s:02x}' function='0x{f:x}'/></source></hostdev>")


def show(when: str, report: DrainReport) -> None:
    print(f"== {when}")
    for r in report.results:
        print(f"{r.host}: {len(r.done)} step(s), round trips {r.round_trips}")
        for vm in report.drained.get(r.host, []):
            print(f"  drained {vm}")
        for vm, how in report.moved.get(r.host, {}).items():
            print(f"  moved {vm}: {how}")
        for vm in report.restarted.get(r.host, []):
            print(f"  started {vm} again")
        for vm, why in sorted(report.unfit.get(r.host, {}).items()):
            print(f"  {vm} no longer fits ({why}): defined, stopped")


def free_vgpus(host: SimHost, conn: LibvirtConnection) -> list[tuple[str, str]]:
    """(GPU, mdev UUID) of the vGPUs no domain uses."""
    _, gpus = verbs.read_gpus(host, list(conn.domain_xml_pairs()))
    return [(str(g.address), v.uuid) for g in gpus for v in g.vgpus if v.uuid and v.domain is None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--desktops", type=int, default=4, help="desktops per host")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="reshape-"))
    hosts = [SimHost.from_profile("a100-sriov", name=f"sim:a100-{i}") for i in range(a.hosts)]
    conns: dict[str, LibvirtConnection | None] = {}
    for h in hosts:
        node = tmp / f"{h.name.replace(':', '-')}.xml"
        node.write_text("<node/>")
        conns[h.name] = LibvirtConnection(f"test://{node}")

    # day: desktops on the vGPUs
    show("day", apply_with_drain(hosts, LAYOUT.config("day"), conns=conns))
    desktops: dict[str, list[str]] = {}
    for i, h in enumerate(hosts):
        conn = conns[h.name]
        assert conn is not None
        for k, (_, uuid) in enumerate(free_vgpus(h, conn)[:a.desktops]):
            name = f"desk-{i}-{k}"
            conn.define(VM.format(name=name, dev=MDEV.format(uuid=uuid)))
            conn.start(name)
            desktops.setdefault(h.name, []).append(name)
    print(f"{sum(len(v) for v in desktops.values())} desktops running")

    # night: drain the desktops, reshape, start the training VMs on the new devices
    show("night", apply_with_drain(hosts, LAYOUT.config("night"), conns=conns, drain="shutdown", timeout=10))
    for i, h in enumerate(hosts):
        conn = conns[h.name]
        assert conn is not None
        gpus = verbs.read_gpus(h)[1]
        whole = next(g for g in gpus if g.mode() == "passthrough").address
        conn.define(VM.format(name=f"train-{i}-whole", dev=PCI.format(d=whole.domain, b=whole.bus, s=whole.slot,
                                                                     f=whole.function)))
        conn.define(VM.format(name=f"train-{i}-7g", dev=MDEV.format(uuid=free_vgpus(h, conn)[0][1])))
        for vm in (f"train-{i}-whole", f"train-{i}-7g"):
            conn.start(vm)
            print(f"{h.name}: started {vm}")

    # morning: back to desktops; the training VMs are drained and no longer fit
    show("morning", apply_with_drain(hosts, LAYOUT.config("day"), conns=conns, drain="shutdown", timeout=10))
    back = 0
    for h in hosts:
        conn = conns[h.name]
        assert conn is not None
        for vm in desktops.get(h.name, []):
            conn.start(vm)       # its vGPU has the same UUID again
            back += 1
        assert verbs.check(h, LAYOUT.config("day"), list(conn.domain_xml_pairs())) == []
    print(f"{back} desktops running again")
    for c in conns.values():
        if c is not None:
            c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
