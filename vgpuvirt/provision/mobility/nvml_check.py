"""NVML's own verdict on a vGPU migration, where the hosts' drivers answer it (XenServer's pre-check): the
source's vGPU metadata (``nvmlVgpuInstanceGetMetadata``) is handed to the destination GPU, which answers
``nvmlGetVgpuCompatibility``: live / sleep / hibernate / cold, or none with the limiting factor (host driver,
guest driver, GPU). One batch on each host (every vGPU of the VM in it), read-only.

A host whose NVML does not answer (no NVML, a driver without the calls) is not refused for it: the migration's
own checks (board, ECC, versions) still apply, and the plan says that NVML was not asked.
"""

from __future__ import annotations

import json

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.host.base import Op
from vgpuvirt.model import PciAddress
from vgpuvirt.provision.mobility.checks import HostFacts, MigrationPlan, Side
from vgpuvirt.usage import GpuUse

LIVE, SLEEP, HIBERNATE, COLD = 8, 4, 2, 1
_VM_NAMES = ((LIVE, "live"), (SLEEP, "sleep"), (HIBERNATE, "hibernate"), (COLD, "cold"))
_LIMITS = ((1, "host driver"), (2, "guest driver"), (4, "GPU"), (0x80000000, "other"))
CAP_MIGRATION = 1           # NVML_VGPU_(PGPU_)VIRTUALIZATION_CAP_MIGRATION: bit 0


def _names(value: int, table: tuple[tuple[int, str], ...]) -> str:
    return ", ".join(n for bit, n in table if value & bit) or "none"


def nvml_verdicts(source: Side, dest: Side, dst: HostFacts, plan: MigrationPlan) -> tuple[list[str], list[str]]:
    """(refusals, notes) from NVML on both hosts for the plan's mdev vGPUs; nothing asked when there are none."""
    moves = [m for m in plan.moves if m.kind == GpuUse.MDEV and m.type.startswith("nvidia-")]
    if not moves:
        return [], []
    notes: list[str] = []
    refusals: list[str] = []
    try:
        got = source.host.apply([Op.nvml("vgpu_migration_metadata", [m.source], read_only=True) for m in moves],
                                lock=False, on_error="continue")
    except VgpuvirtError as exc:
        return [], [f"NVML on {source.name} not asked ({exc}): compatibility not checked"]
    asks: list[tuple[str, str, str]] = []          # (vGPU, destination GPU bus id, metadata)
    for m, r in zip(moves, got, strict=True):
        if not r.ok:
            notes.append(f"NVML on {source.name} did not answer for vGPU {m.source} (NVML code {r.rc}: "
                         f"{r.error}): compatibility not checked")
            continue
        meta = json.loads(r.stdout)
        if not int(meta.get("caps", 0)) & CAP_MIGRATION:
            refusals.append(f"vGPU {m.source}: NVML says it cannot migrate (NVML_VGPU_VIRTUALIZATION_CAP_MIGRATION "
                            "is off: vGPU migration disabled on the source's vGPU manager?)")
            continue
        parent = dst.inventory.gpus
        gpu = next((g.address for g in parent if str(g.address) == m.dest_parent
                    or any(str(v) == m.dest_parent for v in g.vfs)), None)
        if gpu is not None:
            asks.append((m.source, PciAddress.parse(str(gpu)).nvml_bus_id, str(meta["blob"])))
    if not asks:
        return refusals, notes
    try:
        back = dest.host.apply([Op.nvml("vgpu_migration_compat", [bus, blob], read_only=True)
                                for _, bus, blob in asks], lock=False, on_error="continue")
    except VgpuvirtError as exc:
        return refusals, [*notes, f"NVML on {dest.name} not asked ({exc}): compatibility not checked"]
    need = LIVE if plan.live else COLD
    for (vgpu, bus, _), r in zip(asks, back, strict=True):
        if not r.ok:
            notes.append(f"NVML on {dest.name} did not answer for GPU {bus} (NVML code {r.rc}: {r.error}): "
                         "compatibility not checked")
            continue
        ans = json.loads(r.stdout)
        if not int(ans.get("pgpu_caps", 0)) & CAP_MIGRATION:
            refusals.append(f"GPU {bus} on {dest.name}: NVML says it takes no migrated vGPU "
                            "(NVML_VGPU_PGPU_VIRTUALIZATION_CAP_MIGRATION is off)")
        elif not int(ans.get("vm", 0)) & need:
            refusals.append(f"vGPU {vgpu} -> GPU {bus} on {dest.name}: NVML allows {_names(int(ans['vm']), _VM_NAMES)}"
                            f" migration, not {'live' if plan.live else 'cold'}; limited by "
                            f"{_names(int(ans.get('limit', 0)), _LIMITS)} (vGPU manager {ans.get('host_driver')})")
    return refusals, notes
