"""GPU health in the inventory (pure): from the ``nvidia-smi -q -x`` and ``dmesg`` outputs that ride in the
inventory's one round trip, a :class:`~vgpuvirt.services.metrics_model.Health` per NVIDIA GPU and a warning
for each unhealthy one (placement skips those; :mod:`vgpuvirt.services.gpu_health` has the rules)."""

from __future__ import annotations

import errno as _errno
from dataclasses import replace

from vgpuvirt.host.base import OpResult
from vgpuvirt.services.gpu_health import assess
from vgpuvirt.services.inventory_model import Gpu
from vgpuvirt.services.kernel_log import KernelLog, parse_kernel_log
from vgpuvirt.services.nvsmi_readings import parse_readings


def kernel_log_of(result: OpResult | None, sources: dict[str, str]) -> KernelLog | None:
    """The parsed kernel log, or None (with ``sources["kernel_log"]`` saying why) when it was not readable."""
    if result is None:
        return None
    if result.rc == 127 or result.errno == _errno.ENOENT:
        sources["kernel_log"] = "dmesg not installed"
        return None
    if not result.ok:
        # dmesg_restrict=1 without root: "dmesg: read kernel buffer failed: Operation not permitted"
        tail = (result.stderr or result.error or "").strip().splitlines()[-1:]
        sources["kernel_log"] = f"unreadable (exit {result.rc}{': ' + tail[0] if tail else ''})"
        return None
    sources["kernel_log"] = "ok"
    return parse_kernel_log(result.stdout)


def with_health(gpus: list[Gpu], nvidia_smi: OpResult | None, kernel_log: OpResult | None,
                warnings: list[str], sources: dict[str, str]) -> list[Gpu]:
    klog = kernel_log_of(kernel_log, sources)
    # whatever nvidia-smi printed, even with a non-zero exit (a lost GPU fails it, the others are still listed)
    readings = parse_readings(nvidia_smi.stdout) if nvidia_smi is not None else {}
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
