"""MIG state of a host's NVIDIA GPUs, read in ONE round trip: mode (current and pending), GPU-instance
profiles with free counts and placements, GPU instances and compute instances.

:func:`read_mig_state` sends one batch of read-only execs (``nvidia-smi -q -x``, ``nvidia-smi mig -lgi``,
``-lci``, ``-lgip``, ``-lgipp``), whatever the number of GPUs. Changes are in :mod:`.ops`.
nvidia-smi numbers GPUs by its own index (the ``-q -x`` order, which is PCI bus order); every record
here carries that index and, where known, the PCI address.
"""

from __future__ import annotations

import errno as _errno
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from vgpuvirt.host.base import Host, Op, OpResult
from vgpuvirt.model import PciAddress
from vgpuvirt.services.mig.parse import (
    EXIT_NOT_FOUND,
    ComputeInstance,
    GiProfile,
    GpuInstance,
    parse_lci,
    parse_lgi,
    parse_lgip,
    parse_lgipp,
)
from vgpuvirt.services.nvidia.report import SmiReport
from vgpuvirt.services.nvidia.smi import NVIDIA_SMI_ARGV, parse_nvidia_smi_xml

LGIP_ARGV = ("nvidia-smi", "mig", "-lgip")
LGIPP_ARGV = ("nvidia-smi", "mig", "-lgipp")
LGI_ARGV = ("nvidia-smi", "mig", "-lgi")
LCI_ARGV = ("nvidia-smi", "mig", "-lci")
READ_ARGVS = (NVIDIA_SMI_ARGV, LGI_ARGV, LCI_ARGV, LGIP_ARGV, LGIPP_ARGV)

__all__ = [
    "READ_ARGVS",
    "ComputeInstance",
    "GiProfile",
    "GpuInstance",
    "MigGpu",
    "MigState",
    "build_mig_state",
    "read_mig_state",
]


@dataclass(frozen=True)
class MigGpu:
    """One NVIDIA GPU as MIG sees it. ``mode_current``/``mode_pending``: "Enabled"/"Disabled", None when the
    GPU has no MIG (nvidia-smi says N/A)."""

    index: int
    address: PciAddress | None
    product: str | None
    mode_current: str | None
    mode_pending: str | None
    profiles: tuple[GiProfile, ...] = ()
    gpu_instances: tuple[GpuInstance, ...] = ()
    compute_instances: tuple[ComputeInstance, ...] = ()

    @property
    def capable(self) -> bool:
        return self.mode_current is not None

    @property
    def enabled(self) -> bool:
        return self.mode_current == "Enabled"

    @property
    def pending(self) -> bool:
        """A mode change waits for a GPU reset or a reboot."""
        return self.mode_pending is not None and self.mode_pending != self.mode_current

    def profile(self, name_or_id: str | int) -> GiProfile | None:
        key = str(name_or_id).removeprefix("MIG ")
        return next((p for p in self.profiles if key in (p.name, str(p.id))), None)

    def instance_counts(self) -> dict[str, int]:
        """MIG profile name -> GPU instances of it."""
        return dict(Counter(gi.profile for gi in self.gpu_instances))

    def free_profiles(self) -> dict[str, int]:
        """MIG profile name -> how many more GPU instances of it fit now (``-lgip`` Free)."""
        return {p.name: p.free for p in self.profiles}

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "address": str(self.address) if self.address else None,
                "product": self.product, "mig_mode": {"current": self.mode_current, "pending": self.mode_pending},
                "profiles": [p.to_dict() for p in self.profiles],
                "gpu_instances": [g.to_dict() for g in self.gpu_instances],
                "compute_instances": [c.to_dict() for c in self.compute_instances]}


@dataclass(frozen=True)
class MigState:
    host: str
    gpus: tuple[MigGpu, ...] = ()
    errors: tuple[str, ...] = ()          # what could not be read (the rest is still right)
    available: bool = True                # False: no nvidia-smi or no NVIDIA driver

    def gpu(self, key: int | str | PciAddress) -> MigGpu | None:
        """By nvidia-smi index or by PCI address."""
        if isinstance(key, int):
            return next((g for g in self.gpus if g.index == key), None)
        try:
            a = key if isinstance(key, PciAddress) else PciAddress.parse(str(key))
        except ValueError:
            return None
        return next((g for g in self.gpus if g.address == a), None)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "available": self.available, "errors": list(self.errors),
                "gpus": [g.to_dict() for g in self.gpus]}


