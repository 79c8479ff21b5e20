"""The simulated host's state and the kernel/driver semantics that change it.

Every front-end (SimHost, a materialized tree, the FUSE mount, the emulated tools) reads and
mutates a :class:`SimModel`; the sysfs view (:mod:`vgpuvirt.sim.fs`) is computed from it. Each
operation fails with the errno the kernel or driver would return (``OSError``), changes nothing
on failure, and bumps :attr:`SimModel.version` on success. The objects live in
:mod:`.devices`; the model's sections: state and vGPU capacity, mdevs, then driver binding, SR-IOV and the
NVIDIA GPU-wide switches (their geometry rules in :mod:`.mig_rules`).
"""

from __future__ import annotations

import errno
import threading
import uuid as _uuid
from dataclasses import replace

from vgpuvirt.sim import kstrto
from vgpuvirt.sim import mig_rules as R
from vgpuvirt.sim.devices import Dev, Gpu, Mdev, uuid_is_valid
from vgpuvirt.sim.kstrto import oserror
from vgpuvirt.sim.profiles import Profile, ProfileError, TypeTable, VgpuType, vf_address
from vgpuvirt.sim.scheduler import SimScheduler
from vgpuvirt.sim.telemetry import SimTelemetry

__all__ = ["Dev", "Gpu", "Mdev", "SimModel", "uuid_is_valid"]

# Drivers that implement sriov_configure in this simulation: a PF's own driver, and vfio-pci.
_ALWAYS_LOADED = ("vfio-pci", "pci-stub", "pcieport")


def _busy_for_reset(core: SimModel, gpu: Gpu) -> bool:
    vfs = [d for d in core.devices.values() if d.physfn == gpu.pf]
    return gpu.processes > 0 or any(d.driver == "vfio-pci" for d in vfs)


