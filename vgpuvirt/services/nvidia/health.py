"""Is a GPU fit to take new vGPUs? (pure) From what one inventory or metrics round trip read: the XIDs in the
kernel log, ECC counters, retired pages / remapped rows, and the PCIe link.

A GPU is kept out of placement when:

* its kernel log holds an XID of :data:`~vgpuvirt.services.nvidia.kernel_log.UNHEALTHY_XIDS` (fallen off the bus,
  double-bit ECC, row remap pending/failed, uncontained ECC, GSP errors, NVLink);
* it counted uncorrectable ECC errors since the driver loaded (volatile);
* pages wait for retirement, or rows for remapping (both take effect at the next GPU reset), or a remap failed;
* its PCIe link runs narrower than its maximum width, or at a lower generation than its maximum while the GPU
  is busy (P0-P2): NVIDIA GPUs lower the link speed themselves when idle, which is not a fault.

Uncorrectable errors in the aggregate (lifetime) counter alone are a warning, not a reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpuvirt.services.metrics_model import Health
from vgpuvirt.services.nvidia.kernel_log import UNHEALTHY_XIDS
from vgpuvirt.services.nvidia.readings import GpuReadings

_BUSY_STATES = ("P0", "P1", "P2")


def assess(readings: GpuReadings | None, xid_codes: Iterable[int] | None = None) -> Health:
    reasons: list[str] = []
    warnings: list[str] = []
    for code in sorted(set(xid_codes or ())):
        if code in UNHEALTHY_XIDS:
            reasons.append(UNHEALTHY_XIDS[code])
        else:
            warnings.append(f"XID {code} in the kernel log")
    if readings is not None:
        e, r, p = readings.ecc, readings.memory_repair, readings.pcie
        if e.uncorrected_volatile:
            reasons.append(f"{e.uncorrected_volatile} uncorrectable ECC error(s) since the driver loaded")
        elif e.uncorrected_aggregate:
            warnings.append(f"{e.uncorrected_aggregate} uncorrectable ECC error(s) over the board's life")
        if r.retired_pending:
            reasons.append("retired pages pending (take effect at the next GPU reset)")
        if r.remap_pending:
            reasons.append("row remapping pending (takes effect at the next GPU reset)")
        if r.remap_failure:
            reasons.append("row remapping failed")
        if p.width_current is not None and p.width_max is not None and p.width_current < p.width_max:
            reasons.append(f"PCIe link degraded: x{p.width_current} of x{p.width_max}")
        if (p.gen_current is not None and p.gen_max is not None and p.gen_current < p.gen_max
                and readings.performance_state in _BUSY_STATES):
            reasons.append(f"PCIe link degraded: gen {p.gen_current} of {p.gen_max} while busy "
                           f"({readings.performance_state})")
    return Health(healthy=not reasons, reasons=tuple(reasons), warnings=tuple(warnings))
