"""Hand-built Inventory objects (the inventory service's dataclasses) for pure provisioning tests.

Type tables follow the hostdata transcripts in tests/fixtures/hostdata (T4 from nvidia_t4_sysfs.txt, L40S ids from
nvidia_vfio_vendor_specific.txt); availability follows the equal-size rule.
"""

from __future__ import annotations

from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.model import MdevUuid, PciAddress
from vgpuvirt.services.inventory.read import Gpu, Inventory, Mdev, MdevParent, MdevType, PciDevice, VendorType, VendorVf
from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts

# (id, name, heads, fb MiB, max_res, max_instances)
T4_TYPES = [
    ("nvidia-222", "GRID T4-1B", 4, 1024, "5120x2880", 16),
    ("nvidia-223", "GRID T4-2B", 4, 2048, "5120x2880", 8),
    ("nvidia-225", "GRID T4-1A", 1, 1024, "1280x1024", 16),
    ("nvidia-226", "GRID T4-2A", 1, 2048, "1280x1024", 8),
    ("nvidia-230", "GRID T4-1Q", 4, 1024, "5120x2880", 16),
    ("nvidia-231", "GRID T4-2Q", 4, 2048, "7680x4320", 8),
    ("nvidia-232", "GRID T4-4Q", 4, 4096, "7680x4320", 4),
    ("nvidia-233", "GRID T4-8Q", 4, 8192, "7680x4320", 2),
    ("nvidia-234", "GRID T4-16Q", 4, 16384, "7680x4320", 1),
    ("nvidia-319", "GRID T4-4C", 1, 4096, "4096x2160", 4),
]

L40S_TYPES = [(1147, "NVIDIA L40S-1Q"), (1148, "NVIDIA L40S-2Q"), (1150, "NVIDIA L40S-4Q"),
              (1152, "NVIDIA L40S-8Q"), (1155, "NVIDIA L40S-24Q"), (1156, "NVIDIA L40S-48Q")]


def pcidev(addr: str, *, vendor: str = "0x10de", cls: str = "0x030200", numa: int | None = 0,
           physfn: str | None = None, virtfns: tuple[str, ...] = (), driver: str | None = "nvidia",
           group: int | None = None) -> PciDevice:
    return PciDevice(address=PciAddress.parse(addr), vendor=vendor, device="0x1eb8", pci_class=cls, driver=driver,
                     iommu_group=group, numa_node=numa, physfn=PciAddress.parse(physfn) if physfn else None,
                     virtfns=[PciAddress.parse(v) for v in virtfns], sriov_totalvfs=None, sriov_numvfs=None)


def t4_types(used: dict[int, int] | None = None) -> list[MdevType]:
    """T4 types; ``used`` maps framebuffer MiB -> instances in use (equal-size rule)."""
    used = used or {}
    size = next(iter(used), None)
    out = []
    for tid, name, heads, fb, res, mx in T4_TYPES:
        if size is None:
            avail = mx
        elif fb == size:
            avail = mx - used[size]
        else:
            avail = 0
        out.append(MdevType(id=tid, name=name, description=None, device_api="vfio-pci", available_instances=avail,
                            framebuffer_mib=fb, max_instances=mx, num_heads=heads, max_resolution=res,
                            series=name[-1] if name[-1] in "QBAC" else None, mig_backed=False))
    return out


def t4_host(name: str = "h1", *, gpus: tuple[tuple[str, int], ...] = (("0000:3b:00.0", 0), ("0000:d8:00.0", 1)),
            mdevs: tuple[tuple[str, str, str], ...] = ()) -> Inventory:
    """A host with T4s at the given (address, NUMA node); ``mdevs`` = (uuid, parent, type) existing."""
    fb = {t[0]: t[3] for t in T4_TYPES}
    parents, devs, gl, ml = [], [], [], []
    groups: dict[int, list[PciAddress]] = {}
    for i, (addr, numa) in enumerate(gpus):
        mine = [m for m in mdevs if m[1] == addr]
        used = {fb[mine[0][2]]: len(mine)} if mine else None
        parents.append(MdevParent(address=addr, types=t4_types(used)))
        devs.append(pcidev(addr, numa=numa, group=20 + i))     # a server GPU alone in its IOMMU group
        groups[20 + i] = [PciAddress.parse(addr)]
        gl.append(Gpu(address=PciAddress.parse(addr), vendor="0x10de", device="0x1eb8", driver="nvidia",
                      backend="mdev", numa_node=numa, vfs=[]))
        ml += [Mdev(uuid=MdevUuid.parse(u), parent=p, type=t) for u, p, t in mine]
    return Inventory(host=name, iommu_enabled=True, pci_devices=devs, iommu_groups=groups, mdev_parents=parents,
                     mdevs=ml, vendor_vgpu=[], gpus=gl, warnings=[])


