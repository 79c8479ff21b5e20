"""What NVIDIA's tools and library say, parsed (``nvidia-smi -q -x``, ``--query-gpu``, ``vgpu -q``, the kernel log's
XIDs, NVML), the health rule over those readings, and the GPU-wide switches set through ``nvidia-smi``
(:mod:`.modes`). Parsers are pure and never raise on odd input."""
