"""GPU health in the inventory (pure): from the ``nvidia-smi -q -x`` and ``dmesg`` outputs that ride in the
inventory's one round trip, a :class:`~vgpuvirt.services.metrics_model.Health` per NVIDIA GPU and a warning
for each unhealthy one (placement skips those; :mod:`vgpuvirt.services.nvidia.health` has the rules).

Both outputs are parsed once per round trip into :class:`HealthInputs`: a metrics collection hands the same
parse to the inventory (health) and to the metrics build (readings, XIDs), instead of parsing them twice."""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass, field, replace

from vgpuvirt.host.base import OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.inventory.parts import Gpu
from vgpuvirt.services.nvidia.health import assess
from vgpuvirt.services.nvidia.kernel_log import KernelLog, parse_kernel_log
from vgpuvirt.services.nvidia.readings import GpuReadings
from vgpuvirt.services.nvidia.report import SmiReport, smi_report


@dataclass(frozen=True)
class HealthInputs:
    """``nvidia-smi -q -x``'s readings per GPU and the parsed kernel log of one round trip.

    ``kernel_log_source``: what ``sources["kernel_log"]`` says (None: dmesg was not run). Treat the mappings
    as read-only: the inventory and the metrics build share them."""

    readings: dict[PciAddress, GpuReadings] = field(default_factory=dict)
    klog: KernelLog | None = None
    kernel_log_source: str | None = None


def _kernel_log(result: OpResult | None) -> tuple[KernelLog | None, str | None]:
    if result is None:
        return None, None
    if result.rc == 127 or result.errno == _errno.ENOENT:
        return None, "dmesg not installed"
    if not result.ok:
        # dmesg_restrict=1 without root: "dmesg: read kernel buffer failed: Operation not permitted"
        tail = (result.stderr or result.error or "").strip().splitlines()[-1:]
        return None, f"unreadable (exit {result.rc}{': ' + tail[0] if tail else ''})"
    return parse_kernel_log(result.stdout), "ok"


def health_inputs(nvidia_smi: OpResult | SmiReport | None, kernel_log: OpResult | None) -> HealthInputs:
    """Parse both outputs once (``nvidia_smi`` is parsed here only when it comes raw). Whatever nvidia-smi
    printed counts, even with a non-zero exit (a lost GPU fails it, the others are still listed)."""
    klog, source = _kernel_log(kernel_log)
    smi = smi_report(nvidia_smi)
    readings = smi.readings if smi is not None else {}
    return HealthInputs(readings, klog, source)


def with_health(gpus: list[Gpu], health: HealthInputs, warnings: list[str], sources: dict[str, str]) -> list[Gpu]:
    klog, readings = health.klog, health.readings
    if health.kernel_log_source is not None:
        sources["kernel_log"] = health.kernel_log_source
    if klog is None and not readings:
        return gpus
    out: list[Gpu] = []
    for g in gpus:
        r = readings.get(g.address)
        codes = [x.code for x in klog.xids.get(g.address, ())] if klog is not None else []
        if r is None and not codes:
            out.append(g)
            continue
        h = assess(r, codes)
        if not h.healthy:
            warnings.append(f"GPU {g.address} is unhealthy ({'; '.join(h.reasons)}): placement skips it")
        out.append(replace(g, health=h))
    return out
