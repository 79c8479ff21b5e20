"""The simulated host's state and the kernel/driver semantics that change it.

Every front-end (SimHost, a materialized tree, the FUSE mount, the emulated tools) reads and
mutates a :class:`SimModel`; the sysfs view (:mod:`vgpuvirt.sim.fs`) is computed from it. Each
operation fails with the errno the kernel or driver would return (``OSError``), changes nothing
on failure, and bumps :attr:`SimModel.version` on success. The objects live in
:mod:`.devices`; driver binding, SR-IOV and the NVIDIA GPU-wide switches are mixins
(:mod:`.driver_binding`, :mod:`.sriov_vfs`, :mod:`.nvidia_switches`); vGPU capacity and mdevs stay here.
"""

from __future__ import annotations

import errno
import threading
import uuid as _uuid

from vgpuvirt.sim import kstrto
from vgpuvirt.sim.devices import Dev, Gpu, Mdev, uuid_is_valid
from vgpuvirt.sim.driver_binding import DriverBinding
from vgpuvirt.sim.kstrto import oserror
from vgpuvirt.sim.nvidia_switches import NvidiaSwitches
from vgpuvirt.sim.profiles import Profile, ProfileError, TypeTable, VgpuType
from vgpuvirt.sim.scheduler import SimScheduler
from vgpuvirt.sim.sriov_vfs import SriovVfs
from vgpuvirt.sim.telemetry import SimTelemetry

__all__ = ["Dev", "Gpu", "Mdev", "SimModel", "uuid_is_valid"]

# Drivers that implement sriov_configure in this simulation: a PF's own driver, and vfio-pci.
_ALWAYS_LOADED = ("vfio-pci", "pci-stub", "pcieport")


class SimModel(DriverBinding, SriovVfs, NvidiaSwitches):
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
        from vgpuvirt.sim import mig_rules as R
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
        return [m for m in self.mdevs.values() if m.parent == parent]

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
