"""Pre-flight: what a VM's domain needs from its host, checked when the plan is made, never at start.

For each domain the plan would define, against what the plan's one read of the host found (the host's
snapshot: :class:`~vgpuvirt.services.inventory.host_resources.HostResources`; its libvirt:
:class:`~vgpuvirt.libvirt_storage.LibvirtFacts`):

* every ``<interface type='network'>`` names a libvirt network that exists and is active, every
  ``<interface type='bridge'>`` a bridge among the host interfaces libvirt lists;
* a TPM's backend (``emulator``: swtpm) and secure boot (a secure OVMF loader) are ones libvirt can give;
* the linked clones the plan puts in a pool find their reserve free there (``ClonedDisk.reserve_gib`` each);
* a linked-clone disk's storage pool exists and is active and its golden image is a volume libvirt knows;
  a disk path inside an active pool's directory is a volume of that pool;
* the firmware (``<os firmware='efi'>``, or a ``<loader>`` path) is one libvirt's domain capabilities offer;
* ``<hugepages/>``: enough free pages of the page size the domain takes (its ``<page size>``, else the
  kernel's default) on its NUMA node (``<numatune>`` strict), or on the host, for all the VMs the plan
  puts there together;
* every CPU of ``<cputune>`` is online on the host.

A fact the read did not give (the test driver has no domain capabilities; a tree without hugepage files)
is not checked. Every problem found is collected; the plan is refused with all of them at once
(:class:`~vgpuvirt.errors.PreflightFailed`), before anything changes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.libvirt_storage import PoolFacts
from vgpuvirt.model import format_cpulist
from vgpuvirt.provision.disks import ClonedDisk, expand
from vgpuvirt.provision.request import VmRequest
from vgpuvirt.provision.state import HostState
from vgpuvirt.xml.domain import Domain

_UNITS_KB = {"b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kb": 1, "kib": 1, "m": 1024, "mb": 1024, "mib": 1024,
             "g": 1024**2, "gb": 1024**2, "gib": 1024**2}


@dataclass
class Ledger:
    """Hugepages the plan has already promised, per (host, node, page size kB), across its VMs."""

    pages: dict[tuple[str, int | None, int], int] = field(default_factory=dict)
    #: bytes of pool space promised to the plan's linked clones, per (host, pool)
    pool_bytes: dict[tuple[str, str], int] = field(default_factory=dict)


def _names(items: object) -> str:
    names = sorted(str(i) for i in items)  # type: ignore[attr-defined]
    return ", ".join(names) if names else "none"


def problems_of(hs: HostState, vm: str, dom: Domain, disk: object, ledger: Ledger) -> list[str]:
    """The problems that would make VM ``vm``'s domain ``dom`` fail to define or start on ``hs``; [] when none.
    The plan prefixes each with host and VM, grouping the VMs that share one."""
    return [*_libvirt(hs, vm, dom, disk, ledger), *_hugepages(hs, dom, ledger), *_cpus(hs, dom)]


def _bridges(ifaces: dict[str, str]) -> str:
    return _names(n for n, kind in ifaces.items() if kind == "bridge")


def _libvirt(hs: HostState, vm: str, dom: Domain, disk: object, ledger: Ledger) -> list[str]:
    facts = hs.libvirt
    if facts is None:
        return []
    out: list[str] = []
    for src in dom.root.iterfind("devices/interface[@type='network']/source"):
        net = src.get("network", "")
        if net not in facts.networks:
            out.append(f"libvirt network '{net}' does not exist (networks: {_names(facts.networks)}; "
                       "choose one with --network NAME or a host bridge with --bridge NAME)")
        elif not facts.networks[net]:
            out.append(f"libvirt network '{net}' is not active (virsh net-start {net})")
    if facts.interfaces is not None:
        for src in dom.root.iterfind("devices/interface[@type='bridge']/source"):
            br = src.get("bridge", "")
            kind = facts.interfaces.get(br)
            if kind is None:
                out.append(f"host bridge '{br}' does not exist (bridges: {_bridges(facts.interfaces)})")
            elif kind != "bridge":
                out.append(f"host interface '{br}' is not a bridge but {kind or 'of unknown type'} "
                           f"(bridges: {_bridges(facts.interfaces)})")
    if isinstance(disk, ClonedDisk):
        pool = facts.pools.get(disk.pool)
        if pool is None:
            out.append(f"storage pool '{disk.pool}' does not exist (pools: {_names(facts.pools)})")
        elif not pool.active:
            out.append(f"storage pool '{disk.pool}' is not active (virsh pool-start {disk.pool})")
        else:
            out += _pool_space(hs.name, pool, disk, vm, ledger)
        if disk.golden not in facts.volume_paths():
            out.append(f"golden image {disk.golden} is not a volume of any active storage pool (put it in a "
                       "pool's directory; the pools are rescanned when planning)")
    else:
        for src in dom.root.iterfind("devices/disk[@device='disk']/source"):
            path = src.get("file")
            if not path:
                continue
            for p in facts.pools.values():
                if p.active and p.target and posixpath.dirname(path) == p.target.rstrip("/") \
                        and path not in p.volumes.values():
                    out.append(f"disk {path} does not exist (it is not a volume of pool '{p.name}', whose "
                               f"directory {p.target} holds it; create it, or give each VM a linked clone: "
                               "--clone GOLDEN --pool POOL)")
    out += _firmware(hs, dom)
    return out


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def _pool_space(host: str, pool: PoolFacts, disk: ClonedDisk, vm: str, ledger: Ledger) -> list[str]:
    # A clone an earlier (cut) run already made is adopted, not made again: it takes no more room.
    if pool.available_bytes is None or disk.volume_name(vm) in pool.volumes:
        return []
    key = (host, pool.name)
    need = disk.reserve_gib * 1024**3
    if need == 0:
        return []
    taken = ledger.pool_bytes.get(key, 0)
    ledger.pool_bytes[key] = taken + need
    if taken + need <= pool.available_bytes:
        return []
    return [f"storage pool '{pool.name}' has {_gib(pool.available_bytes)} free, and each linked clone reserves "
            f"{disk.reserve_gib} GiB (ClonedDisk reserve_gib): {taken // need} already promised to this plan's "
            "other VMs (free space in the pool's directory, or another --pool)"]


def _firmware(hs: HostState, dom: Domain) -> list[str]:
    caps = hs.libvirt.firmware if hs.libvirt is not None else None
    if caps is None:
        return []
    out: list[str] = []
    secure = dom.root.find("os/firmware/feature[@name='secure-boot'][@enabled='yes']")
    if secure is not None and caps.secure_boot is False:
        out.append("secure boot: libvirt offers no secure-boot capable UEFI loader here (install OVMF with "
                   "secure boot, Debian's ovmf package; or drop --secure-boot)")
    if caps.tpm_backends is not None:
        for backend in dom.root.iterfind("devices/tpm/backend"):
            backend_type = backend.get("type", "")
            if backend_type not in caps.tpm_backends:
                out.append(f"TPM backend '{backend_type}' is not one libvirt can give here (offered: "
                           f"{_names(caps.tpm_backends)}; the emulator needs swtpm installed)")
    fw = dom.root.find("os")
    kind = fw.get("firmware") if fw is not None else None
    if kind and kind not in caps.firmwares:
        out.append(f"firmware '{kind}' cannot be selected by libvirt here (domain capabilities offer: "
                   f"{_names(caps.firmwares)}; install OVMF for efi)")
    loader = dom.root.findtext("os/loader")
    if loader and loader.strip() not in caps.loaders:
        out.append(f"firmware loader {loader.strip()} is not one libvirt knows here "
                   f"(domain capabilities list: {_names(caps.loaders)})")
    return out


def _page_kb(dom: Domain, default: int) -> int:
    page = dom.root.find("memoryBacking/hugepages/page")
    if page is None or not (page.get("size") or "").isdigit():
        return default
    return int(int(page.get("size", "0")) * _UNITS_KB.get(page.get("unit", "KiB").lower(), 1))


def _strict_node(dom: Domain) -> int | None:
    mem = dom.root.find("numatune/memory")
    nodeset = mem.get("nodeset", "") if mem is not None else ""
    if mem is None or mem.get("mode", "strict") not in ("strict", "restrictive") or not nodeset.isdigit():
        return None
    return int(nodeset)


def _hugepages(hs: HostState, dom: Domain, ledger: Ledger) -> list[str]:
    res = hs.resources
    if dom.root.find("memoryBacking/hugepages") is None or not res.free_pages:
        return []
    size = _page_kb(dom, res.default_page_kb)
    node = _strict_node(dom)
    need = -(-(dom.memory_mib or 0) * 1024 // size)
    label = f"{size // 1024} MiB" if size < 1024**2 else f"{size // 1024**2} GiB"
    free = res.free(size, node)
    on = f"on NUMA node {node}" if node is not None else "on the host"
    if free is None:
        return [f"needs {need} hugepages of {label} {on}, and the host has no {label} pool "
                f"(sizes: {', '.join(f'{s} kB' for s in res.page_sizes) or 'none'})"]
    key = (hs.name, node, size)
    taken = ledger.pages.get(key, 0)
    ledger.pages[key] = taken + need
    if taken + need > free:
        more = f", {taken} of them promised to other VMs of this plan" if taken else ""
        return [f"needs {need} free hugepages of {label} {on}; {free} free{more} "
                f"(reserve more: /sys/kernel/mm/hugepages/hugepages-{size}kB/nr_hugepages)"]
    return []


def _cpus(hs: HostState, dom: Domain) -> list[str]:
    online = hs.resources.online_cpus
    pins = dom.cpu_pinning()
    if online is None or pins is None:
        return []
    missing = pins.all_cpus - online
    if not missing:
        return []
    return [f"CPU pinning names CPU(s) {format_cpulist(missing)} that this host does not have online "
            f"(online: {format_cpulist(online)})"]


def one_disk_each(requests: Sequence[VmRequest]) -> None:
    """Two VMs on one disk file corrupt it: refuse a path (after ``{name}``) that several VMs would share."""
    seen: dict[str, str] = {}
    for vm in requests:
        if isinstance(vm.disk, str):
            path = expand(vm.disk, vm.name)
            if path in seen:
                raise InvalidSpec("disk", vm.disk, f"one disk per VM ({seen[path]} and {vm.name} would share {path}): "
                                                   "put {name} in the path, or use a ClonedDisk")
            seen[path] = vm.name


def pool_dir(vm: VmRequest, h: HostState) -> str | None:
    if not isinstance(vm.disk, ClonedDisk) or h.libvirt is None:
        return None
    pool = h.libvirt.pools.get(vm.disk.pool)
    # A missing pool is the pre-flight's to report; the XML still needs a path meanwhile.
    return pool.target if pool is not None and pool.target else f"/nonexistent-pool/{vm.disk.pool}"
