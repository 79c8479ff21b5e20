"""One NVML session shared by the collectors of one read (the inventory's facts and readings).

On a real H100 (driver 580, ``benchmarks/bench_nvml_read.py``) the fixed cost of a collector's pass is most of
it: ``nvmlDeviceGetHandleByIndex`` ~6.5 ms, ``nvmlShutdown`` ~2.3 ms and ``nvmlInit`` ~1.4 ms per pass, against
well under a millisecond for most readings. Each collector initialises and shuts NVML down itself so that it
also stands alone; inside :func:`shared` those calls are done once and each GPU's handle is looked up once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class NvmlSession:
    """pynvml with ``nvmlInit``/``nvmlShutdown`` left to the session and the device handles kept."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def nvmlInit(self) -> None:          # pynvml's own names
        """Already done by :func:`shared`."""

    def nvmlShutdown(self) -> None:
        """Done by :func:`shared` when the last collector is through."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        # a failure is not kept: the next collector asks again and meets it itself
        if index not in self._handles:
            self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]


@contextmanager
def shared(nvml: Any) -> Iterator[Any]:
    """``nvml`` initialised once for the collectors run inside. Where NVML does not initialise, the module
    itself is given: each collector then meets the failure and reports it as it does alone."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        yield nvml
        return
    try:
        yield NvmlSession(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
