"""Where a vGPU type may go: NVIDIA's equal-size rule, heterogeneous (mixed-size) mode, and why a
type shows 0.

The kernel's ``available_instances`` (mdev) and ``creatable_vgpu_types`` (vGPU 17+ VFs) are the
truth; these rules explain a 0 and tell placement whether one more vGPU fits on a GPU:

* equal-size mode (the default): every vGPU on one physical GPU has the same framebuffer size,
  and at most ``max_instance`` of that size exist;
* heterogeneous mode (vGPU 17+, ``nvidia-smi vgpu -shm 1``): sizes may mix while the sum of
  framebuffers fits the GPU (placement details are the driver's; INFERRED, so only a hint).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def may_place(new_fb_mib: int | None, new_max: int | None, existing_fb_mib: Sequence[int | None], *,
              heterogeneous: bool = False, total_fb_mib: int | None = None) -> tuple[bool, str]:
    """Would one more vGPU of this size fit next to ``existing_fb_mib`` on one physical GPU?"""
    n = len(existing_fb_mib)
    if not heterogeneous:
        sizes = {fb for fb in existing_fb_mib if fb is not None}
        if new_fb_mib is not None and sizes and sizes != {new_fb_mib}:
            have = ", ".join(f"{s}M" for s in sorted(sizes))
            return False, (f"equal-size mode: the GPU already hosts {have} vGPUs and this type needs "
                           f"{new_fb_mib}M (remove them, or use a {have} type)")
        if new_max is not None and n >= new_max:
            return False, f"all {new_max} instances of this size are in use on the GPU"
        return True, "fits"
    if total_fb_mib is not None and new_fb_mib is not None:
        used = sum(fb or 0 for fb in existing_fb_mib)
        if used + new_fb_mib > total_fb_mib:
            return False, (f"heterogeneous mode: {used}M of {total_fb_mib}M framebuffer in use, "
                           f"{new_fb_mib}M more does not fit")
    return True, "fits"


def explain_zero(type_id: str, new_fb_mib: int | None, new_max: int | None,
                 existing: Iterable[tuple[str, int | None]], *, heterogeneous: bool = False,
                 total_fb_mib: int | None = None) -> str:
    """Why ``type_id`` shows 0 available; ``existing`` is (type id, framebuffer MiB) per vGPU on the GPU."""
    ex = list(existing)
    ok, why = may_place(new_fb_mib, new_max, [fb for _, fb in ex], heterogeneous=heterogeneous,
                        total_fb_mib=total_fb_mib)
    if not ok:
        return why
    if not ex:
        return "the driver reports no free instance (MIG mode, a missing GPU instance, or a driver limit)"
    return f"the driver reports no free instance ({len(ex)} vGPUs already on the GPU)"
