"""Layout files (YAML, ``version: v1``) to :class:`~vgpuvirt.layout.model.Layout`, and back.

Pure: it takes the text and the name to report it under (reading the file is the caller's).
The YAML is composed into nodes first, so that every error names the file, the line and the key
(``day.yaml:7: configs.day[0].mode: invalid mode 'vgu': expected passthrough | vgpu | ...``);
unknown keys and duplicate keys are errors too (a typo must not silently mean "default").
The schema is documented in docs/layouts.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.layout.model import (
    FILL,
    MODES,
    SIZINGS,
    VENDOR,
    VENDORS,
    VERSION,
    VFIO,
    GpuEntry,
    GpuLayout,
    Layout,
    LayoutConfig,
    Scheduler,
    Selector,
    VgpuCount,
    config_name,
    pci_id,
)
from vgpuvirt.model import DriverName

T = TypeVar("T")

#: The keys of one entry of a config, as docs/layouts.md lists them.
ENTRY_KEYS = ("devices", "vendor", "device-filter", "mode", "driver", "sriov-vfs", "mig-enabled", "mig-devices",
              "vgpu-devices", "sizing", "scheduler")
SCHEDULER_KEYS = ("policy", "timeslice-ms", "average-factor")


class LayoutFileError(InvalidSpec):
    """A layout file is malformed: the message is ``FILE:LINE: KEY: what is wrong``."""

    def __init__(self, source: str, line: int | None, key: str, problem: str) -> None:
        self.source, self.line, self.key, self.problem = source, line, key, problem
        where = f"{source}:{line}" if line else source
        Exception.__init__(self, f"{where}: {key}: {problem}" if key else f"{where}: {problem}")
        self.what, self.value, self.expected = key, None, problem


#: deeper than any layout (configs.NAME[i].mig-devices.PROFILE is 5 levels); 100,000 levels used to end in a
#: RecursionError traceback, and took seconds to get there (see DepthBoundedLoader)
MAX_DEPTH = 32
MERGE_TAG = "tag:yaml.org,2002:merge"


class NestedTooDeep(yaml.YAMLError):
    """A node below :data:`MAX_DEPTH` levels of nesting, refused where the composer reaches it."""

    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__(f"nested deeper than {MAX_DEPTH} levels")
        self.problem_mark = mark


class DepthBoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops composing at the first node below :data:`MAX_DEPTH` levels. PyYAML's scanner takes
    time quadratic in the depth of the flow collections open (100,000 brackets: ~2 s of CPU before the composer's
    recursion gave up); stopped at level 33, it has scanned 33."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self._depth >= MAX_DEPTH:
            raise NestedTooDeep(self.peek_event().start_mark)  # type: ignore[no-untyped-call]
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class NodeReader:
    """YAML nodes to values, each error at its node's line (the interop readers use it too)."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.text = text

    def root(self, expected: str) -> yaml.Node:
        """The document's root node; an error for text that is not YAML, is empty, or nests deeper than
        :data:`MAX_DEPTH`."""
        if "\0" in self.text:           # the YAML reader's own message names no line and reads as a crash
            line = self.text.count("\n", 0, self.text.index("\0")) + 1
            raise LayoutFileError(self.source, line, "", "a NUL byte: not a YAML text file")
        try:
            self.loader = DepthBoundedLoader(self.text)
            try:
                root = self.loader.get_single_node()
            finally:
                self.loader.dispose()
        except NestedTooDeep as exc:
            raise LayoutFileError(self.source, exc.problem_mark.line + 1, "", str(exc)) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise LayoutFileError(self.source, mark.line + 1 if mark else None, "",
                                  f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
        if root is None:
            raise LayoutFileError(self.source, None, "", f"empty file; expected {expected}")
        return root

    def fail(self, node: yaml.Node | None, key: str, problem: str) -> LayoutFileError:
        return LayoutFileError(self.source, node.start_mark.line + 1 if node is not None else None, key, problem)

    def scalar(self, node: yaml.Node, key: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, key, "expected a single value, not a list or mapping")
        return self.loader.construct_object(node)

    def mapping(self, node: yaml.Node, key: str, allowed: tuple[str, ...] | None = None) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "expected a mapping (key: value)")
        out: dict[str, yaml.Node] = {}
        for knode, vnode in node.value:
            if knode.tag == MERGE_TAG:
                raise self.fail(knode, key, "merge keys (<<) are not supported: write the keys out")
            k = self.scalar(knode, key)
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise self.fail(knode, key, f"keys must be names, not {k!r}")
            ks = str(k)
            if ks in out:
                raise self.fail(knode, f"{key}.{ks}" if key else ks, "duplicate key")
            if allowed is not None and ks not in allowed:
                raise self.fail(knode, f"{key}.{ks}" if key else ks,
                                "unknown key; expected one of " + ", ".join(allowed))
            out[ks] = vnode
        return out

    def sequence(self, node: yaml.Node, key: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, "expected a list")
        return list(node.value)

    def checked(self, node: yaml.Node, key: str, make: Callable[..., T], *args: Any) -> T:
        """Run a model constructor; its InvalidSpec becomes an error at this node."""
        try:
            return make(*args)
        except LayoutFileError:
            raise
        except InvalidSpec as exc:
            raise self.fail(node, key, str(exc)) from None


