"""One ``nvidia-smi -q -x`` answer, parsed ONCE (pure).

Two readers use that document: the inventory (facts: virtualization and host vGPU modes, MIG mode, brand;
:mod:`.smi`) and health and metrics (readings: ECC, retired pages, temperature, power;
:mod:`.readings`). A read parses it into one :class:`SmiReport` and hands that object to every reader;
:class:`~.static.StaticFacts` keeps the parsed report too, so a scrape that reuses a kept ``-q -x``
parses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpuvirt.host.base import OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.nvidia.readings import GpuReadings, readings_of
from vgpuvirt.services.nvidia.smi import NvidiaSmiReport, parse_root, report_of

__all__ = ["SmiReport", "smi_report"]


@dataclass(frozen=True)
class SmiReport:
    """``result``: what ran (exit status, stderr: the inventory's ``sources`` say what happened); ``facts``: the
    inventory's view of the document; ``readings``: every GPU's readings by address (whatever nvidia-smi printed,
    even with a non-zero exit: a lost GPU fails it while the others are listed). Treat as read-only."""

    result: OpResult
    facts: NvidiaSmiReport
    readings: dict[PciAddress, GpuReadings]

    @classmethod
    def parse(cls, result: OpResult) -> SmiReport:
        root, error = parse_root(result.stdout)
        if root is None:
            return cls(result, NvidiaSmiReport(None, None, [], error=error), {})
        return cls(result, report_of(root), readings_of(root))


def smi_report(smi: OpResult | SmiReport | None) -> SmiReport | None:
    """``smi`` as a parsed report: parsed now when it is a raw answer, as it is when it was parsed already."""
    return SmiReport.parse(smi) if isinstance(smi, OpResult) else smi