def l40s_host(name: str = "h2", nvfs: int = 4, taken: dict[int, int] | None = None) -> Inventory:
    """An L40S (vGPU 17+ vendor-specific VFs). ``taken`` = VF index -> current type id."""
    taken = taken or {}
    pf = "0000:41:00.0"
    vfs = [f"0000:41:00.{i + 4}" if i < 4 else f"0000:41:01.{i - 4}" for i in range(nvfs)]
    vv = []
    for i, v in enumerate(vfs):
        cur = taken.get(i, 0)
        creatable = [] if cur else [VendorType(id=t, name=n) for t, n in L40S_TYPES]
        name_of = dict(L40S_TYPES).get(cur)
        vv.append(VendorVf(address=PciAddress.parse(v), physfn=PciAddress.parse(pf), current_type=cur,
                           creatable_types=creatable, current_type_name=name_of))
    devs = [pcidev(pf, virtfns=tuple(vfs), numa=1), *(pcidev(v, physfn=pf, numa=1) for v in vfs)]
    # What nvidia-smi -q -x says of an L40S (the framebuffer is not in sysfs for vGPU 17+ VFs).
    facts = NvidiaGpuFacts("nvidia-smi", PciAddress.parse(pf), product_name="NVIDIA L40S", memory_total_mib=49152,
                           virtualization_mode="Host VGPU", host_vgpu_mode="SR-IOV", vgpu_heterogeneous_mode="Disabled")
    gpu = Gpu(address=PciAddress.parse(pf), vendor="0x10de", device="0x26b9", driver="nvidia",
              backend="vendor-vfio", numa_node=1, vfs=[PciAddress.parse(v) for v in vfs], sriov_totalvfs=32,
              nvidia=facts)
    return Inventory(host=name, iommu_enabled=True, pci_devices=devs, iommu_groups={}, mdev_parents=[], mdevs=[],
                     vendor_vgpu=vv, gpus=[gpu], warnings=[])


def desktop_host(name: str = "h3") -> Inventory:
    """A consumer GPU for passthrough (GPU + HDMI audio) and an SR-IOV NIC with two VFs."""
    gpu, audio = "0000:01:00.0", "0000:01:00.1"
    nic, vf0, vf1 = "0000:05:00.0", "0000:05:10.0", "0000:05:10.2"
    # The GPU and its HDMI audio share IOMMU group 1 (a normal consumer card); the NIC and VFs have their own.
    devs = [pcidev(gpu, cls="0x030000", driver="vfio-pci", group=1),
            pcidev(audio, cls="0x040300", driver="snd_hda_intel", group=1),
            pcidev(nic, vendor="0x8086", cls="0x020000", virtfns=(vf0, vf1), driver="igb", group=2),
            pcidev(vf0, vendor="0x8086", cls="0x020000", physfn=nic, driver="igbvf", group=3),
            pcidev(vf1, vendor="0x8086", cls="0x020000", physfn=nic, driver="igbvf", group=4)]
    groups = {1: [PciAddress.parse(gpu), PciAddress.parse(audio)], 2: [PciAddress.parse(nic)],
              3: [PciAddress.parse(vf0)], 4: [PciAddress.parse(vf1)]}
    g = Gpu(address=PciAddress.parse(gpu), vendor="0x10de", device="0x2684", driver="vfio-pci",
            backend="passthrough", numa_node=0, vfs=[], functions=[PciAddress.parse(audio)])
    return Inventory(host=name, iommu_enabled=True, pci_devices=devs, iommu_groups=groups, mdev_parents=[],
                     mdevs=[], vendor_vgpu=[], gpus=[g], warnings=[])


def drop_test_domains(conn: LibvirtConnection) -> None:
    """Destroy and undefine every domain a test defined on libvirt's test driver (its own ``test`` stays),
    then close: ``test:///default`` keeps one state per process."""
    for d in conn.domains():
        if d.name != "test":
            conn.destroy(d.name)
            conn.undefine(d.name)
    conn.close()
