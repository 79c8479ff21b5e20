"""Host GPU layouts: declare how each GPU of a host is partitioned, plan, apply, assert (docs/layouts.md).

:mod:`.model` and :mod:`.schema` are pure (the file format); the verbs that touch hosts live in the
modules next to them.
"""

from vgpuvirt.layout.model import (
    FILL,
    MODES,
    VERSION,
    GpuEntry,
    GpuLayout,
    Layout,
    LayoutConfig,
    Scheduler,
    Selector,
    VgpuCount,
)
from vgpuvirt.layout.schema import LayoutFileError, dump_layout, parse_layout

__all__ = ["FILL", "MODES", "VERSION", "GpuEntry", "GpuLayout", "Layout", "LayoutConfig", "LayoutFileError",
           "Scheduler", "Selector", "VgpuCount", "dump_layout", "parse_layout"]
