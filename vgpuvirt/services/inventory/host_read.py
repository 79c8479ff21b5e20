"""Read a host: what a caller wants of it, in ONE round trip, returned as named results.

The inventory, the metrics collector, the layout verbs and the pool surveys all read the same things: the
sysfs snapshot of :data:`~.read.INVENTORY_GLOBS`, ``nvidia-smi -q -x``, the MIG tables, the kernel log, the
vGPU scheduler, NVML. :func:`read_host` asks for the :class:`Want` set a caller names in one ``host.apply`` (or
one ``host.read`` when only sysfs is wanted), and gives back a :class:`HostRead` whose fields name each answer,
so no caller indexes a batch by position. ``nvidia-smi -q -x`` is parsed once here
(:class:`~vgpuvirt.services.nvidia.report.SmiReport`) and that one parse feeds the inventory's facts and health and the
metrics' readings.

With a :class:`~vgpuvirt.services.nvidia.static.StaticFacts` (a caller that reads a host again and again: the exporter,
a pool), ``nvidia-smi --query-gpu`` rides along and gives the readings, while a kept ``-q -x`` that still describes the
GPUs replaces a fresh one (:mod:`~vgpuvirt.services.nvidia.static` says when it is read again, which is the only case
with a second round trip).

NVML (pynvml) describes the machine this process runs on, so it is read only for a host that is that machine
(:attr:`Host.is_local <vgpuvirt.host.base.Host.is_local>`) reading the real ``/``; it costs no round trip.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Host, Op, OpResult, Snapshot
from vgpuvirt.model import PciAddress
from vgpuvirt.services.cordon import CORDON_FILE
from vgpuvirt.services.inventory.build import SysfsCache, build_inventory
from vgpuvirt.services.inventory.health import HealthInputs, health_inputs
from vgpuvirt.services.inventory.host_resources import RESOURCE_GLOBS
from vgpuvirt.services.inventory.model import Inventory
from vgpuvirt.services.mig import state as mig
from vgpuvirt.services.nvidia.kernel_log import DMESG_ARGV
from vgpuvirt.services.nvidia.nvml import NvmlReport, load_pynvml
from vgpuvirt.services.nvidia.nvml_readings import NvmlMetrics, collect_nvml
from vgpuvirt.services.nvidia.query_gpu import QUERY_GPU_ARGV
from vgpuvirt.services.nvidia.readings import GpuReadings
from vgpuvirt.services.nvidia.report import SmiReport
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV
from vgpuvirt.services.nvidia.static import StaticFacts
from vgpuvirt.services.nvidia.vgpu_query import VGPU_QUERY_ARGV
from vgpuvirt.services.pci.sysfs import (
    IOMMU_CLASS,
    IOMMU_GROUPS,
    MDEV_BUS,
    MDEV_DEVICES,
    NVIDIA_VERSION,
    PCI,
    PROC_CMDLINE,
)
from vgpuvirt.services.scheduler import service as vgpu_scheduler

__all__ = ["INVENTORY_GLOBS", "MIG_TABLES", "NVIDIA_TOOLS", "HostRead", "Want", "read_host"]

_PCI_ATTRS = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class", "driver", "driver_override",
              "numa_node", "iommu_group", "reset_method", "local_cpulist", "boot_vga", "sriov_totalvfs",
              "sriov_numvfs", "sriov_offset", "sriov_stride", "physfn", "virtfn*", "nvidia/*")
#: What a vGPU type says about itself: fixed by the GPU and the driver, the same on every VF of one GPU.
_TYPE_STATIC = ("name", "description", "device_api")

#: Every pattern the inventory reads, in ONE host.read() (the agent expands them host-side).
#: A type's static attributes are read on each parent that is not a VF, and on ONE VF per PF (the
#: agent's ``{1?...}`` guard): on an 8 x 32-VF host that is 552 files instead of 17,664; the VFs' own
#: ``available_instances`` are all read, since they differ.
INVENTORY_GLOBS: tuple[str, ...] = (
    f"{PCI}/*",
    *(f"{PCI}/*/{a}" for a in _PCI_ATTRS),
    *(f"{PCI}/*/virtfn*{{1?mdev_supported_types}}/mdev_supported_types/*/{a}" for a in _TYPE_STATIC),
    f"{MDEV_BUS}/*",
    *(f"{MDEV_BUS}/*{{!physfn}}/mdev_supported_types/*/{a}" for a in _TYPE_STATIC),
    f"{MDEV_BUS}/*/mdev_supported_types/*/available_instances",
    f"{MDEV_DEVICES}/*",
    f"{MDEV_DEVICES}/*/mdev_type",
    f"{MDEV_DEVICES}/*/driver",
    f"{MDEV_DEVICES}/*/iommu_group",
    f"{MDEV_DEVICES}/*/nvidia/vgpu_params",
    IOMMU_GROUPS,             # the folder itself: present and empty (IOMMU off) differs from absent
    f"{IOMMU_GROUPS}/*/devices/*",
    f"{IOMMU_CLASS}/*",
    NVIDIA_VERSION,
    PROC_CMDLINE,
    *RESOURCE_GLOBS,          # CPUs and free hugepages: the plan's pre-flight
    CORDON_FILE,              # the host's cordon mark: every controller's placement skips a cordoned host
)


class Want(enum.Enum):
    """What a caller wants read (:func:`read_host`)."""

    SYSFS = "sysfs"                          # the snapshot of the caller's globs (default: the inventory's)
    NVIDIA_SMI = "nvidia-smi"                # nvidia-smi -q -x, parsed once
    MIG_GPU_INSTANCES = "mig -lgi"
    MIG_COMPUTE_INSTANCES = "mig -lci"
    MIG_GI_PROFILES = "mig -lgip"            # with the free count of each profile
    MIG_GI_PLACEMENTS = "mig -lgipp"
    VGPU_QUERY = "nvidia-smi vgpu -q"        # the active vGPUs with their VMs and utilisation
    KERNEL_LOG = "dmesg"                     # XIDs, the scheduler's boot message
    SCHEDULER = "vgpu scheduler"             # NVML's scheduler of every GPU, modprobe.d, the module's parameters
    NVML = "nvml"                            # NVML's facts per GPU (the inventory's), on this machine only
    NVML_READINGS = "nvml readings"          # NVML's readings per GPU (the metrics'), on this machine only
    #: The nvidia-smi programs (:data:`NVIDIA_TOOLS`) run only where NVML did not answer: NVML gives the same
    #: facts without a program (the inventory's default on this machine).
    TOOLS_ONLY_WITHOUT_NVML = "tools only without nvml"


#: The four MIG listings: the whole MIG state (``vgpuvirt mig show``, the layouts).
MIG_TABLES = frozenset({Want.MIG_GPU_INSTANCES, Want.MIG_COMPUTE_INSTANCES, Want.MIG_GI_PROFILES,
                        Want.MIG_GI_PLACEMENTS})
#: The wants that run ``nvidia-smi`` or ``dmesg`` on the host.
NVIDIA_TOOLS = frozenset({Want.NVIDIA_SMI, *MIG_TABLES, Want.VGPU_QUERY, Want.KERNEL_LOG})

#: The program of each want, in the order they run (the order every caller used before this module).
_PROGRAMS: tuple[tuple[Want, tuple[str, ...]], ...] = (
    (Want.NVIDIA_SMI, NVIDIA_SMI_ARGV),
    (Want.MIG_GPU_INSTANCES, mig.LGI_ARGV),
    (Want.MIG_COMPUTE_INSTANCES, mig.LCI_ARGV),
    (Want.MIG_GI_PROFILES, mig.LGIP_ARGV),
    (Want.MIG_GI_PLACEMENTS, mig.LGIPP_ARGV),
    (Want.VGPU_QUERY, VGPU_QUERY_ARGV),
    (Want.KERNEL_LOG, DMESG_ARGV),
)


@dataclass(frozen=True)
class HostRead:
    """The answers of one :func:`read_host`; a field is None (or empty) when it was not wanted or not run.

    ``readings``: ``--query-gpu``'s per-GPU readings when a :class:`StaticFacts` read answered (None: take
    them from ``smi``). ``health``: those readings (or ``smi``'s) and the parsed kernel log, parsed once and
    shared by the inventory's health and the metrics. ``scheduler``: the answers of
    :func:`vgpu_scheduler.read_ops` (with the snapshot, for :func:`vgpu_scheduler.parse_read`). ``round_trips``:
    how many this read took (1, or 2 when a kept ``-q -x`` turned out stale)."""

    host: str
    snapshot: Snapshot
    smi: SmiReport | None = None
    readings: dict[PciAddress, GpuReadings] | None = None
    mig_gpu_instances: OpResult | None = None
    mig_compute_instances: OpResult | None = None
    mig_gi_profiles: OpResult | None = None
    mig_gi_placements: OpResult | None = None
    vgpu_query: OpResult | None = None
    kernel_log: OpResult | None = None
    scheduler: tuple[OpResult, ...] = ()
    nvml: NvmlReport | None = None
    nvml_readings: NvmlMetrics | None = None
    health: HealthInputs = field(default_factory=HealthInputs)
    round_trips: int = 0

    def inventory(self, domains: Iterable[tuple[str, str]] | None = None,
                  cache: SysfsCache | None = None) -> Inventory:
        """The inventory of this read (:func:`~.build.build_inventory`, pure)."""
        return build_inventory(self.snapshot, host=self.host, domains=domains, nvidia_smi=self.smi,
                               nvml=self.nvml, mig_lgi=self.mig_gpu_instances, mig_lgip=self.mig_gi_profiles,
                               kernel_log=self.kernel_log, health=self.health, cache=cache)

    def mig_state(self) -> mig.MigState:
        """The MIG state from this read's ``-q -x`` and the four MIG listings (:func:`mig.build_mig_state`)."""
        return mig.build_mig_state(self.host, [self.smi.result if self.smi else None, self.mig_gpu_instances,
                                               self.mig_compute_instances, self.mig_gi_profiles,
                                               self.mig_gi_placements], parsed=self.smi)


def _nvml_module(host: Host, use_nvml: bool | None, module: Any) -> Any:
    """pynvml (or the caller's stand-in) where NVML may be read; None elsewhere. ``use_nvml``: None = when this
    is the machine we run on and pynvml is installed; True = required; False = never."""
    here = host.is_local and host.sysfs_root == "/"
    if use_nvml and not here:
        raise InvalidSpec("use_nvml", use_nvml, "NVML only on the machine we run on (a LocalHost) reading the "
                                                "real / (it describes that machine)")
    if use_nvml is False or not here:
        return None
    return module or load_pynvml(required=bool(use_nvml))


def _exec(argv: tuple[str, ...], programs: Mapping[str, str]) -> Op:
    # `mig -lgi` exits 6 when there is no GPU instance anywhere: an empty table, not a failure
    return Op.exec((programs.get(argv[0], argv[0]), *argv[1:]), timeout=60.0, read_only=True,
                   ok_codes=(0, 6) if argv == mig.LGI_ARGV else (0,))


def read_host(host: Host, wants: Iterable[Want], *, globs: Sequence[str] | None = None,
              static: StaticFacts | None = None, now: float | None = None,
              programs: Mapping[str, str] | None = None, use_nvml: bool | None = None,
              nvml_module: Any = None) -> HostRead:
    """Read what ``wants`` names from ``host`` in ONE round trip (read-only: no host lock is taken).

    ``globs``: the sysfs patterns of :attr:`Want.SYSFS` (default: the inventory's). ``static``: keep and reuse
    ``-q -x`` across reads (with ``now``, the read's time); ``--query-gpu`` then gives the readings.
    ``programs``: a program name mapped to the path to run instead (argv, never a shell). ``use_nvml`` and
    ``nvml_module`` (a pynvml stand-in): see :func:`_nvml_module`; asking for NVML where it cannot describe the
    host raises :class:`InvalidSpec`."""
    want = frozenset(wants)
    programs = programs or {}
    rt0 = host.round_trips
    module = _nvml_module(host, use_nvml, nvml_module) if want & {Want.NVML, Want.NVML_READINGS} else None
    nvml = nvml_readings = None
    if module is not None:
        from vgpuvirt.services.nvidia import nvml as nvml_mod
        from vgpuvirt.services.nvidia.nvml_session import shared

        with shared(module) as session:      # one init, one handle per GPU, one shutdown for both
            nvml = nvml_mod.collect(session) if Want.NVML in want else None
            nvml_readings = collect_nvml(session) if Want.NVML_READINGS in want else None
    if Want.TOOLS_ONLY_WITHOUT_NVML in want and ((nvml and nvml.available)
                                                 or (nvml_readings and nvml_readings.available)):
        # NVML gives nvidia-smi's facts and readings in-process; the XIDs are in the kernel log alone, and
        # without them a GPU that fell off the bus would look healthy to placement (seen on a real H100: the
        # NVML inventory had no health at all)
        want -= NVIDIA_TOOLS - {Want.KERNEL_LOG}
    reads = list(globs if globs is not None else INVENTORY_GLOBS) if Want.SYSFS in want else []
    if Want.SCHEDULER in want:
        reads += vgpu_scheduler.READ_GLOBS
    static = static if Want.NVIDIA_SMI in want else None
    at = now if now is not None else time.time()
    left_out: set[Want] = set()
    if static is not None and static.fresh(host.name, at):
        left_out.add(Want.NVIDIA_SMI)
        if static.mig_off(host.name):
            left_out |= MIG_TABLES & want      # no MIG anywhere: the MIG listings have nothing to say
    runs = [argv for w, argv in _PROGRAMS if w in want and w not in left_out]
    if static is not None:
        runs.insert(0, QUERY_GPU_ARGV)
    sched_ops = vgpu_scheduler.read_ops(None) if Want.SCHEDULER in want else []
    if not runs and not sched_ops:
        snap = host.read(reads)
        return HostRead(host.name, snap, nvml=nvml, nvml_readings=nvml_readings,
                        health=_nvml_health(HealthInputs(), nvml_readings), round_trips=host.round_trips - rt0)
    ops = [*(_exec(argv, programs) for argv in runs), *sched_ops]
    batch = host.apply(ops, lock=False, on_error="continue", reads_after=reads)
    got: dict[tuple[str, ...], OpResult] = dict(zip(runs, batch.results, strict=False))
    smi_raw = got.get(NVIDIA_SMI_ARGV)
    smi = SmiReport.parse(smi_raw) if smi_raw is not None else None
    readings = None
    if static is not None:
        def read_again() -> SmiReport:
            # -q -x no longer describes the GPUs: read it, and what was left out with it (MIG may be on now)
            again = [a for w, a in _PROGRAMS if w in left_out]
            b = host.apply([_exec(a, programs) for a in again], lock=False, on_error="continue")
            got.update(zip(again, b.results, strict=True))
            return SmiReport.parse(got[NVIDIA_SMI_ARGV])

        smi, readings = static.resolve(host.name, got[QUERY_GPU_ARGV], smi, at, read_again)
    dmesg = got.get(DMESG_ARGV)
    health = health_inputs(smi if readings is None else None, dmesg)
    if smi is None and readings is None:
        health = _nvml_health(health, nvml_readings)
    return HostRead(
        host.name, batch.after, smi=smi, readings=readings, mig_gpu_instances=got.get(mig.LGI_ARGV),
        mig_compute_instances=got.get(mig.LCI_ARGV), mig_gi_profiles=got.get(mig.LGIP_ARGV),
        mig_gi_placements=got.get(mig.LGIPP_ARGV), vgpu_query=got.get(VGPU_QUERY_ARGV),
        kernel_log=dmesg, scheduler=tuple(batch.results[len(runs):]), nvml=nvml, nvml_readings=nvml_readings,
        health=health if readings is None else replace(health, readings=readings), round_trips=host.round_trips - rt0)


def _nvml_health(health: HealthInputs, nvml: NvmlMetrics | None) -> HealthInputs:
    """``health`` with NVML's readings (ECC, retired pages, remapped rows, PCIe link) where nvidia-smi's are
    not there: the same inputs to the same rules, read in-process."""
    if nvml is None or not nvml.available or health.readings:
        return health
    return replace(health, readings=dict(nvml.readings))
