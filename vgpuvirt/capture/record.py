"""Record a host for replay: everything vgpuvirt reads from it, in ONE read-only round trip.

What "everything vgpuvirt reads" is comes from the readers themselves, never from a copy of their lists: the
inventory's and the metrics' globs and programs, the MIG tables, the vGPU scheduler's files and NVML call, the
IOMMU check's, SR-IOV's and the vGPU 17+ VFs' globs, plus the NVIDIA driver's procfs files. A reader that
learns a new path (``/proc/driver/nvidia/params``) adds it to its own glob list and is captured from then on.

:func:`capture` runs every program and the NVML scheduler read once, then reads every glob, in one
``host.apply`` (nothing is written, no host lock is taken) and returns the capture (a dict, see docs/capture.md);
:class:`vgpuvirt.host.replay.ReplayHost` answers from it. :mod:`.redact` takes the secrets out.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Host, Op, OpResult
from vgpuvirt.host.replay import CAPTURE_FORMAT, CAPTURE_VERSION
from vgpuvirt.observe.collect import METRICS_ARGVS, METRICS_GLOBS
from vgpuvirt.services.inventory.read import INVENTORY_ARGVS, INVENTORY_GLOBS
from vgpuvirt.services.iommu import check as iommu_check
from vgpuvirt.services.mig import state as mig
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV, parse_nvidia_smi_xml
from vgpuvirt.services.pci import sriov
from vgpuvirt.services.pci.sysfs import NVIDIA_VERSION, PROC_NVIDIA
from vgpuvirt.services.scheduler import service as vgpu_scheduler
from vgpuvirt.services.vgpu import vendor as vendor_vgpu

__all__ = ["CAPTURE_ARGVS", "CAPTURE_GLOBS", "CAPTURE_NVML", "capture", "capture_globs"]

#: The NVIDIA driver's procfs files (its version, the module parameters it loaded, its registry, each GPU's
#: information), and the kernel's version line. Listed by name: some files there are write-only.
_PROC_GLOBS = (f"{PROC_NVIDIA}/version", f"{PROC_NVIDIA}/params", f"{PROC_NVIDIA}/registry",
               f"{PROC_NVIDIA}/gpus/*/information", "/proc/version")


def _unique(items: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(items))


def capture_globs() -> tuple[str, ...]:
    """Every glob a vgpuvirt reader asks a host for (computed from the readers, at call time)."""
    return _unique((*INVENTORY_GLOBS, *METRICS_GLOBS, *vgpu_scheduler.READ_GLOBS, *iommu_check.read_patterns(),
                    *sriov.read_patterns(), *vendor_vgpu.read_patterns(), *_PROC_GLOBS))


#: What :func:`capture` reads (see :func:`capture_globs`).
CAPTURE_GLOBS: tuple[str, ...] = capture_globs()
#: Every program a vgpuvirt reader runs on a host (all read-only), once each.
CAPTURE_ARGVS: tuple[tuple[str, ...], ...] = _unique((*INVENTORY_ARGVS, *METRICS_ARGVS, *mig.READ_ARGVS))
#: The read-only NVML calls: the vGPU scheduler of every GPU NVML sees (a per-GPU read is answered from it).
CAPTURE_NVML: tuple[Op, ...] = tuple(vgpu_scheduler.read_ops(None))


def _program(argv: tuple[str, ...], r: OpResult) -> dict[str, Any]:
    rec: dict[str, Any] = {"argv": list(argv), "rc": r.rc, "stdout": r.stdout, "stderr": r.stderr, "errno": None}
    if r.errno is not None:      # it did not run to an exit status (not found, timed out): keep why
        rec.update(errno=r.errno, error=r.error)
    return rec


def _driver_version(entries: Mapping[str, list[Any]], programs: list[dict[str, Any]]) -> str | None:
    e = entries.get(NVIDIA_VERSION)
    if e and e[0] == "f" and e[1]:
        return str(e[1]).strip()
    for p in programs:
        if tuple(p["argv"]) == NVIDIA_SMI_ARGV and p["rc"] == 0:
            return parse_nvidia_smi_xml(p["stdout"]).driver_version
    return None


def capture(host: Host, *, programs: Mapping[str, str] | None = None,
            clock: Any = time.time) -> dict[str, Any]:
    """Record ``host`` in ONE round trip (read-only: no write, no lock). ``programs`` maps a program name to the
    path to run instead (``nvidia-smi=/opt/bin/nvidia-smi``), as the metrics collector's; the capture records
    the answer under the name vgpuvirt asks for."""
    from vgpuvirt import __version__

    for name, path in (programs or {}).items():
        if name not in {a[0] for a in CAPTURE_ARGVS} or not path or "\0" in path:
            raise InvalidSpec("program", f"{name}={path}", "nvidia-smi=PATH or dmesg=PATH")
    run = [(a, Op.exec(((programs or {}).get(a[0], a[0]), *a[1:]), timeout=60.0, read_only=True))
           for a in CAPTURE_ARGVS]
    started = clock()
    batch = host.apply([op for _, op in run] + list(CAPTURE_NVML), lock=False, on_error="continue",
                       reads_after=CAPTURE_GLOBS)
    recorded = [_program(a, r) for (a, _), r in zip(run, batch.results, strict=False)]
    nvml = [{"call": op.value, "args": list(op.argv or ()),
             "result": {"ok": r.ok, "rc": r.rc, "stdout": r.stdout, "errno": r.errno, "error": r.error}}
            for op, r in zip(CAPTURE_NVML, batch.results[len(run):], strict=True)]
    entries = batch.after.to_wire()
    return {"format": CAPTURE_FORMAT, "version": CAPTURE_VERSION, "host": host.name,
            "sysfs_root": host.sysfs_root,
            "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "vgpuvirt_version": __version__, "driver_version": _driver_version(entries, recorded),
            "redacted": False, "globs": list(CAPTURE_GLOBS), "programs": recorded, "nvml": nvml,
            "entries": entries}
