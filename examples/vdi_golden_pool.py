"""A VDI pool of linked clones: every desktop boots from its own qcow2 overlay of one golden image.

    python examples/vdi_golden_pool.py                       # local libvirtd: makes a 64 MiB golden image
    python examples/vdi_golden_pool.py --connect qemu+ssh://root@gpu1/system --host ssh://root@gpu1 \\
        --pool vdi --golden /var/lib/libvirt/images/win11-golden.qcow2 --count 20 --gpu 'fb>=2G,series=Q' --keep

Without --golden (local libvirt only) a small empty golden image is made with qemu-img in --dir, and a
directory pool over --dir is defined for it (removed again at the end, like the image). Then the pool's
desktops are provisioned: the plan's pre-flight checks the pool, the golden image, the network and the
firmware; each desktop gets a volume ``{name}.qcow2`` created through libvirt's storage API with the golden
image as its backing store; the domains are defined and started. The example then checks each running
domain's disk chain (overlay -> golden image) in its live XML and in the volume's own XML, and (unless
--keep) tears the pool down, deleting the overlays (--keep-disks keeps them) and never the golden image.
Without --gpu the desktops have no host devices (they boot anywhere, e.g. on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from vgpuvirt.hosts import open_host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision import VgpuRequest, VmRequest, provision, teardown
from vgpuvirt.provision.disks import ClonedDisk
from vgpuvirt.xml.storage import StoragePool, backing_chains


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="local", help="the host whose GPUs are placed (default: local)")
    ap.add_argument("--connect", default="qemu:///system", help="libvirt URI (default: qemu:///system)")
    ap.add_argument("--pool", default=None, help="storage pool (default: vgpuvirt-golden-PID, made over --dir)")
    ap.add_argument("--dir", default=None, help="directory of the pool made for --pool (default: a temp dir)")
    ap.add_argument("--golden", default=None, help="golden image path, a volume of the pool (default: made)")
    ap.add_argument("--prefix", default=f"golden{os.getpid()}", help="desktop name prefix")
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--gpu", default=None, metavar="SPEC", help="a GPU per desktop (default: none)")
    ap.add_argument("--network", default=None, help="libvirt network for a virtio NIC (default: no NIC)")
    ap.add_argument("--memory-mib", type=int, default=256)
    ap.add_argument("--keep", action="store_true", help="leave the desktops running")
    ap.add_argument("--keep-disks", action="store_true", help="teardown keeps the overlays")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    conn = LibvirtConnection(a.connect)
    host = open_host(a.host)
    made: list[str] = []                      # what this run made outside provisioning, undone at the end
    pool = a.pool or f"vgpuvirt-golden-{os.getpid()}"
    try:
        if not conn.pool_exists(pool):
            directory = a.dir or tempfile.mkdtemp(prefix="vgpuvirt-golden-")
            if a.dir is None:
                made.append(f"dir:{directory}")
            conn.define_pool(StoragePool(pool, target=os.path.abspath(directory)))
            made.append(f"pool:{pool}")
            print(f"defined storage pool {pool} at {directory}")
        golden = a.golden
        if golden is None:
            directory = conn.facts(refresh=False).pools[pool].target
            golden = f"{directory}/golden.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", golden, "64M"], check=True)
            made.append(f"file:{golden}")
            print(f"made golden image {golden} (qemu-img, 64 MiB)")
        nics = [{"kind": "network", "source": a.network}] if a.network else []
        # Nested KVM here refuses Hyper-V VP_INDEX and crashes on arch-capabilities (docs/testbed.md).
        options = {"virtio_nics": nics, "hyperv": False, "disable_arch_capabilities": True}
        gpus = (VgpuRequest.parse(a.gpu),) if a.gpu else ()
        desktops = VmRequest.pool(a.prefix, a.count, gpu=gpus, template="vdi", memory_mib=a.memory_mib, vcpus=1,
                                  disk=ClonedDisk(pool, golden), options=options)
        result = provision(host, conn, desktops)
        print(result.plan.format())
        for d in desktops:
            chain = backing_chains(conn.xml(d.name))["vda"]
            vol = conn.volume(chain[0])
            state = "running" if conn.is_active(d.name) else "defined"
            print(f"{d.name}: {state}, disk chain {' -> '.join(chain)}; volume {vol.name} is {vol.format} "
                  f"backed by {vol.backing}")
            if vol.backing != golden or golden not in chain:
                print(f"{d.name}: its disk is not a linked clone of {golden}", file=sys.stderr)
                return 1
        if a.keep:
            return 0
        td = teardown(host, conn, [d.name for d in desktops], remove_storage=not a.keep_disks)
        print(f"torn down: {sum('undefined' in x for x in td.removed)} desktops, "
              f"{len(td.disks_removed)} overlays deleted; golden image kept: {os.path.exists(golden) or golden}")
        for line in td.failed:
            print(f"teardown failed: {line}", file=sys.stderr)
        return 0 if td.ok else 1
    finally:
        if not a.keep:
            for what in reversed(made):
                kind, _, name = what.partition(":")
                if kind == "file" and os.path.exists(name):
                    os.unlink(name)
                elif kind == "pool":
                    conn.remove_pool(name)
                elif kind == "dir" and os.path.isdir(name) and not os.listdir(name):
                    os.rmdir(name)
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