def parse_layout(text: str, source: str = "<layout>") -> Layout:
    """A layout from YAML text; ``source`` names it in errors (the file's path)."""
    r = NodeReader(text, source)
    root = r.root("version: v1 and configs")
    top = r.mapping(root, "", ("version", "configs"))
    if "version" not in top:
        raise r.fail(root, "version", f"missing; expected version: {VERSION}")
    version = r.scalar(top["version"], "version")
    if version != VERSION:
        raise r.fail(top["version"], "version", f"{version!r} is not supported; expected {VERSION}")
    if "configs" not in top:
        raise r.fail(root, "configs", "missing; expected a mapping of config names to lists of entries")
    cnode = top["configs"]
    configs = []
    r.mapping(cnode, "configs")      # shape and duplicate checks
    for knode, node in cnode.value:
        name = str(r.scalar(knode, "configs"))
        key = f"configs.{name}"
        r.checked(knode, key, config_name, name)
        entries = tuple(_entry(r, e, f"{key}[{i}]") for i, e in enumerate(r.sequence(node, key)))
        if not entries:
            raise r.fail(node, key, "empty; expected at least one entry")
        configs.append(LayoutConfig(name, entries))
    if not configs:
        raise r.fail(cnode, "configs", "empty; expected at least one named config")
    return Layout(tuple(configs), source)


