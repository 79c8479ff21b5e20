"""Parse ``nvidia-smi mig`` listings and messages (pure; never raises on odd input).

Formats: NVIDIA's MIG user guide ("Getting Started with MIG") and the transcripts in
tests/fixtures/hostdata/mig_backed_vgpu.txt and tests/fixtures/nvidia-smi/mig_*.txt:

* ``-lgip``: a box of two-line rows per profile,
  ``|   0  MIG 1g.10gb         19     7/7        9.75       No     16     1     0   |`` then the CE/JPEG/OFA line;
* ``-lgipp``: ``GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1`` (``Placement :`` when there is one);
* ``-lgi``: ``|   0  MIG 1g.12gb         19       13          6:1     |`` (GPU, profile, profile id, GI id, start:size);
* ``-lci``: ``|   0      1       MIG 3g.20gb          2         0          0:3     |`` (GPU, GI, name, CI profile id,
  CI id, start:size);
* exit 6 with "No GPU instances found" / "No compute instances found": an empty table, not a failure.

Lines that are not rows are ignored, so a newer driver's extra columns or banners do not break the
reader; a row that does not parse is simply not there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LGIP_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+|N/A|-)\s+(\S+)\s+(\d+)\s+(\d+)"
                       r"\s+(\d+)\s*\|$")
_LGIPP_ROW = re.compile(r"^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}:(\d+)\s*$")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|$")
_LCI_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|$")
_CREATED_GI = re.compile(r"Successfully created GPU instance ID\s+(\d+) on GPU\s+(\d+) using profile MIG (\S+) "
                         r"\(ID\s+(\d+)\)")
_CREATED_CI = re.compile(r"Successfully created compute instance ID\s+(\d+) on GPU\s+(\d+) GPU instance ID\s+(\d+)"
                         r"\s+using\s+profile MIG (\S+) \(ID\s+(\d+)\)")
_DESTROYED_GI = re.compile(r"Successfully destroyed GPU instance ID\s+(\d+) from GPU\s+(\d+)")
_DESTROYED_CI = re.compile(r"Successfully destroyed compute instance ID\s+(\d+) from GPU\s+(\d+) GPU instance ID"
                           r"\s+(\d+)")

#: nvidia-smi's exit status when a listing is empty (NVML_ERROR_NOT_FOUND).
EXIT_NOT_FOUND = 6


@dataclass(frozen=True)
class GiProfile:
    """One row of ``-lgip``: a GPU-instance profile of one GPU and how many more of it fit now."""

    gpu: int
    id: int
    name: str                            # "1g.10gb", "1g.10gb+me" (without the "MIG " prefix)
    free: int
    total: int
    memory_gib: float | None = None
    compute_slices: int | None = None    # from the name: "3g.40gb" -> 3
    placements: tuple[int, ...] = ()     # possible starts (``-lgipp``), in memory slices
    placement_size: int | None = None    # memory slices one instance takes (``-lgipp``)

    def to_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "id": self.id, "name": self.name, "free": self.free, "total": self.total,
                "memory_gib": self.memory_gib, "compute_slices": self.compute_slices,
                "placements": list(self.placements), "placement_size": self.placement_size}


@dataclass(frozen=True)
class GpuInstance:
    gpu: int
    id: int
    profile: str
    profile_id: int
    start: int
    size: int

    def to_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "id": self.id, "profile": self.profile, "profile_id": self.profile_id,
                "placement": {"start": self.start, "size": self.size}}


@dataclass(frozen=True)
class ComputeInstance:
    gpu: int
    gi: int
    id: int
    profile: str                         # "3g.20gb" (the whole GI) or "1c.3g.20gb"
    profile_id: int
    start: int
    size: int

    def to_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "gi": self.gi, "id": self.id, "profile": self.profile,
                "profile_id": self.profile_id, "placement": {"start": self.start, "size": self.size}}


def _slices(name: str) -> int | None:
    m = re.match(r"(\d+)g\.", name)
    return int(m[1]) if m else None


def parse_lgip(text: str | None) -> list[GiProfile]:
    """``nvidia-smi mig -lgip`` -> its profiles, in output order."""
    out: list[GiProfile] = []
    for line in (text or "").splitlines():
        m = _LGIP_ROW.match(line.strip())
        if m:
            try:
                mem = float(m[6])
            except ValueError:
                mem = None
            out.append(GiProfile(int(m[1]), int(m[3]), m[2], int(m[4]), int(m[5]), mem, _slices(m[2])))
    return out


def parse_lgipp(text: str | None) -> dict[tuple[int, int], tuple[tuple[int, ...], int]]:
    """``nvidia-smi mig -lgipp`` -> (GPU, profile id) -> (possible starts, size in memory slices)."""
    out: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
    for line in (text or "").splitlines():
        m = _LGIPP_ROW.match(line.strip())
        if m:
            starts = tuple(int(s) for s in m[3].replace(" ", "").split(",") if s)
            out[(int(m[1]), int(m[2]))] = (starts, int(m[4]))
    return out


def parse_lgi(text: str | None) -> list[GpuInstance]:
    """``nvidia-smi mig -lgi`` -> the GPU instances, in output order."""
    out: list[GpuInstance] = []
    for line in (text or "").splitlines():
        m = _LGI_ROW.match(line.strip())
        if m:
            out.append(GpuInstance(int(m[1]), int(m[4]), m[2], int(m[3]), int(m[5]), int(m[6])))
    return out


def parse_lci(text: str | None) -> list[ComputeInstance]:
    """``nvidia-smi mig -lci`` -> the compute instances, in output order."""
    out: list[ComputeInstance] = []
    for line in (text or "").splitlines():
        m = _LCI_ROW.match(line.strip())
        if m:
            out.append(ComputeInstance(int(m[1]), int(m[2]), int(m[5]), m[3], int(m[4]), int(m[6]), int(m[7])))
    return out


def created_gpu_instances(text: str | None) -> list[tuple[int, int]]:
    """(GPU, GI id) of every "Successfully created GPU instance" line."""
    return [(int(m[2]), int(m[1])) for m in _CREATED_GI.finditer(text or "")]


def created_compute_instances(text: str | None) -> list[tuple[int, int, int]]:
    """(GPU, GI id, CI id) of every "Successfully created compute instance" line."""
    return [(int(m[2]), int(m[3]), int(m[1])) for m in _CREATED_CI.finditer(" ".join((text or "").split()))]


def destroyed_gpu_instances(text: str | None) -> list[tuple[int, int]]:
    return [(int(m[2]), int(m[1])) for m in _DESTROYED_GI.finditer(text or "")]


def destroyed_compute_instances(text: str | None) -> list[tuple[int, int, int]]:
    return [(int(m[2]), int(m[3]), int(m[1])) for m in _DESTROYED_CI.finditer(text or "")]


def mode_change_pending(text: str | None) -> bool:
    """True when ``nvidia-smi -mig`` said the new mode waits for a GPU reset or a reboot."""
    return "pending" in (text or "").lower()
