"""Host doubles for the lifecycle tests (mdev, vendor vGPU, SR-IOV, IOMMU, gc).

* :class:`RecordingHost` records every call; its snapshot is a plain dict. The bad-input suite
  asserts it saw ZERO calls: validation happens before anything reaches a host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpuvirt.host.base import BatchResult, Entry, Op, OpResult, Result, Snapshot


def snap_from(files: Mapping[str, str], links: Mapping[str, str] = (), dirs: Iterable[str] = ()) -> Snapshot:
    """A Snapshot from {path: text} and {path: link target}; parent dirs are added."""
    entries: dict[str, Entry] = {}
    for p, t in files.items():
        entries[p] = Entry("file", text=t if t.endswith("\n") else t + "\n")
    for p, t in dict(links).items():
        entries[p] = Entry("link", target=t)
    for d in dirs:
        entries[d] = Entry("dir")
    for p in list(entries):
        parts = p.split("/")
        for i in range(2, len(parts)):
            entries.setdefault("/".join(parts[:i]), Entry("dir"))
    return Snapshot(entries, "double")


class RecordingHost:
    """Implements the Host protocol; answers reads from a fixed snapshot, records every call."""

    def __init__(self, snapshot: Snapshot | None = None, *, name: str = "double") -> None:
        self._snap = snapshot or Snapshot({}, name)
        self._name = name
        self.calls: list[tuple[str, Any]] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def sysfs_root(self) -> str:
        return "/"

    @property
    def round_trips(self) -> int:
        return len(self.calls)

    @property
    def is_local(self) -> bool:
        return False

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            idempotent: bool = False) -> Result:
        self.calls.append(("run", tuple(argv)))
        return Result(tuple(argv), 127, "", f"{argv[0]}: command not found")

    def read(self, patterns: Iterable[str]) -> Snapshot:
        pats = list(patterns)
        self.calls.append(("read", pats))
        keep = {p: e for p, e in self._snap.items() if any(_match(p, pat) for pat in pats)}
        return Snapshot(keep, self._name)

    def apply(self, ops: Sequence[Op], *, lock: bool = True, on_error: str = "stop",
              reads_after: Iterable[str] = ()) -> BatchResult:
        self.calls.append(("apply", list(ops)))
        return BatchResult(tuple(OpResult(op, True) for op in ops))

    def close(self) -> None:
        pass


def _match(path: str, pattern: str) -> bool:
    import fnmatch
    a, b = path.split("/"), pattern.split("/")
    return len(a) == len(b) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, b, strict=True))


class PciTree:
    """Builds a sysfs snapshot of PCI functions and IOMMU groups, as hostdata/iommu_examples.txt shows them."""

    def __init__(self, *, iommu: bool = True) -> None:
        self.files: dict[str, str] = {}
        self.links: dict[str, str] = {}
        self.iommu = iommu

    def dev(self, addr: str, cls: int, driver: str | None, group: int | None, *, reset: str | None = "flr bus",
            physfn: str | None = None, numvfs: int | None = None, vgpu_type: int | None = None,
            override: str | None = None) -> PciTree:
        base = f"/sys/bus/pci/devices/{addr}"
        self.files[f"{base}/class"] = f"0x{cls:06x}"
        self.files[f"{base}/driver_override"] = override or "(null)"
        if driver:
            self.links[f"{base}/driver"] = f"../../../../bus/pci/drivers/{driver}"
        if group is not None and self.iommu:
            self.links[f"{base}/iommu_group"] = f"../../../../kernel/iommu_groups/{group}"
            self.links[f"/sys/kernel/iommu_groups/{group}/devices/{addr}"] = f"../../../../devices/pci0000:00/{addr}"
        if reset is not None:
            self.files[f"{base}/reset_method"] = reset
        if physfn:
            self.links[f"{base}/physfn"] = f"../{physfn}"
        if numvfs is not None:
            self.files[f"{base}/sriov_numvfs"] = str(numvfs)
            self.files[f"{base}/sriov_totalvfs"] = "32"
        if vgpu_type is not None:
            self.files[f"{base}/nvidia/current_vgpu_type"] = str(vgpu_type)
        return self

    def mdev(self, uuid: str, parent: str, type_id: str) -> PciTree:
        self.links[f"/sys/bus/mdev/devices/{uuid}"] = f"../../../devices/pci0000:00/{parent}/{uuid}"
        self.links[f"/sys/bus/mdev/devices/{uuid}/mdev_type"] = f"../mdev_supported_types/{type_id}"
        return self

    def snapshot(self) -> Snapshot:
        return snap_from(self.files, self.links)

    def host(self) -> RecordingHost:
        return RecordingHost(self.snapshot())


def domain_xml(name: str, *, pci: Iterable[str] = (), mdevs: Iterable[str] = ()) -> str:
    devs = []
    for a in pci:
        d, rest = a.split(":", 1)
        b, rest = rest.split(":")
        s, f = rest.split(".")
        devs.append(f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{d}' "
                    f"bus='0x{b}' slot='0x{s}' function='0x{f}'/></source></hostdev>")
    for u in mdevs:
        devs.append(f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/>"
                    "</source></hostdev>")
    return f"<domain type='kvm'><name>{name}</name><devices>{''.join(devs)}</devices></domain>"


class Wrapped:
    """Delegates to a real host (usually a SimHost) and lets a test hook into the calls:
    ``before_apply(ops)`` runs first (to make a competing change: a lost race), ``fail`` maps a
    path suffix to an errno the matching write reports instead of running, ``mdevctl`` answers
    ``run`` for mdevctl list with canned JSON."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.before_apply: Any = None
        self.fail: dict[str, int] = {}
        self.mdevctl_json: str | None = None
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def sysfs_root(self) -> str:
        return str(self.inner.sysfs_root)

    def run(self, argv: Sequence[str], **kw: Any) -> Result:
        self.calls.append(("run", tuple(argv)))
        if self.mdevctl_json is not None and "mdevctl" in argv:
            return Result(tuple(argv), 0, self.mdevctl_json, "")
        return self.inner.run(argv, **kw)  # type: ignore[no-any-return]

    def read(self, patterns: Iterable[str]) -> Snapshot:
        pats = list(patterns)
        self.calls.append(("read", pats))
        return self.inner.read(pats)  # type: ignore[no-any-return]

    def apply(self, ops: Sequence[Op], **kw: Any) -> BatchResult:
        self.calls.append(("apply", list(ops)))
        if self.before_apply is not None:
            hook, self.before_apply = self.before_apply, None
            hook(ops)
        for i, op in enumerate(ops):
            for suffix, code in self.fail.items():
                if op.op == "write" and (op.path or "").endswith(suffix):
                    done = self.inner.apply(list(ops[:i]), **kw).results if i else ()
                    rest = tuple(OpResult(o, False, skipped=True) for o in ops[i + 1:])
                    return BatchResult((*done, OpResult(op, False, errno=code, error="injected"), *rest))
        return self.inner.apply(ops, **kw)  # type: ignore[no-any-return]

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


def mdev_types(host: Any) -> list[tuple[str, str, int]]:
    """(parent, type id, available_instances) for every mdev type on the host, in one read."""
    snap = host.read(["/sys/class/mdev_bus/*/mdev_supported_types/*/available_instances"])
    out = []
    for p in snap:
        parts = p.split("/")
        out.append((parts[4], parts[6], snap.int(p) or 0))
    return sorted(out)