@dataclass
class _Tables:
    profiles: list[GiProfile] = field(default_factory=list)
    placements: dict[tuple[int, int], tuple[tuple[int, ...], int]] = field(default_factory=dict)
    gis: list[GpuInstance] = field(default_factory=list)
    cis: list[ComputeInstance] = field(default_factory=list)


def _listing(r: OpResult | None, what: str, errors: list[str]) -> str:
    """The stdout of one listing; an empty listing (exit 6) is empty text, any other failure is noted."""
    if r is None:
        return ""
    if r.ok:
        return r.stdout
    if r.rc != EXIT_NOT_FOUND:
        tail = (r.stderr or r.stdout or r.error or "").strip().splitlines()[-1:]
        errors.append(f"nvidia-smi mig {what} failed (exit {r.rc}): {' '.join(tail) or 'no output'}")
    return ""


def build_mig_state(host: str, results: list[OpResult | None], parsed: SmiReport | None = None) -> MigState:
    """The state from the five results of :data:`READ_ARGVS` (pure). ``parsed``: the first one already parsed (a
    read that hands its one parse of ``-q -x`` to the inventory too)."""
    smi, lgi, lci, lgip, lgipp = (list(results) + [None] * 5)[:5]
    if smi is None or smi.rc == 127 or smi.errno == _errno.ENOENT:
        return MigState(host, available=False, errors=("nvidia-smi is not installed",))
    if not smi.ok:
        tail = (smi.stderr or smi.stdout or smi.error or "").strip().splitlines()[-1:]
        return MigState(host, available=False, errors=(f"nvidia-smi -q -x failed (exit {smi.rc}): "
                                                       f"{' '.join(tail) or 'no output'}",))
    report = parsed.facts if parsed is not None else parse_nvidia_smi_xml(smi.stdout)
    if report.error:
        return MigState(host, available=False, errors=(f"nvidia-smi -q -x: {report.error}",))
    errors: list[str] = []
    if not any(f.mig_mode_current == "Enabled" for f in report.gpus):
        # No GPU in MIG mode: no GPU or compute instance exists, and drivers differ in how they say it (R580:
        # "No MIG-enabled devices found." on stdout, exit 0; older: exit 6; boards without MIG: "Not
        # Supported"). The PROFILES are still listed by a MIG-capable board whose MIG is off (a real H100 on
        # R580 lists all 7 with exit 0): they are the board's own table, which every later create is checked
        # against, so keep them; a failure to list them is no error while MIG is off.
        lgi = lci = None
        lgip = lgip if lgip is not None and lgip.ok else None
        lgipp = lgipp if lgipp is not None and lgipp.ok else None
    t = _Tables(parse_lgip(_listing(lgip, "-lgip", errors)), parse_lgipp(_listing(lgipp, "-lgipp", errors)),
                parse_lgi(_listing(lgi, "-lgi", errors)), parse_lci(_listing(lci, "-lci", errors)))
    gpus = []
    for i, f in enumerate(report.gpus):
        profiles = []
        for p in t.profiles:
            if p.gpu == i:
                starts, size = t.placements.get((i, p.id), ((), None))
                profiles.append(replace(p, placements=starts, placement_size=size))
        gpus.append(MigGpu(i, f.address, f.product_name, f.mig_mode_current, f.mig_mode_pending, tuple(profiles),
                           tuple(g for g in t.gis if g.gpu == i), tuple(c for c in t.cis if c.gpu == i)))
    return MigState(host, tuple(gpus), tuple(errors))


def read_mig_state(host: Host) -> MigState:
    """The MIG state of every NVIDIA GPU of ``host`` in ONE round trip (read-only; takes no host lock)."""
    batch = host.apply([Op.exec(a, timeout=60.0, read_only=True) for a in READ_ARGVS], lock=False,
                       on_error="continue")
    return build_mig_state(host.name, list(batch.results))
