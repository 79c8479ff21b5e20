# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""The documentation of a VM's GPU requests, shared by vgpu_domain and vgpu_pool (their ``gpus`` option, whose
argument spec is module_utils/common.py's GPU_REQUEST_SPEC)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  gpus:
    description:
      - The GPUs of each VM, one entry each. Each is a vGPU by type or by need, a whole GPU
        (O(gpus[].mode=passthrough)) or a plain SR-IOV VF (O(gpus[].mode=vf)).
      - By type (O(gpus[].type)) or by need (the C(min_*), O(gpus[].series), O(gpus[].mig_backed) and
        O(gpus[].vendor) options; the smallest type that fits wins). Every option of an entry is optional.
    type: list
    elements: dict
    suboptions:
      type:
        description: A type id, number or name (C(nvidia-231), C(231), C(GRID T4-2Q)).
        type: str
      min_framebuffer_mib:
        description: At least this much framebuffer.
        type: int
      min_heads:
        description: At least this many display heads.
        type: int
      series:
        description: The NVIDIA series letter.
        type: str
        choices: [Q, B, A, C]
      min_resolution:
        description: At least this maximum resolution, C(WIDTHxHEIGHT).
        type: str
      mig_backed:
        description: Require (or refuse) a MIG-backed type.
        type: bool
      vendor:
        description: C(nvidia), C(intel) or C(amd).
        type: str
      mode:
        description: C(vgpu), C(passthrough) (a whole GPU with its other functions) or C(vf).
        type: str
        choices: [vgpu, passthrough, vf]
        default: vgpu
      display:
        description: Whether this vGPU drives the VM's display (the first one that does gets ramfb).
        type: bool
        default: true
      with_audio:
        description: With O(gpus[].mode=passthrough), pass the GPU's other functions (HDMI audio) along.
        type: bool
        default: true
"""
