"""Which NVIDIA read a collection needs: ``--query-gpu`` every time, ``-q -x`` only for what only it gives.

``nvidia-smi --query-gpu`` (:mod:`.query_gpu`, ~25 ms on an H100) gives every reading and each GPU's identity
and MIG mode; ``nvidia-smi -q -x`` (108 ms there) is still the only nvidia-smi source of the virtualization mode,
the host vGPU mode, the heterogeneous (mixed-size) mode, brand and architecture, which the capacity model and
the inventory use. Those do not move between two scrapes: a :class:`StaticFacts` keeps the last ``-q -x`` of
each host and says when it must be read again: never read yet, older than ``max_age_s``, or the GPUs it
describes are not the ones ``--query-gpu`` lists now (driver version, bus ids, UUIDs, MIG mode current and
pending: a driver reload, a GPU gone or back, MIG switched).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from vgpuvirt.host.base import OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.nvidia.query_gpu import QueryGpuReport, parse_query_gpu
from vgpuvirt.services.nvidia.readings import GpuReadings
from vgpuvirt.services.nvidia.report import SmiReport
from vgpuvirt.services.nvidia.smi import NvidiaSmiReport, parse_nvidia_smi_xml

__all__ = ["Fingerprint", "StaticFacts", "fingerprint_of_query", "fingerprint_of_report", "fingerprint_of_xml"]

#: (driver version, ((bus id, UUID, MIG current, MIG pending), ...) in bus order)
Fingerprint = tuple[str | None, tuple[tuple[str, str | None, str | None, str | None], ...]]


def fingerprint_of_query(report: QueryGpuReport) -> Fingerprint:
    return report.driver_version, tuple(sorted(
        (str(a), r.uuid, *report.mig_mode.get(a, (None, None))) for a, r in report.readings.items()))


def fingerprint_of_xml(text: str) -> Fingerprint:
    return fingerprint_of_report(parse_nvidia_smi_xml(text))


def fingerprint_of_report(report: NvidiaSmiReport) -> Fingerprint:
    return report.driver_version, tuple(sorted(
        (str(g.address), g.uuid, g.mig_mode_current, g.mig_mode_pending) for g in report.gpus
        if g.address is not None))


@dataclass(frozen=True)
class _Entry:
    smi: SmiReport          # parsed when it was read: a scrape that reuses it parses nothing
    fingerprint: Fingerprint
    at: float


class StaticFacts:
    """Per host, the last ``nvidia-smi -q -x`` answer (parsed) and whether it still describes the host (thread-safe)."""

    def __init__(self, max_age_s: float = 60.0) -> None:
        self.max_age_s = max_age_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def fresh(self, host: str, now: float) -> bool:
        """Whether a collection starting now may leave ``-q -x`` out (it is re-read when it turns out stale)."""
        with self._lock:
            e = self._entries.get(host)
        return e is not None and 0 <= now - e.at < self.max_age_s

    def mig_off(self, host: str) -> bool:
        """Whether the kept ``-q -x`` shows no GPU with MIG enabled, current or pending: then the MIG listings
        (``mig -lgi``, ``-lgip``: 33 ms each on an H100) have nothing to say, and a GPU switching MIG on changes
        the fingerprint, which reads everything again."""
        with self._lock:
            e = self._entries.get(host)
        return e is not None and not any("Enabled" in (cur, pending) for _, _, cur, pending in e.fingerprint[1])

    def keep(self, host: str, smi: SmiReport, now: float) -> None:
        """Remember a ``-q -x`` answer (a failed one is not kept: the next collection reads it again)."""
        with self._lock:
            if smi.result.ok:
                self._entries[host] = _Entry(smi, fingerprint_of_report(smi.facts), now)
            else:
                self._entries.pop(host, None)

    def get(self, host: str, query: QueryGpuReport) -> SmiReport | None:
        """The kept answer when it describes the GPUs ``query`` lists; None when it must be read again."""
        with self._lock:
            e = self._entries.get(host)
        return e.smi if e is not None and e.fingerprint == fingerprint_of_query(query) else None

    def forget(self, host: str) -> None:
        with self._lock:
            self._entries.pop(host, None)

    def resolve(self, host: str, query: OpResult, smi: SmiReport | None, now: float,
                read_xml: Callable[[], SmiReport]) -> tuple[SmiReport, dict[PciAddress, GpuReadings] | None]:
        """The ``-q -x`` answer whose facts a read uses, and ``--query-gpu``'s readings (None: take them from
        ``-q -x``). ``smi``: the ``-q -x`` of this read when it ran (not :meth:`fresh`). ``read_xml`` runs
        ``-q -x`` in one more round trip: only when the kept one turns out not to describe the GPUs listed now,
        or ``--query-gpu`` failed (a driver without one of its fields)."""
        report = parse_query_gpu(query.stdout) if query.ok else None
        if report is None or report.error:
            self.forget(host)
            if query.rc == 127:               # no nvidia-smi at all: say so as -q -x would have
                return smi or SmiReport.parse(query), None
            return smi or read_xml(), None
        kept = self.get(host, report) if smi is None else None
        if kept is not None:
            return kept, report.readings
        smi = smi or read_xml()
        self.keep(host, smi, now)
        return smi, report.readings