class SimModel:
    """State of one simulated host. Thread-safe: callers hold :attr:`lock` around compound work."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.lock = threading.RLock()
        self.version = 0
        self.iommu = profile.iommu
        self.boot_id = str(_uuid.uuid4())
        self.boots = 0
        # What nvidia-smi reports for the whole host: the vGPU manager's version and the GPUs' ECC mode
        # (a migration needs both equal on the two hosts; tests change them to make the two differ).
        self.driver_version = profile.driver_version
        self.ecc_enabled = True
        self.vgpu_migration = True        # NVML's migration capability bit (a vGPU manager with migration off: False)
        # the vGPU manager package installed on disk (``sim install-driver``); the driver loads it at the next
        # reboot, as a real host loads a new vGPU manager only once the old module is unloaded. None: the loaded one
        self.installed_driver: str | None = None
        # vgpuvirt's own state on the host (/var/lib/vgpuvirt: the cordon mark); on disk, so a reboot keeps it
        self.state_files: dict[str, str] = {}
        self._build(boot=False)
        self.version = 0

    def _build(self, *, boot: bool) -> None:
        """The host's state from its profile. ``boot``: as the kernel and driver come up (no VFs, no vGPUs,
        no MIG instances; what persists across a reboot is carried by :meth:`reboot`), else the profile's
        snapshot (VFs, GPU instances and vGPUs as the profile lists them)."""
        profile = self.profile
        self.devices: dict[str, Dev] = {}
        self.mdevs: dict[str, Mdev] = {}
        self.drivers: set[str] = set(_ALWAYS_LOADED) | set(profile.drivers)
        self.dynids: dict[str, set[tuple[int, int]]] = {}
        self.hugepages: dict[int, dict[int, int]] = {n.id: dict(n.hugepages) for n in profile.nodes}
        self.overcommit: dict[int, int] = {2048: 0, 1048576: 0}
        self.gpus: dict[str, Gpu] = {}
        self.sched = SimScheduler(self)        # the vGPU scheduler (NVML and the RmPVMRL registry key)
        self._gvt_next = 1
        self._vg_cache: dict[str, list[tuple[VgpuType, int | None]]] = {}
        self._vg_version = -1
        self._mp_index: dict[str, list[Mdev]] = {}
        self._mp_key = (-1, -1)
        # utilisation over time and injected faults, as the emulated nvidia-smi / dmesg report them
        self.telemetry = SimTelemetry()
        self.telemetry.profile = profile.name
        dirs: dict[str, str] = {}
        for spec in profile.devices:
            a = str(spec.address)
            if spec.parent is None:
                base = f"/sys/devices/pci{spec.address.domain:04x}:{spec.address.bus:02x}"
            else:
                base = dirs[str(spec.parent)]
            dirs[a] = f"{base}/{a}"
            if spec.driver:
                self.drivers.add(spec.driver)
            if spec.sriov and spec.sriov.vf_driver:
                self.drivers.add(spec.sriov.vf_driver)
            dev = Dev(addr=a, spec=spec, sysfs_dir=dirs[a], driver=spec.driver, numa_node=spec.numa_node,
                      group=spec.iommu_group if self.iommu else None, reset_method=spec.reset_method)
            if spec.vgpu is not None:
                g = Gpu(a, spec.vgpu, heterogeneous=spec.vgpu.heterogeneous and not boot,
                        mig_enabled=spec.vgpu.mig_enabled)
                if not boot:
                    self._place_initial_gis(g, f"devices[{a}].vgpu.mig.instances")
                self.gpus[a] = g
                dev.gpu = g
                self.drivers.add(spec.vgpu.table.driver)
            self.devices[a] = dev
        if boot:
            return
        for dev in list(self.devices.values()):
            if dev.spec.sriov and dev.spec.sriov.numvfs:
                self._enable_vfs(dev, dev.spec.sriov.numvfs)
        self._initial_vgpus()

    def _place_initial_gis(self, g: Gpu, key: str) -> None:
        """The profile's GPU instances, each at the placement its id names in the slice tree when that is
        free, else where the driver would put it (a profile gives ids, not placements)."""
        by_name = {p.name: p for p in g.table.mig_profiles}
        for gi in sorted(g.spec.gpu_instances, key=lambda x: x.id):
            prof = by_name[gi.profile]
            table = g.gi_table()
            size = R.memory_size(g.table, prof)
            start = next((s for s in R.placements(g.table, prof)
                          if R.gi_node_id(g.table, s, size) == gi.id and R.fits_at(g.table, table, prof, s)), None)
            if start is None:
                start = R.choose_start(g.table, table, prof)
            if start is None:
                raise ProfileError(self.profile.source, key, f"GPU instance {gi.id} ({gi.profile}) has no free "
                                                             "placement next to the others")
            g.gpu_instances[gi.id] = gi.profile
            g.gi_start[gi.id] = start

    def reboot(self) -> None:
        """The host restarts: VFs, vGPU 17+ VF types, MIG instances and every mdev vanish (mdevctl's
        definitions live in /etc, outside the simulator, and nothing here starts them); drivers, overrides,
        new_ids, hugepages and heterogeneous mode are back to the profile's boot state. MIG mode persists
        (A100/H100/A30 keep it in the GPU), and a pending mode becomes current; /etc (modprobe.d) stays and the
        driver loads with its options."""
        with self.lock:
            mig = {a: g.mig_enabled if g.mig_pending is None else g.mig_pending for a, g in self.gpus.items()}
            version = self.version
            sched, telemetry = self.sched, self.telemetry
            self._build(boot=True)
            for a, on in mig.items():
                self.gpus[a].mig_enabled = on
            # /etc/modprobe.d stays and the driver loads with its options (NVML's scheduler changes are gone);
            # injected faults stand for the hardware and stay too
            self.sched, self.telemetry = sched, telemetry
            sched.reload_driver()
            if self.installed_driver:
                self.driver_version = self.installed_driver
            self.boot_id = str(_uuid.uuid4())
            self.boots += 1
            # version only grows: caches (the vGPU cache, the FUSE server's) key on it
            self.version = max(self.version, version) + 1

    # ------------------------------------------------------------------ helpers

    def bump(self) -> None:
        self.version += 1

    def dev(self, addr: str) -> Dev:
        d = self.devices.get(addr)
        if d is None:
            raise oserror(errno.ENODEV)
        return d

    def vfs(self, pf: Dev) -> list[Dev]:
        return [d for d in self.devices.values() if d.physfn == pf.addr]

    def groups(self) -> dict[int, list[str]]:
        """IOMMU group number -> member names (PCI addresses and mdev UUIDs)."""
        out: dict[int, list[str]] = {}
        for d in self.devices.values():
            if d.group is not None:
                out.setdefault(d.group, []).append(d.addr)
        for m in self.mdevs.values():
            out.setdefault(m.group, []).append(m.uuid)
        return out

    def _alloc_group(self) -> int:
        # iommu_group_alloc() takes the lowest free id from one IDA shared by all groups.
        used = set(self.groups())
        used.update(d.spec.iommu_group for d in self.devices.values() if d.spec.iommu_group is not None)
        n = 0
        while n in used:
            n += 1
        return n

    # ------------------------------------------------------------------ vGPU views

    def mdev_table(self, dev: Dev) -> TypeTable | None:
        """The mdev types a device offers as a registered mdev parent, or None."""
        gpu = dev.gpu
        if gpu is None or dev.driver != gpu.table.driver:
            return None
        mode = gpu.spec.mode
        if mode in ("mdev", "gvtg") and dev.physfn is None:
            return gpu.table
        if mode == "mdev-sriov" and dev.physfn is not None:
            return gpu.table
        return None

    def is_vendor_vf(self, dev: Dev) -> bool:
        gpu = dev.gpu
        return (gpu is not None and gpu.spec.mode == "vendor" and dev.physfn is not None
                and dev.driver == gpu.table.driver)

    def mdev_parents(self) -> list[Dev]:
        return [d for d in self.devices.values() if self.mdev_table(d) is not None]

    def mdevs_of(self, parent: str) -> list[Mdev]:
        # indexed once per model version (and count): a read of a host asks it for every type of every VF, and
        # each call scanned every mdev
        key = (self.version, len(self.mdevs))
        if self._mp_key != key:
            by: dict[str, list[Mdev]] = {}
            for m in self.mdevs.values():
                by.setdefault(m.parent, []).append(m)
            self._mp_index, self._mp_key = by, key
        return list(self._mp_index.get(parent, ()))

    def _gpu_vgpus(self, gpu: Gpu) -> list[tuple[VgpuType, int | None]]:
        """(type, GI) of every vGPU on one physical GPU: mdevs on the PF/VFs plus vendor-mode VFs."""
        # Cached per model version: a full read asks this once per type per VF.
        if self._vg_version != self.version:
            self._vg_cache = {}
            self._vg_version = self.version
        hit = self._vg_cache.get(gpu.pf)
        if hit is None:
            hit = self._vg_cache[gpu.pf] = self._compute_gpu_vgpus(gpu)
        return hit

    def _compute_gpu_vgpus(self, gpu: Gpu) -> list[tuple[VgpuType, int | None]]:
        members = {gpu.pf} | {d.addr for d in self.devices.values() if d.physfn == gpu.pf}
        out: list[tuple[VgpuType, int | None]] = [(m.type, m.gi) for m in self.mdevs.values() if m.parent in members]
        for a in members:
            d = self.devices[a]
            if d.vendor_type:
                t = gpu.table.by_number(d.vendor_type)
                if t is not None:
                    out.append((t, d.vendor_gi))
        return out

    def gpu_has_vgpus(self, gpu: Gpu) -> bool:
        return bool(self._gpu_vgpus(gpu))

    def _free_gi(self, gpu: Gpu, profile: str) -> int | None:
        used = {gi for _, gi in self._gpu_vgpus(gpu) if gi is not None}
        for gi, prof in sorted(gpu.gpu_instances.items()):
            if prof == profile and gi not in used:
                return gi
        return None

    def available(self, dev: Dev, t: VgpuType) -> int:
        """available_instances of type ``t`` on ``dev`` (an mdev parent or a vendor-mode VF)."""
        gpu = dev.gpu
        if gpu is None:
            return 0
        if gpu.spec.mode == "gvtg":
            return self._gvt_available(dev, t)
        if dev.physfn is not None and (self.mdevs_of(dev.addr) or dev.vendor_type):
            return 0
        existing = self._gpu_vgpus(gpu)
        if t.mig_profile is not None:
            if not gpu.mig_enabled:
                return 0
            used = {gi for _, gi in existing if gi is not None}
            n = sum(1 for gi, p in gpu.gpu_instances.items() if p == t.mig_profile and gi not in used)
        elif gpu.mig_enabled:
            n = 0
        elif not gpu.heterogeneous:
            # Equal-size mode: every vGPU on a physical GPU has the same framebuffer size.
            if any(e.framebuffer_mib != t.framebuffer_mib for e, _ in existing):
                return 0
            n = t.max_instance - len(existing)
        else:
            used_fb = sum(e.framebuffer_mib for e, _ in existing)
            same = sum(1 for e, _ in existing if e.sysfs_id == t.sysfs_id)
            n = min(t.max_instance - same, (gpu.table.framebuffer_mib - used_fb) // t.framebuffer_mib)
        if dev.physfn is not None:
            n = min(n, 1)
        return max(0, n)

    def _gvt_available(self, dev: Dev, t: VgpuType) -> int:
        assert dev.gpu is not None
        pool = dev.gpu.spec.pool
        low, high, fences = pool["low_gm"], pool["high_gm"], pool["fences"]
        for m in self.mdevs_of(dev.addr):
            low -= m.type.low_gm
            high -= m.type.high_gm
            fences -= m.type.fence
        return max(0, min(low // t.low_gm, high // t.high_gm, fences // t.fence))

    def creatable(self, vf: Dev) -> list[VgpuType]:
        assert vf.gpu is not None
        return [t for t in vf.gpu.table.types if self.available(vf, t) > 0]

    # ------------------------------------------------------------------ mdev create/remove

    def create_mdev(self, parent: Dev, t: VgpuType, raw: str) -> str:
        """``echo UUID > <parent>/mdev_supported_types/<t>/create`` (mdev_sysfs.c create_store)."""
        n = len(raw.encode("utf-8"))
        if n < 36 or n > 37 or not uuid_is_valid(raw):
            raise oserror(errno.EINVAL)
        uuid = raw[:36].lower()
        if uuid in self.mdevs:
            raise oserror(errno.EEXIST)
        table = self.mdev_table(parent)
        if table is None:
            raise oserror(errno.ENODEV)
        if self.available(parent, t) < 1:
            raise oserror(table.create_errno)
        gi = None
        if t.mig_profile is not None:
            assert parent.gpu is not None
            gi = self._free_gi(parent.gpu, t.mig_profile)
        m = Mdev(uuid=uuid, parent=parent.addr, type=t, group=self._alloc_group(), gi=gi)
        if table.driver == "i915":
            m.gvt_id = self._gvt_next
            self._gvt_next += 1
        self.mdevs[uuid] = m
        self.bump()
        return uuid

    def remove_mdev(self, uuid: str, raw: str) -> None:
        """``echo 1 > /sys/bus/mdev/devices/<uuid>/remove`` (remove_store: kstrtoul, 0 is a no-op)."""
        if kstrto.kstrtoul(raw, 0) == 0:
            return
        if uuid not in self.mdevs:
            raise oserror(errno.ENODEV)
        del self.mdevs[uuid]
        self.bump()

    # ------------------------------------------------------------------ NVIDIA vGPU 17+ (vendor VFs)

    def set_vendor_type(self, vf: Dev, raw: str) -> None:
        """``nvidia/current_vgpu_type`` store: kstrtol base 10; 0 destroys; N creates."""
        value = kstrto.kstrtol(raw, 10)
        assert vf.gpu is not None
        if value == 0:
            if not vf.vendor_type:
                raise oserror(errno.EPERM)     # "Failed to remove vGPU. No vGPU exists on current device"
            vf.vendor_type = 0
            vf.vendor_gi = None
            self.bump()
            return
        if vf.vendor_type:
            raise oserror(errno.EPERM)         # "vGPU device already created with type ID: %d"
        t = vf.gpu.table.by_number(value)
        if t is None or self.available(vf, t) < 1:
            raise oserror(errno.EIO)           # RM refuses the create request
        vf.vendor_gi = self._free_gi(vf.gpu, t.mig_profile) if t.mig_profile else None
        vf.vendor_type = value
        self.bump()

    # ------------------------------------------------------------------ hugepages

    def set_hugepages(self, size_kb: int, node: int | None, raw: str) -> None:
        n = kstrto.kstrtoul(raw, 0)
        if size_kb not in self.overcommit:
            raise oserror(errno.EINVAL)
        if node is None:
            nodes = sorted(self.hugepages)
            for i, nid in enumerate(nodes):
                self.hugepages[nid][size_kb] = n // len(nodes) + (1 if i < n % len(nodes) else 0)
        else:
            self.hugepages[node][size_kb] = n
        self.bump()

    # ------------------------------------------------------------------ profile's initial vGPUs

    def _initial_vgpus(self) -> None:
        for dev in list(self.devices.values()):
            if dev.physfn is not None or dev.gpu is None:
                continue
            spec = dev.gpu.spec
            for i, v in enumerate(spec.vgpus):
                key = f"devices[{dev.addr}].vgpu.vgpus[{i}]"
                target = dev if v.vf is None else next((d for d in self.vfs(dev) if d.vf_index == v.vf), None)
                if target is None:
                    raise ProfileError(self.profile.source, key, f"VF {v.vf} is not enabled")
                try:
                    if spec.mode == "vendor":
                        self.set_vendor_type(target, v.type)
                    else:
                        t = spec.table.get(v.type)
                        if t is None:
                            raise ProfileError(self.profile.source, key, f"unknown type {v.type!r}")
                        uid = v.uuid or str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"vgpuvirt-sim:{dev.addr}:{i}"))
                        self.create_mdev(target, t, uid)
                except OSError as exc:
                    raise ProfileError(self.profile.source, key,
                                       f"the simulated kernel refused it: {exc.strerror}") from None

    # -- driver binding as ``/sys/bus/pci/drivers/*`` and ``drivers_probe`` do it -----------------------------------
    def _matches(self, drv: str, dev: Dev) -> bool:
        if dev.override is not None:
            return drv == dev.override
        if drv == dev.native_driver:
            return True
        return (dev.spec.vendor, self.device_id(dev)) in self.dynids.get(drv, set())

    def device_id(self, dev: Dev) -> int:
        if dev.physfn is not None and dev.spec.sriov is not None:
            return dev.spec.sriov.vf_device
        return dev.spec.device

    def _attach(self, drv: str, dev: Dev) -> None:
        dev.driver = drv
        dev.vendor_type = 0
        dev.vendor_gi = None
        self.bump()

    def _detach(self, dev: Dev) -> None:
        # The driver's remove(): an mdev parent unregisters (its mdevs go), a PF disables its VFs.
        for m in self.mdevs_of(dev.addr):
            del self.mdevs[m.uuid]
        if dev.numvfs:
            self._disable_vfs(dev)
        dev.driver = None
        dev.vendor_type = 0
        dev.vendor_gi = None
        self.bump()

    def bind(self, drv: str, raw: str) -> None:
        """``/sys/bus/pci/drivers/<drv>/bind`` (bus.c bind_store)."""
        dev = self.devices.get(kstrto.sysfs_streq(raw))
        if dev is None or not self._matches(drv, dev):
            raise oserror(errno.ENODEV)
        if dev.driver is not None:
            raise oserror(errno.EBUSY)
        self._attach(drv, dev)

    def unbind(self, drv: str, raw: str) -> None:
        dev = self.devices.get(kstrto.sysfs_streq(raw))
        if dev is None or dev.driver != drv:
            raise oserror(errno.ENODEV)
        self._detach(dev)

    def probe(self, raw: str) -> None:
        """``/sys/bus/pci/drivers_probe``: attach the first matching loaded driver; none is not an error."""
        dev = self.devices.get(kstrto.sysfs_streq(raw))
        if dev is None:
            raise oserror(errno.ENODEV)
        if dev.driver is not None:
            return
        candidates = [dev.override] if dev.override is not None else [dev.native_driver, *sorted(self.dynids)]
        for drv in candidates:
            if drv is not None and drv in self.drivers and self._matches(drv, dev):
                self._attach(drv, dev)
                return

    def set_override(self, dev: Dev, raw: str) -> None:
        """driver_set_override(): cut at the first newline; empty clears; the device is not rebound."""
        if len(raw.encode("utf-8")) >= 4095:
            raise oserror(errno.EINVAL)
        value = raw.split("\n", 1)[0]
        dev.override = value or None
        self.bump()

    def new_id(self, drv: str, raw: str) -> None:
        """``new_id``: "vendor device [...]" in hex; then the driver attaches to matching unbound devices."""
        fields = raw.split()
        try:
            vendor, device = int(fields[0], 16), int(fields[1], 16)
        except (IndexError, ValueError):
            raise oserror(errno.EINVAL) from None
        self.dynids.setdefault(drv, set()).add((vendor, device))
        self.bump()
        for dev in self.devices.values():
            if dev.driver is None and self._matches(drv, dev):
                self._attach(drv, dev)

    def remove_id(self, drv: str, raw: str) -> None:
        fields = raw.split()
        try:
            key = (int(fields[0], 16), int(fields[1], 16))
        except (IndexError, ValueError):
            raise oserror(errno.EINVAL) from None
        ids = self.dynids.get(drv, set())
        if key not in ids:
            raise oserror(errno.ENODEV)
        ids.discard(key)
        self.bump()

    # -- SR-IOV: VF enable/disable in the kernel's order of checks --------------------------------------------------
    def set_numvfs(self, pf: Dev, raw: str) -> None:
        """sriov_numvfs_store (drivers/pci/iov.c), in the kernel's order of checks."""
        n = kstrto.kstrtou16(raw, 0)
        assert pf.spec.sriov is not None
        if n > pf.spec.sriov.totalvfs:
            raise oserror(errno.ERANGE)
        if n == pf.numvfs:
            return
        if pf.driver is None:
            raise oserror(errno.ENOENT)        # "no driver bound to device; cannot configure SR-IOV"
        if pf.driver not in (pf.spec.driver, "vfio-pci"):
            raise oserror(errno.ENOENT)        # "driver does not support SR-IOV configuration via sysfs"
        if n == 0:
            if pf.gpu is not None and pf.gpu.table.driver == "nvidia" and self.gpu_has_vgpus(pf.gpu):
                raise oserror(errno.EBUSY)     # INFERRED: the NVIDIA driver refuses while vGPUs exist
            self._disable_vfs(pf)
            return
        if pf.numvfs:
            raise oserror(errno.EBUSY)         # "%d VFs already enabled. Disable before enabling %d VFs"
        self._enable_vfs(pf, n)

    def _enable_vfs(self, pf: Dev, n: int) -> None:
        sriov = pf.spec.sriov
        assert sriov is not None
        parent_dir = pf.sysfs_dir.rsplit("/", 1)[0]
        for i in range(n):
            a = vf_address(pf.spec.address, sriov, i)
            vspec = replace(pf.spec, address=a, device=sriov.vf_device,
                            pci_class=sriov.vf_class if sriov.vf_class is not None else pf.spec.pci_class,
                            sriov=sriov, vgpu=None, iommu_group=None, boot_vga=False,
                            reset_method="flr" if pf.spec.reset_method else "")
            vf = Dev(addr=str(a), spec=vspec, sysfs_dir=f"{parent_dir}/{a}", driver=None, numa_node=pf.numa_node,
                     group=None, reset_method=vspec.reset_method, physfn=pf.addr, vf_index=i, gpu=pf.gpu)
            if self.iommu:
                vf.group = self._alloc_group()
            self.devices[vf.addr] = vf
            if pf.autoprobe and sriov.vf_driver and sriov.vf_driver in self.drivers:
                vf.driver = sriov.vf_driver
        pf.numvfs = n
        self.devices = dict(sorted(self.devices.items()))
        self.bump()

    def _disable_vfs(self, pf: Dev) -> None:
        for vf in self.vfs(pf):
            for m in self.mdevs_of(vf.addr):
                del self.mdevs[m.uuid]
            del self.devices[vf.addr]
        pf.numvfs = 0
        self.bump()

    # -- NVIDIA GPU-wide switches: what ``nvidia-smi`` changes on one physical GPU ---------------------------------
    def set_heterogeneous(self, gpu: Gpu, on: bool) -> None:
        if on and not gpu.table.heterogeneous:
            raise oserror(errno.EOPNOTSUPP)
        if self.gpu_has_vgpus(gpu) or gpu.mig_enabled:
            raise oserror(errno.EBUSY)
        gpu.heterogeneous = on
        self.bump()

    def set_mig(self, gpu: Gpu, on: bool) -> bool:
        """Set MIG mode; True when it is only pending (a reset or reboot makes it current)."""
        if not gpu.table.mig_profiles:
            raise oserror(errno.EOPNOTSUPP)
        if self.gpu_has_vgpus(gpu) or (not on and gpu.gpu_instances):
            raise oserror(errno.EBUSY)
        if on == gpu.mig_enabled:
            gpu.mig_pending = None
        elif gpu.table.mig_reset and _busy_for_reset(self, gpu):
            gpu.mig_pending = on
        else:
            gpu.mig_enabled = on
            gpu.mig_pending = None
        self.bump()
        return gpu.mig_pending is not None

    def reset_gpu(self, gpu: Gpu) -> None:
        """``nvidia-smi -r``: refused while anything uses the GPU; a pending MIG mode becomes current."""
        if self.gpu_has_vgpus(gpu) or _busy_for_reset(self, gpu) or gpu.gpu_instances:
            raise oserror(errno.EBUSY)
        if gpu.mig_pending is not None:
            gpu.mig_enabled = gpu.mig_pending
            gpu.mig_pending = None
        self.bump()

    def create_gi(self, gpu: Gpu, profile_id: int, start: int | None = None) -> int:
        prof = next((p for p in gpu.table.mig_profiles if p.id == profile_id), None)
        if prof is None:
            raise oserror(errno.EINVAL)
        if not gpu.mig_enabled:
            raise oserror(errno.EOPNOTSUPP)
        gis = gpu.gi_table()
        if start is None:
            start = R.choose_start(gpu.table, gis, prof)
        elif start not in R.placements(gpu.table, prof):
            raise oserror(errno.EINVAL)
        if start is None or not R.fits_at(gpu.table, gis, prof, start):
            raise oserror(errno.ENOSPC)
        gi = R.new_gi_id(gpu.table, gis, prof, start)
        gpu.gpu_instances[gi] = prof.name
        gpu.gi_start[gi] = start
        self.bump()
        return gi

    def destroy_gi(self, gpu: Gpu, gi: int) -> None:
        if gi not in gpu.gpu_instances:
            raise oserror(errno.ENOENT)
        if gpu.compute_instances.get(gi) or any(g == gi for _, g in self._gpu_vgpus(gpu)):
            raise oserror(errno.EBUSY)
        del gpu.gpu_instances[gi]
        gpu.gi_start.pop(gi, None)
        gpu.compute_instances.pop(gi, None)
        self.bump()

    def create_ci(self, gpu: Gpu, gi: int, key: str) -> tuple[int, int, str]:
        """A compute instance in GI ``gi`` from a ``-cci`` item; (CI id, CI profile id, its name)."""
        if gi not in gpu.gpu_instances:
            raise oserror(errno.ENOENT)
        name = gpu.gpu_instances[gi]
        slices = next(p.slices for p in gpu.table.mig_profiles if p.name == name)
        k = R.ci_size_of(name, slices, key)
        if k is None:
            raise oserror(errno.EINVAL)
        cis = gpu.compute_instances.setdefault(gi, {})
        start = R.ci_choose_start(slices, cis, k)
        if start is None:
            raise oserror(errno.ENOSPC)
        ci = 0
        while ci in cis:
            ci += 1
        cis[ci] = (k, start)
        self.bump()
        return ci, R.CI_PROFILE_IDS[k], R.ci_name(name, slices, k)

    def destroy_ci(self, gpu: Gpu, gi: int, ci: int) -> None:
        if gi not in gpu.gpu_instances or ci not in gpu.compute_instances.get(gi, {}):
            raise oserror(errno.ENOENT)
        del gpu.compute_instances[gi][ci]
        self.bump()
