"""Collect a metrics snapshot: ONE round trip per host per collection, whatever the number of GPUs and vGPUs.

One ``host.apply`` carries the read-only programs and the inventory's sysfs reads:

* ``nvidia-smi --query-gpu``: per GPU utilisation, temperature, power, clocks, ECC, retired pages / remapped
  rows, PCIe link, identity and MIG mode (:mod:`~vgpuvirt.services.nvidia.query_gpu`);
* ``nvidia-smi -q -x``: what only it gives the inventory (virtualization, host vGPU and heterogeneous modes),
  on a host's first collection and when :class:`~vgpuvirt.services.nvidia.static.StaticFacts` says the kept one is stale
  (it also gives the readings where ``--query-gpu`` fails);
* ``nvidia-smi mig -lgi``: the GPU instances (MIG-backed capacity);
* ``nvidia-smi vgpu -q``: every active vGPU with its VM, framebuffer, utilisation, encoder statistics and
  frame rate limit (:mod:`~vgpuvirt.services.nvidia.vgpu_query`);
* ``dmesg``: XIDs and the scheduler's boot message (:mod:`~vgpuvirt.services.nvidia.kernel_log`);
* the sysfs globs of the inventory (:data:`METRICS_GLOBS`: less a few PCI attributes no metric uses): mdevs,
  vGPU 17+ VFs, types and capacity (:mod:`~vgpuvirt.services.inventory.read`).

On the machine we run on (a LocalHost reading the real ``/``), NVML through ``pynvml`` (``nvidia-ml-py``)
gives the readings instead when it is installed (:mod:`~vgpuvirt.services.nvidia.nvml_readings`). nvidia-smi is NVML's
own client and exists wherever the driver does; on a host where it is missing,
failing or the driver is not loaded, its readings are absent (None), the capacity model still answers,
and ``sources`` says what happened. Owners are joined through libvirt: ``domains`` (name, XML) pairs map an
mdev UUID or a VF's address to its domain; without them the driver's own VM name/UUID is used.

:class:`Collector` keeps, per host, the newest kernel-log timestamp it saw, so a GPU's ``xids`` are the XIDs
*since the previous collection*; ``xids_since_boot`` keeps every code still in the log (health uses those).
It also keeps, per host, the sysfs part of the last inventory it built
(:class:`~vgpuvirt.services.inventory.build.SysfsCache`): a collection whose files read exactly as the previous
one's (the usual case between two scrapes) skips parsing them again. The tools' outputs are parsed once per
collection and shared by the inventory's health and the metrics
(:func:`~vgpuvirt.services.inventory.health.health_inputs`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from vgpuvirt.errors import InvalidSpec, MissingDependency, VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.observe.build import build_host_metrics
from vgpuvirt.services.inventory.build import SysfsCache
from vgpuvirt.services.inventory.host_read import INVENTORY_GLOBS, Want, read_host
from vgpuvirt.services.metrics_model import HostMetrics, MetricsSnapshot
from vgpuvirt.services.nvidia.kernel_log import DMESG_ARGV
from vgpuvirt.services.nvidia.query_gpu import QUERY_GPU_ARGV
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV, NVIDIA_SMI_LGI_ARGV
from vgpuvirt.services.nvidia.static import StaticFacts
from vgpuvirt.services.nvidia.vgpu_query import VGPU_QUERY_ARGV
from vgpuvirt.services.pci.sysfs import PCI

__all__ = ["METRICS_ARGVS", "METRICS_GLOBS", "Collector", "collect", "collect_many"]

#: What one collection reads (:func:`~vgpuvirt.services.inventory.host_read.read_host`): with its :class:`StaticFacts`,
# ``--query-gpu`` : gives the readings every time and ``-q -x`` runs only when the kept one is stale.
_WANTS = frozenset({Want.SYSFS, Want.NVIDIA_SMI, Want.MIG_GPU_INSTANCES, Want.VGPU_QUERY, Want.KERNEL_LOG,
                    Want.NVML_READINGS})
#: The programs of one collection, in order (all read-only; ``mig -lgi`` exits 6 when there is no GI).
#: ``--query-gpu`` gives the readings every time; ``-q -x`` runs only when :class:`StaticFacts` says so.
METRICS_ARGVS: tuple[tuple[str, ...], ...] = (QUERY_GPU_ARGV, NVIDIA_SMI_ARGV, NVIDIA_SMI_LGI_ARGV, VGPU_QUERY_ARGV,
                                              DMESG_ARGV)

#: PCI attributes the inventory reads that nothing in a snapshot depends on (NUMA, CPUs, reset, subsystem ids,
#: driver_override, boot VGA): a collection leaves them out, 1,629 of the 11,164 files of the `large` profile.
#: tests/unit/test_metrics_reads.py checks that the snapshot is the same with and without them.
_NOT_FOR_METRICS = frozenset(f"{PCI}/*/{a}" for a in ("subsystem_vendor", "subsystem_device", "driver_override",
                                                      "numa_node", "reset_method", "local_cpulist", "boot_vga"))
#: What a collection reads: the inventory's globs less :data:`_NOT_FOR_METRICS`.
METRICS_GLOBS: tuple[str, ...] = tuple(g for g in INVENTORY_GLOBS if g not in _NOT_FOR_METRICS)

Domains = Iterable[tuple[str, str]]


class Collector:
    """Collects snapshots and remembers, per host, where the previous collection left the kernel log.

    ``programs`` maps a program name (``nvidia-smi``, ``dmesg``) to the path to run instead, for hosts where
    it is not on the PATH (``/usr/lib/nvidia/bin/nvidia-smi``); the value travels as argv, never a shell."""

    def __init__(self, *, clock: Callable[[], float] = time.time, programs: Mapping[str, str] | None = None,
                 use_nvml: bool | None = None, nvml_module: Any = None) -> None:
        self._cursors: dict[str, float] = {}
        # per host: the inventory's sysfs part, reused while the host's files read the same (see SysfsCache)
        self._sysfs: dict[str, SysfsCache] = {}
        self._lock = threading.Lock()
        self.clock = clock
        for name, path in (programs or {}).items():
            if name not in ("nvidia-smi", "dmesg") or not path or "\0" in path:
                raise InvalidSpec("program", f"{name}={path}", "nvidia-smi=PATH or dmesg=PATH")
        self.programs = dict(programs or {})
        # NVML (pynvml) for a LocalHost reading the real /: None = when installed, True = required, False = never.
        # ``nvml_module`` injects a pynvml stand-in (tests).
        self.use_nvml = use_nvml
        self.nvml_module = nvml_module
        # per host: the last `nvidia-smi -q -x` (the facts only it gives), re-read when stale (see StaticFacts)
        self.static = StaticFacts()

    def collect(self, host: Host, *, domains: Domains | None = None) -> HostMetrics:
        """One host's metrics in ONE round trip. A host that fails (transport, agent) gives ``up=False`` with
        the reason in ``error``; nothing is raised for a host problem."""
        started = self.clock()
        t0 = time.perf_counter()
        rt0 = host.round_trips
        try:
            read = read_host(host, _WANTS, globs=METRICS_GLOBS, static=self.static, now=started,
                             programs=self.programs, use_nvml=self.use_nvml, nvml_module=self.nvml_module)
        except (VgpuvirtError, OSError) as exc:
            if isinstance(exc, InvalidSpec | MissingDependency) and host.round_trips == rt0:
                raise       # refused before the host was asked (NVML where it cannot be read): the caller's error
            return HostMetrics(host=host.name, up=False, collected_at=started,
                               duration_s=time.perf_counter() - t0, round_trips=host.round_trips - rt0,
                               error=f"{type(exc).__name__}: {exc}")
        doms = list(domains) if domains is not None else None
        with self._lock:
            cache = self._sysfs.setdefault(host.name, SysfsCache())
        # the parsed -q -x and kernel log are shared by the inventory's health and the metrics (read.health)
        inv = read.inventory(doms, cache=cache)
        nvml = read.nvml_readings
        sources = dict(inv.sources)
        if nvml is not None:
            sources["nvml"] = "ok" if nvml.available else f"unavailable ({nvml.error})"
        klog = read.health.klog
        with self._lock:
            cursor = self._cursors.get(host.name)
            if klog is not None and klog.last_uptime_s is not None:
                if cursor is not None and klog.last_uptime_s < cursor:
                    cursor = None      # the log went back in time: the host rebooted, every XID is new
                self._cursors[host.name] = klog.last_uptime_s
        return build_host_metrics(inv, smi=read.smi, vgpu_query=read.vgpu_query, klog=klog, cursor=cursor,
                                  domains=doms or (), sources=sources, collected_at=started,
                                  duration_s=time.perf_counter() - t0, round_trips=host.round_trips - rt0,
                                  nvml=nvml, readings=read.health.readings)

    def collect_many(self, hosts: Sequence[Host], *, domains: Mapping[str, Domains] | None = None,
                     workers: int | None = None, timeout: float | None = None) -> MetricsSnapshot:
        """Every host in parallel (one thread each, up to ``workers``). With ``timeout`` (seconds), a host
        that has not answered by then is reported ``up=False`` ("no answer within ...") and the snapshot
        returns without it; its collection finishes (or fails) in the background."""
        started = self.clock()
        if not hosts:
            return MetricsSnapshot(collected_at=started)
        pool = ThreadPoolExecutor(max_workers=workers or min(32, len(hosts)), thread_name_prefix="metrics")
        try:
            futures = [pool.submit(self.collect, h, domains=(domains or {}).get(h.name)) for h in hosts]
            wait(futures, timeout=timeout)
            results = tuple(f.result() if f.done() else
                            HostMetrics(host=h.name, up=False, collected_at=started, duration_s=timeout,
                                        error=f"no answer within {timeout} s")
                            for h, f in zip(hosts, futures, strict=True))
        finally:
            pool.shutdown(wait=timeout is None, cancel_futures=False)
        return MetricsSnapshot(collected_at=started, hosts=results)


def collect(host: Host, *, domains: Domains | None = None) -> HostMetrics:
    """One collection with a fresh :class:`Collector` (every XID in the kernel log counts as new)."""
    return Collector().collect(host, domains=domains)


def collect_many(hosts: Sequence[Host], *, domains: Mapping[str, Domains] | None = None,
                 timeout: float | None = None) -> MetricsSnapshot:
    return Collector().collect_many(hosts, domains=domains, timeout=timeout)
