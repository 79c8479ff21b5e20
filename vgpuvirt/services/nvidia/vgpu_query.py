"""Parse ``nvidia-smi vgpu -q`` (pure; never raises): the active vGPUs of each GPU with their VM, type,
framebuffer use, utilisation, encoder statistics and frame rate limit.

Real layout (driver 525, shared/hostdata nvml_nvidia_smi.txt; a copy in tests/fixtures/hostdata)::

    GPU 00000000:01:00.0
        Active vGPUs                          : 1
        vGPU ID                               : 3251634190
            VM UUID                           : ...
            VM Name                           : win10test,debug-threads=on
            vGPU Name                         : NVIDIA RTXA6000-2Q
            vGPU Type                         : 525
            MDEV UUID                         : 00000000-0000-0000-0000-000000000101
            Frame Rate Limit                  : N/A
            FB Memory Usage
                Used                          : 0 MiB
            Utilization
                Gpu                           : 0 %
            Encoder Stats
                Active Sessions               : 0
                Average FPS                   : 0
                Average Latency               : 0

Sections nest by indentation; keys are joined with ``/`` (``Utilization/Gpu``). Blank values and ``N/A``
are None.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.services.nvidia.readings import integer, number
from vgpuvirt.services.nvidia.smi import clean

VGPU_QUERY_ARGV = ("nvidia-smi", "vgpu", "-q")


@dataclass(frozen=True)
class ActiveVgpu:
    gpu: PciAddress
    instance: int | None
    fields: dict[str, str | None]

    def text(self, key: str) -> str | None:
        return self.fields.get(key)

    def num(self, key: str) -> float | None:
        return number(self.fields.get(key))

    def integer(self, key: str) -> int | None:
        return integer(self.fields.get(key))

    @property
    def mdev_uuid(self) -> str | None:
        u = self.text("MDEV UUID")
        return u.lower() if u else None

    @property
    def vm_uuid(self) -> str | None:
        u = self.text("VM UUID")
        return u.lower() if u else None

    @property
    def frame_rate_limit(self) -> tuple[bool | None, int | None]:
        """(limiter on?, cap in FPS): ``60 FPS`` -> (True, 60); ``Disabled``/``Off`` -> (False, None);
        ``N/A`` -> (None, None)."""
        raw = self.fields.get("Frame Rate Limit")
        n = integer((raw or "").replace("FPS", "").strip() or None)
        if n is not None:
            return True, n
        if (raw or "").strip().lower() in ("disabled", "off", "0"):
            return False, None
        return None, None


def _gpu_address(text: str) -> PciAddress | None:
    try:
        return PciAddress.from_nvml(text.strip())
    except InvalidSpec:
        try:
            return PciAddress.parse(text.strip())
        except InvalidSpec:
            return None


def parse_vgpu_query(text: str | None) -> list[ActiveVgpu]:
    out: list[ActiveVgpu] = []
    gpu: PciAddress | None = None
    current: dict[str, str | None] | None = None
    instance: int | None = None
    stack: list[tuple[int, str]] = []     # (indent, section name) inside the current vGPU

    def flush() -> None:
        if gpu is not None and current is not None:
            out.append(ActiveVgpu(gpu, instance, current))

    for line in (text or "").splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        if indent == 0 and body.startswith("GPU "):
            flush()
            gpu, current, instance, stack = _gpu_address(body[4:]), None, None, []
            continue
        key, sep, value = body.partition(":")
        key = key.strip()
        if key == "vGPU ID" and sep:
            flush()
            current, stack = {}, []
            instance = integer(value)
            continue
        if current is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not sep:
            stack.append((indent, key))
            continue
        path = "/".join([s for _, s in stack] + [key])
        current[path] = clean(value) if value.strip() else None
    flush()
    return out