def _entry(r: NodeReader, node: yaml.Node, key: str) -> GpuEntry:
    f = r.mapping(node, key, ENTRY_KEYS)
    if "devices" not in f:
        raise r.fail(node, f"{key}.devices", "missing; expected all, or a list of indexes, PCI addresses, products")
    if "mode" not in f:
        raise r.fail(node, f"{key}.mode", "missing; expected one of " + " | ".join(MODES))
    devices = _devices(r, f["devices"], f"{key}.devices")
    mode = r.scalar(f["mode"], f"{key}.mode")
    if mode is False:               # YAML 1.1 reads an unquoted `off` as false
        mode = "off"
    if mode not in MODES:
        raise r.fail(f["mode"], f"{key}.mode", f"{mode!r} is not a mode; expected " + " | ".join(MODES))
    kw: dict[str, Any] = {"mode": mode}
    for yk, attr in (("driver", "driver"), ("sriov-vfs", "sriov_vfs"), ("mig-enabled", "mig_enabled"),
                     ("sizing", "sizing")):
        if yk in f:
            kw[attr] = r.scalar(f[yk], f"{key}.{yk}")
            r.checked(f[yk], f"{key}.{yk}", _field, attr, kw[attr])
    if "mig-devices" in f:
        k2 = f"{key}.mig-devices"
        migs: list[tuple[str, int]] = []
        for p, v in r.mapping(f["mig-devices"], k2).items():
            n = r.scalar(v, f"{k2}.{p}")
            migs.append((p, r.checked(v, f"{k2}.{p}", _mig_count, p, n)))
        kw["mig_devices"] = tuple(migs)
        kw["mig_exact"] = True
    if "vgpu-devices" in f:
        k2 = f"{key}.vgpu-devices"
        counts: list[VgpuCount] = []
        for t, v in r.mapping(f["vgpu-devices"], k2).items():
            n = r.scalar(v, f"{k2}.{t}")
            counts.append(r.checked(v, f"{k2}.{t}", _vgpu_count, t, n))
        kw["vgpu_devices"] = tuple(counts)
    if "scheduler" in f:
        k2 = f"{key}.scheduler"
        s = {k: r.scalar(v, f"{k2}.{k}") for k, v in r.mapping(f["scheduler"], k2, SCHEDULER_KEYS).items()}
        if "policy" not in s:
            raise r.fail(f["scheduler"], f"{k2}.policy", "missing; expected best-effort | equal-share | fixed-share")
        kw["scheduler"] = r.checked(f["scheduler"], k2, Scheduler, s["policy"], s.get("timeslice-ms"),
                                    s.get("average-factor"))
    try:
        layout = GpuLayout(**kw)
    except InvalidSpec as exc:
        # a rule across fields (vgpu-devices in mode passthrough): point at the key it names
        at = exc.what if exc.what in f else "mode"
        raise r.fail(f[at], f"{key}.{at}", str(exc)) from None
    vendor = r.scalar(f["vendor"], f"{key}.vendor") if "vendor" in f else None
    if vendor is not None and vendor not in VENDORS:
        raise r.fail(f["vendor"], f"{key}.vendor", f"{vendor!r}: expected " + " | ".join(VENDORS))
    filters: tuple[str, ...] = ()
    if "device-filter" in f:
        k2, fn = f"{key}.device-filter", f["device-filter"]
        items = [fn] if isinstance(fn, yaml.ScalarNode) else r.sequence(fn, k2)
        filters = tuple(r.checked(n, k2, pci_id, r.scalar(n, k2)) for n in items)
    return GpuEntry(devices, layout, node.start_mark.line + 1, vendor, filters)


def _devices(r: NodeReader, node: yaml.Node, key: str) -> tuple[Selector, ...]:
    if isinstance(node, yaml.ScalarNode):
        v = r.scalar(node, key)
        if v != "all":
            raise r.fail(node, key, f"{v!r}: expected all, or a list of indexes, PCI addresses, product names")
        return (Selector("all"),)
    items = r.sequence(node, key)
    if not items:
        raise r.fail(node, key, "empty list; expected all or at least one selector")
    return tuple(r.checked(n, f"{key}[{i}]", Selector.parse, r.scalar(n, f"{key}[{i}]")) for i, n in enumerate(items))


def _field(attr: str, v: object) -> None:
    """One scalar field alone, so that its error points at its own line."""
    if attr == "driver" and v not in (VFIO, VENDOR):
        DriverName(v)  # type: ignore[arg-type]  # validated there
    elif attr == "sriov_vfs":
        GpuLayout(mode="off", sriov_vfs=v)  # type: ignore[arg-type]
    elif attr == "sizing" and v not in SIZINGS:
        raise InvalidSpec("sizing", v, "equal | mixed")
    elif attr == "mig_enabled" and not isinstance(v, bool):
        raise InvalidSpec("mig-enabled", v, "true or false")


def _mig_count(profile: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise InvalidSpec(f"count of MIG profile {profile}", n, "0..7")
    GpuLayout(mode="mig", mig_devices=((profile, n),))      # the profile and the range are checked there
    return n


def _vgpu_count(type_name: str, n: object) -> VgpuCount:
    if n == FILL:
        return VgpuCount(type_name, None)
    if isinstance(n, str):
        raise InvalidSpec(f"count of vGPU type {type_name}", n, "an integer or fill")
    return VgpuCount(type_name, n)  # type: ignore[arg-type]  # VgpuCount checks it


def dump_layout(layout: Layout) -> str:
    """The YAML text of a layout (keys in the documented order); ``parse_layout`` reads it back equal."""
    return str(yaml.safe_dump(layout.to_dict(), sort_keys=False, default_flow_style=False, width=120))
