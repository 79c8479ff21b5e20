"""The MIG geometry rules of the simulated A100 / H100 / A30 (pure).

NVIDIA MIG user guide ("Supported MIG Profiles", "Partitioning"; tests/fixtures/hostdata/mig_backed_vgpu.txt):

* A GPU has ``memory_slices`` memory slices (8; A30: 4) and ``compute_slices`` compute slices (7; A30: 4).
  Memory slice ``i`` goes with compute slice ``i``; on the 8/7 boards the eighth memory slice has no compute
  slice of its own (only the full ``7g`` profile takes it).
* A GPU-instance profile ``Ng.Mgb`` takes N compute slices and ``M / (GPU memory / memory_slices)`` memory
  slices rounded up to a power of two (A100 80GB: 1g.10gb 1, 1g.20gb 2, 2g.20gb 2, 3g.40gb 4, 4g.40gb 4,
  7g.80gb 8). Its possible placements (``-lgipp``) are the starts aligned to its memory size whose
  memory range holds at least N compute slices: 1g.10gb {0..6}:1, 1g.20gb {0,2,4,6}:2, 2g.20gb {0,2,4}:2,
  3g.40gb {0,4}:4, 4g.40gb {0}:4, 7g.80gb {0}:8 -- the guide's table.
* GPU instances never share a memory slice, their compute slices add up to at most ``compute_slices``, and
  there are at most ``max`` of one profile (``+me`` profiles: one).
* A GI's id is its node in the slice tree (size 8: 0; size 4: 1-2; size 2: 3-6; size 1: 7-14 -- the guide's
  "1g.12gb ... 13 ... 6:1" and "2g.24gb ... 3 ... 0:2"); when that id is taken, the lowest free one.
* Where a GI goes when no placement is asked: one-compute-slice profiles from the top (the guide's first
  1g GI lands at 6:1), larger ones from slice 0. INFERRED from the guide's listings, not documented.
* Compute instances inside a GI of C slices: profiles of k in {1, 2, 3, 4, 7, 8} slices (k <= C), profile
  id by k (NVML: 1->0, 2->1, 3->2, 4->3, 7->4, 8->5), starts aligned to k (3 aligned to 4), never
  overlapping; named ``MIG kc.<GI profile>``, or the GI's own name when k == C.
"""

from __future__ import annotations

import functools
import math
import re

from vgpuvirt.sim.profile_spec import MigProfile, TypeTable

CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5}


_GB = re.compile(r"\.(\d+)gb")


@functools.cache   # a handful of profile names, asked millions of times by a layout's MIG planning
def _gb(name: str) -> int:
    m = _GB.search(name)
    return int(m[1]) if m else 0


#: id(table) -> (table, its largest profile's GB): held with the table, so an id is never reused while cached
_FULL_GB: dict[int, tuple[TypeTable, int]] = {}


def _full_gb(table: TypeTable) -> int:
    hit = _FULL_GB.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    full = max((_gb(p.name) for p in table.mig_profiles), default=0)
    if len(_FULL_GB) >= 256:        # tables are a profile's few; a caller making new ones keeps this bounded
        _FULL_GB.clear()
    _FULL_GB[id(table)] = (table, full)
    return full


def memory_size(table: TypeTable, prof: MigProfile) -> int:
    """Memory slices one GI of ``prof`` takes."""
    # asked at every placement check of a layout's MIG planning: the largest profile is looked up once per table
    full = _full_gb(table)
    if full <= 0:
        return prof.slices
    raw = max(1, round(_gb(prof.name) * table.memory_slices / full))
    return min(table.memory_slices, 1 << math.ceil(math.log2(raw)))


def placements(table: TypeTable, prof: MigProfile) -> list[int]:
    """Every possible start of ``prof`` (``-lgipp``), ascending."""
    size = memory_size(table, prof)
    out = []
    for start in range(0, table.memory_slices - size + 1, size):
        compute = min(start + size, table.compute_slices) - start
        if compute >= prof.slices:
            out.append(start)
    return out


def gi_node_id(table: TypeTable, start: int, size: int) -> int:
    return table.memory_slices // size - 1 + start // size


def _preferred(table: TypeTable, prof: MigProfile) -> list[int]:
    starts = placements(table, prof)
    return starts[::-1] if prof.slices == 1 else starts


def _occupied(table: TypeTable, gis: dict[int, tuple[str, int]]) -> tuple[set[int], int]:
    """(memory slices in use, compute slices in use) of ``gis`` (GI id -> (profile name, start))."""
    by_name = {p.name: p for p in table.mig_profiles}
    mem: set[int] = set()
    compute = 0
    for name, start in gis.values():
        p = by_name[name]
        mem.update(range(start, start + memory_size(table, p)))
        compute += p.slices
    return mem, compute


def fits_at(table: TypeTable, gis: dict[int, tuple[str, int]], prof: MigProfile, start: int) -> bool:
    if start not in placements(table, prof):
        return False
    mem, compute = _occupied(table, gis)
    size = memory_size(table, prof)
    if mem & set(range(start, start + size)) or compute + prof.slices > table.compute_slices:
        return False
    return sum(1 for n, _ in gis.values() if n == prof.name) < prof.max


def choose_start(table: TypeTable, gis: dict[int, tuple[str, int]], prof: MigProfile) -> int | None:
    """Where the driver puts a new GI of ``prof`` when no placement is asked; None: it does not fit."""
    return next((s for s in _preferred(table, prof) if fits_at(table, gis, prof, s)), None)


def new_gi_id(table: TypeTable, gis: dict[int, tuple[str, int]], prof: MigProfile, start: int) -> int:
    want = gi_node_id(table, start, memory_size(table, prof))
    if want not in gis:
        return want
    n = 0
    while n in gis:
        n += 1
    return n


def remaining(table: TypeTable, gis: dict[int, tuple[str, int]], prof: MigProfile) -> int:
    """How many more GIs of ``prof`` fit now (``-lgip`` Free)."""
    trial = dict(gis)
    n = 0
    while True:
        start = choose_start(table, trial, prof)
        if start is None:
            return n
        trial[-1 - n] = (prof.name, start)
        n += 1


def ci_sizes(gi_slices: int) -> list[int]:
    return [k for k in sorted(CI_PROFILE_IDS) if k <= gi_slices]


def ci_name(gi_profile: str, gi_slices: int, k: int) -> str:
    return gi_profile if k == gi_slices else f"{k}c.{gi_profile}"


def ci_starts(gi_slices: int, k: int) -> list[int]:
    align = 4 if k == 3 else k
    return [s for s in range(0, gi_slices, align) if s + k <= gi_slices]


def ci_size_of(gi_profile: str, gi_slices: int, key: str) -> int | None:
    """A ``-cci`` item (profile id or name) -> compute slices, or None when the GI has no such profile."""
    for k in ci_sizes(gi_slices):
        name = ci_name(gi_profile, gi_slices, k)
        if key in (str(CI_PROFILE_IDS[k]), name, f"MIG {name}"):
            return k
    return None


def ci_choose_start(gi_slices: int, cis: dict[int, tuple[int, int]], k: int) -> int | None:
    """Lowest start for a k-slice CI that overlaps none of ``cis`` (CI id -> (slices, start))."""
    used: set[int] = set()
    for size, start in cis.values():
        used.update(range(start, start + size))
    return next((s for s in ci_starts(gi_slices, k) if not used & set(range(s, s + k))), None)
