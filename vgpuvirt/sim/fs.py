"""The simulated sysfs: a filesystem view computed from a :class:`~vgpuvirt.sim.model.SimModel`.

:class:`SimFs` offers the duck-typed interface of ``vgpuvirt.host.agent.OsFs`` (``listdir``,
``kind``, ``exists``, ``readlink``, ``read``, ``write``), so the batch agent runs against it
unchanged. Paths are host paths (``/sys/bus/pci/devices/...``); symlinks anywhere in a path resolve
like the kernel's (relative targets, ``..`` against the link's real directory). Errors are
``OSError(errno, strerror)`` as the kernel gives them: ENOENT, ENOTDIR, EISDIR, EINVAL for
readlink of a non-link, and EACCES for reading a write-only attribute or writing a read-only one
(sysfs refuses such opens even for root, see docs/sim.md).
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Callable
from typing import Any

from vgpuvirt.model import format_cpulist
from vgpuvirt.sim.kstrto import kstrtobool, kstrtoint, kstrtoul, oserror
from vgpuvirt.sim.model import Dev, Mdev, SimModel
from vgpuvirt.sim.profiles import VgpuType

PAGE_SIZE = 4096
MAX_LINKS = 40


class Attr:
    """A sysfs attribute: ``show()`` returns its text, ``store(text)`` applies a write."""

    __slots__ = ("mode", "show", "store")

    def __init__(self, show: Callable[[], str] | None = None, store: Callable[[str], None] | None = None,
                 mode: int | None = None) -> None:
        self.show = show
        self.store = store
        self.mode = mode if mode is not None else (0o644 if show and store else 0o444 if show else 0o200)


class Link:
    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target


class Dir:
    __slots__ = ("fill",)

    def __init__(self, fill: Callable[[], dict[str, Node]]) -> None:
        self.fill = fill


Node = Attr | Link | Dir


def _rel(link_dir: str, target: str) -> str:
    return posixpath.relpath(target, link_dir)


def _const(text: str) -> Attr:
    return Attr(show=lambda: text)


def _noop(_: str) -> None:
    return None


def _bitmap(cpus: frozenset[int], nbits: int) -> str:
    """The kernel's %*pb cpumask format: 32-bit hex words, most significant first, comma separated."""
    words = max(1, (nbits + 31) // 32)
    value = sum(1 << c for c in cpus)
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


class _Fail(Exception):
    """A failed resolution: the errno and how many links were followed before it (for ELOOP accounting)."""

    def __init__(self, code: int, links: int, cacheable: bool = True) -> None:
        self.code = code
        self.links = links
        self.cacheable = cacheable


# A resolution: the node, its canonical path, and the number of symlinks followed to reach it.
_Res = tuple[Node, str, int]


def _norm(path: str) -> str:
    """Drop empty components ('//', a trailing '/'): the walk ignores them, so keys need not tell them apart."""
    if "//" in path or (path.endswith("/") and path != "/"):
        return "/" + "/".join(p for p in path.split("/") if p)
    return path


def _attr_for(node: object, read: bool, write: bool) -> Attr:
    """The attribute an open for ``read``/``write`` reaches: EISDIR on a directory, EACCES when the
    attribute lacks the mode bits or the operation (sysfs's open-time checks)."""
    if isinstance(node, Dir):
        raise oserror(errno.EISDIR)
    assert isinstance(node, Attr)
    if read and (node.show is None or not node.mode & 0o444):
        raise oserror(errno.EACCES)
    if write and (node.store is None or not node.mode & 0o222):
        raise oserror(errno.EACCES)
    return node


class SimFs:
    """The agent-compatible filesystem of one simulated host."""

    def __init__(self, model: SimModel) -> None:
        self.model = model
        self._version = -1
        self._dircache: dict[str, dict[str, Node]] = {}
        self._children: dict[str, list[Dev]] = {}
        # Path resolutions of the current model version, keyed by (normalized path, follow final link):
        # a full inventory read resolves ~60,000 paths, nearly all sharing their parent with the last one.
        self._ok: dict[tuple[str, bool], _Res] = {}
        self._bad: dict[tuple[str, bool], tuple[int, int]] = {}
        self._root = Dir(lambda: {"sys": Dir(self._sys)})

    # ------------------------------------------------------------------ path walking

    def _fresh(self) -> None:
        if self._version != self.model.version:
            self._dircache.clear()
            self._ok.clear()
            self._bad.clear()
            kids: dict[str, list[Dev]] = {}
            for d in self.model.devices.values():
                kids.setdefault(d.sysfs_dir.rsplit("/", 1)[0], []).append(d)
            self._children = kids
            self._version = self.model.version

    def _entries(self, path: str, node: Dir) -> dict[str, Node]:
        e = self._dircache.get(path)
        if e is None:
            e = node.fill()
            self._dircache[path] = e
        return e

    def _walk(self, path: str, follow: bool) -> tuple[Node, str]:
        """Resolve ``path``; return the node and its canonical path. ``follow``: follow a final symlink.

        Like the kernel: every component but the last is followed if it is a link, ``..`` goes up from
        the canonical directory reached so far, and more than MAX_LINKS links in one walk is ELOOP.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise oserror(errno.ENOENT)
        with self.model.lock:
            self._fresh()
            hit = self._ok.get((path, follow))     # most calls: an already normalized, resolved path
            if hit is not None:
                return hit[0], hit[1]
            try:
                node, canon, _ = self._resolve(_norm(path), follow, 0)
            except _Fail as f:
                raise oserror(f.code) from None
            return node, canon

    def _resolve(self, path: str, follow: bool, depth: int) -> _Res:
        key = (path, follow)
        hit = self._ok.get(key)
        if hit is not None:
            return hit
        bad = self._bad.get(key)
        if bad is not None:
            raise _Fail(*bad)
        try:
            res = self._resolve_uncached(path, follow, depth)
        except _Fail as f:
            if f.cacheable:
                self._bad[key] = (f.code, f.links)
            raise
        self._ok[key] = res
        return res

    def _resolve_uncached(self, path: str, follow: bool, depth: int) -> _Res:
        # ``path`` is normalized: "/" or "/a/b" without empty components. The parent is resolved (and
        # memoized) first, with links followed, as the walk follows every non-final component.
        if path == "/":
            return self._root, "/", 0
        cut = path.rfind("/")
        name = path[cut + 1:]
        pnode, pcanon, plinks = self._resolve(path[:cut] or "/", True, depth)
        if name == ".":
            return pnode, pcanon, plinks
        if name == "..":
            if pcanon == "/":
                return pnode, pcanon, plinks
            # A canonical path holds no links, so its parent is found without following any.
            up, ucanon, _ = self._resolve(pcanon[:pcanon.rfind("/")] or "/", True, depth)
            return up, ucanon, plinks
        if not isinstance(pnode, Dir):
            raise _Fail(errno.ENOTDIR, plinks)
        child = self._entries(pcanon, pnode).get(name)
        if child is None:
            raise _Fail(errno.ENOENT, plinks)
        if isinstance(child, Link) and follow:
            links = plinks + 1
            if links > MAX_LINKS:
                raise _Fail(errno.ELOOP, links)
            if depth >= MAX_LINKS:      # a cycle of links: ELOOP, but not a fact about the keys on the way
                raise _Fail(errno.ELOOP, MAX_LINKS + 1, cacheable=False)
            target = child.target
            tpath = _norm(target if target.startswith("/") else (pcanon if pcanon != "/" else "") + "/" + target)
            try:
                node, canon, tlinks = self._resolve(tpath, True, depth + 1)
            except _Fail as f:
                total = links + f.links
                raise _Fail(errno.ELOOP if total > MAX_LINKS else f.code, total, f.cacheable) from None
            total = links + tlinks
            if total > MAX_LINKS:
                raise _Fail(errno.ELOOP, total)
            return node, canon, total
        return child, (pcanon if pcanon != "/" else "") + "/" + name, plinks

    # ------------------------------------------------------------------ the OsFs interface

    def listdir(self, path: str) -> list[str]:
        node, canon = self._walk(path, True)
        if not isinstance(node, Dir):
            raise oserror(errno.ENOTDIR)
        with self.model.lock:
            return list(self._entries(canon, node))

    def kind(self, path: str) -> str | None:
        try:
            node, _ = self._walk(path, False)
        except OSError:
            return None
        return "l" if isinstance(node, Link) else "d" if isinstance(node, Dir) else "f"

    def exists(self, path: str) -> bool:
        try:
            self._walk(path, True)
        except OSError:
            return False
        return True

    def read_entry(self, path: str) -> list[Any] | None:
        """The agent's per-path read in one resolution; the same answers as its kind()+readlink()/read()."""
        try:
            node, _ = self._walk(path, False)
        except OSError:
            return None
        if isinstance(node, Link):
            return ["l", node.target, None]
        if isinstance(node, Dir):
            return ["d", None, None]
        if node.show is None or not node.mode & 0o444:
            return ["e", None, errno.EACCES]
        try:
            with self.model.lock:
                return ["f", node.show(), None]
        except OSError as exc:
            return ["e", None, exc.errno]

    def readlink(self, path: str) -> str:
        node, _ = self._walk(path, False)
        if not isinstance(node, Link):
            raise oserror(errno.EINVAL)
        return node.target

    def stat(self, path: str, follow: bool = False) -> tuple[str, int]:
        """(kind, permission bits) for the FUSE front-end."""
        node, _ = self._walk(path, follow)
        if isinstance(node, Link):
            return "l", 0o777
        if isinstance(node, Dir):
            return "d", 0o755
        return "f", node.mode

    def check_open(self, path: str, read: bool, write: bool) -> None:
        """sysfs's open-time check: EACCES when the attribute lacks the mode bits or the operation."""
        node, _ = self._walk(path, True)
        if isinstance(node, Dir) and not write:
            return                              # a directory opens for reading (listing)
        _attr_for(node, read, write)

    def read(self, path: str) -> str:
        show = _attr_for(self._walk(path, True)[0], read=True, write=False).show
        assert show is not None                 # _attr_for checked it
        with self.model.lock:
            return show()

    def write(self, path: str, value: str) -> None:
        store = _attr_for(self._walk(path, True)[0], read=False, write=True).store
        assert store is not None                # _attr_for checked it
        if len(value.encode("utf-8")) > PAGE_SIZE:
            raise oserror(errno.E2BIG)
        if not value:
            return                              # sysfs_kf_write: a zero-length write never reaches store()
        with self.model.lock:
            store(value)

    # ------------------------------------------------------------------ /sys

    def _mdev_loaded(self) -> bool:
        return any(g.spec.mode in ("mdev", "mdev-sriov", "gvtg") for g in self.model.gpus.values())

    def _sys(self) -> dict[str, Node]:
        return {"bus": Dir(self._bus), "class": Dir(self._class), "devices": Dir(self._devices),
                "kernel": Dir(self._kernel), "module": Dir(dict)}

    def _bus(self) -> dict[str, Node]:
        out: dict[str, Node] = {"pci": Dir(self._bus_pci)}
        if self._mdev_loaded():
            out["mdev"] = Dir(self._bus_mdev)
        return out

    def _bus_pci(self) -> dict[str, Node]:
        m = self.model
        return {
            "devices": Dir(lambda: {d.addr: Link(_rel("/sys/bus/pci/devices", d.sysfs_dir))
                                    for d in m.devices.values()}),
            "drivers": Dir(lambda: {drv: Dir(self._pci_driver(drv)) for drv in sorted(m.drivers)}),
            "drivers_probe": Attr(store=m.probe),
            "drivers_autoprobe": _const("1\n"),
            "rescan": Attr(store=_noop),
            "slots": Dir(dict),
            "uevent": Attr(store=_noop),
        }

    def _pci_driver(self, drv: str) -> Callable[[], dict[str, Node]]:
        m = self.model
        here = f"/sys/bus/pci/drivers/{drv}"

        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {
                "bind": Attr(store=lambda v: m.bind(drv, v)),
                "unbind": Attr(store=lambda v: m.unbind(drv, v)),
                "new_id": Attr(store=lambda v: m.new_id(drv, v)),
                "remove_id": Attr(store=lambda v: m.remove_id(drv, v)),
                "uevent": Attr(store=_noop),
            }
            for d in m.devices.values():
                if d.driver == drv:
                    out[d.addr] = Link(_rel(here, d.sysfs_dir))
            return out
        return fill

    def _bus_mdev(self) -> dict[str, Node]:
        m = self.model

        def drivers() -> dict[str, Node]:
            names = sorted({g.table.mdev_driver for g in m.gpus.values() if g.spec.mode != "vendor"})
            return {n: Dir(self._mdev_driver(n)) for n in names}
        return {
            "devices": Dir(lambda: {u: Link(_rel("/sys/bus/mdev/devices", self._mdev_dir(md)))
                                    for u, md in m.mdevs.items()}),
            "drivers": Dir(drivers),
            "drivers_autoprobe": _const("1\n"),
            "drivers_probe": Attr(store=_noop),
            "uevent": Attr(store=_noop),
        }

    def _mdev_driver(self, name: str) -> Callable[[], dict[str, Node]]:
        m = self.model
        here = f"/sys/bus/mdev/drivers/{name}"

        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {"uevent": Attr(store=_noop)}
            for u, md in m.mdevs.items():
                g = m.devices[md.parent].gpu
                if g is not None and g.table.mdev_driver == name:
                    out[u] = Link(_rel(here, self._mdev_dir(md)))
            return out
        return fill

    def _class(self) -> dict[str, Node]:
        m = self.model
        out: dict[str, Node] = {}
        if self._mdev_loaded():
            out["mdev_bus"] = Dir(lambda: {d.addr: Link(_rel("/sys/class/mdev_bus", d.sysfs_dir))
                                           for d in m.mdev_parents()})
        if m.iommu:
            out["iommu"] = Dir(lambda: {"dmar0": Link("../../devices/virtual/iommu/dmar0")})
        return out

    # ------------------------------------------------------------------ /sys/devices

    def _devices(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for parent in sorted(self._children):
            parts = parent.split("/")
            if len(parts) == 4 and parts[3].startswith("pci"):
                out[parts[3]] = Dir(self._root_complex(parent))
        out["system"] = Dir(self._system)
        out["virtual"] = Dir(self._virtual)
        return out

    def _root_complex(self, path: str) -> Callable[[], dict[str, Node]]:
        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {"uevent": _const("")}
            for d in self._children.get(path, []):
                out[d.addr] = Dir(self._device(d))
            return out
        return fill

    def _virtual(self) -> dict[str, Node]:
        if not self.model.iommu:
            return {}
        return {"iommu": Dir(lambda: {"dmar0": Dir(lambda: {"uevent": _const("")})})}

    def _device(self, d: Dev) -> Callable[[], dict[str, Node]]:
        return lambda: self._device_entries(d)

    def _device_entries(self, d: Dev) -> dict[str, Node]:
        m = self.model
        spec = d.spec
        here = d.sysfs_dir
        dev_id = m.device_id(d)
        cls = spec.pci_class
        out: dict[str, Node] = {
            "vendor": _const(f"0x{spec.vendor:04x}\n"),
            "device": _const(f"0x{dev_id:04x}\n"),
            "subsystem_vendor": _const(f"0x{spec.subsystem_vendor:04x}\n"),
            "subsystem_device": _const(f"0x{spec.subsystem_device:04x}\n"),
            "class": _const(f"0x{cls:06x}\n"),
            "revision": _const(f"0x{spec.revision:02x}\n"),
            "driver_override": Attr(show=lambda: f"{d.override or '(null)'}\n",
                                    store=lambda v: m.set_override(d, v)),
            "numa_node": Attr(show=lambda: f"{d.numa_node}\n", store=lambda v: self._set_numa(d, v)),
            "local_cpulist": Attr(show=lambda: format_cpulist(self._local_cpus(d)) + "\n"),
            "local_cpus": Attr(show=lambda: _bitmap(self._local_cpus(d), self._ncpus()) + "\n"),
            "modalias": _const(f"pci:v{spec.vendor:08X}d{dev_id:08X}sv{spec.subsystem_vendor:08X}"
                               f"sd{spec.subsystem_device:08X}bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}"
                               f"i{cls & 0xFF:02X}\n"),
            "uevent": Attr(show=lambda: self._uevent(d), store=_noop),
            "subsystem": Link(_rel(here, "/sys/bus/pci")),
        }
        if (cls >> 8) == 0x0300:
            out["boot_vga"] = _const("1\n" if spec.boot_vga else "0\n")
        if spec.reset_method:
            out["reset_method"] = Attr(show=lambda: d.reset_method + "\n" if d.reset_method else "",
                                       store=lambda v: self._set_reset_method(d, v))
            out["reset"] = Attr(store=self._reset)
        if d.driver is not None:
            out["driver"] = Link(_rel(here, f"/sys/bus/pci/drivers/{d.driver}"))
        if d.group is not None:
            out["iommu_group"] = Link(_rel(here, f"/sys/kernel/iommu_groups/{d.group}"))
            out["iommu"] = Link(_rel(here, "/sys/devices/virtual/iommu/dmar0"))
        if spec.is_bridge:
            kids = self._children.get(here, [])
            sec = kids[0].spec.address.bus if kids else (spec.address.bus + 1) & 0xFF
            out["pci_bus"] = Dir(lambda: {f"{spec.address.domain:04x}:{sec:02x}": Dir(dict)})
        if d.physfn is not None:
            out["physfn"] = Link(_rel(here, m.devices[d.physfn].sysfs_dir))
        elif spec.sriov is not None:
            sriov = spec.sriov
            out.update({
                "sriov_totalvfs": _const(f"{sriov.totalvfs}\n"),
                "sriov_numvfs": Attr(show=lambda: f"{d.numvfs}\n", store=lambda v: m.set_numvfs(d, v)),
                "sriov_offset": _const(f"{sriov.offset}\n"),
                "sriov_stride": _const(f"{sriov.stride}\n"),
                "sriov_vf_device": _const(f"{sriov.vf_device:x}\n"),
                "sriov_drivers_autoprobe": Attr(show=lambda: f"{int(d.autoprobe)}\n",
                                                store=lambda v: self._set_autoprobe(d, v)),
            })
            for vf in m.vfs(d):
                out[f"virtfn{vf.vf_index}"] = Link(_rel(here, vf.sysfs_dir))
        table = m.mdev_table(d)
        if table is not None:
            out["mdev_supported_types"] = Dir(lambda: {t.sysfs_id: Dir(self._type_dir(d, t)) for t in table.types})
            for md in m.mdevs_of(d.addr):
                out[md.uuid] = Dir(self._mdev(md))
        if m.is_vendor_vf(d):
            out["nvidia"] = Dir(lambda: {
                "creatable_vgpu_types": Attr(show=lambda: self._creatable(d)),
                "current_vgpu_type": Attr(show=lambda: f"{d.vendor_type}\n",
                                          store=lambda v: m.set_vendor_type(d, v)),
            })
        for child in self._children.get(here, []):
            out[child.addr] = Dir(self._device(child))
        return out

    def _creatable(self, vf: Dev) -> str:
        rows = "".join(f"{t.number:<5d} : {t.name}\n" for t in self.model.creatable(vf))
        return "ID    : vGPU Name\n" + rows

    def _type_dir(self, parent: Dev, t: VgpuType) -> Callable[[], dict[str, Node]]:
        m = self.model

        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {
                "name": _const(t.name + "\n"),
                "device_api": _const(t.device_api + "\n"),
                "available_instances": Attr(show=lambda: f"{m.available(parent, t)}\n"),
                "create": Attr(store=lambda v: self._create(parent, t, v)),
                "devices": Dir(lambda: {md.uuid: Link(f"../../../{md.uuid}") for md in m.mdevs_of(parent.addr)
                                        if md.type.sysfs_id == t.sysfs_id}),
            }
            if t.description:
                out["description"] = _const(t.description)
            return out
        return fill

    def _create(self, parent: Dev, t: VgpuType, value: str) -> None:
        self.model.create_mdev(parent, t, value)

    def _mdev_dir(self, md: Mdev) -> str:
        return f"{self.model.devices[md.parent].sysfs_dir}/{md.uuid}"

    def _mdev(self, md: Mdev) -> Callable[[], dict[str, Node]]:
        m = self.model
        here = self._mdev_dir(md)
        parent = m.devices[md.parent]
        gpu = parent.gpu
        assert gpu is not None

        def set_params(v: str) -> None:
            md.vgpu_params = v.strip()

        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {
                "remove": Attr(store=lambda v: m.remove_mdev(md.uuid, v)),
                "mdev_type": Link(f"../mdev_supported_types/{md.type.sysfs_id}"),
                "driver": Link(_rel(here, f"/sys/bus/mdev/drivers/{gpu.table.mdev_driver}")),
                "iommu_group": Link(_rel(here, f"/sys/kernel/iommu_groups/{md.group}")),
                "subsystem": Link(_rel(here, "/sys/bus/mdev")),
                "uevent": Attr(show=lambda: f"DRIVER={gpu.table.mdev_driver}\nMDEV_TYPE={md.type.sysfs_id}\n",
                               store=_noop),
            }
            if gpu.table.driver == "nvidia":
                out["nvidia"] = Dir(lambda: {"vgpu_params": Attr(show=lambda: md.vgpu_params + "\n"
                                                                 if md.vgpu_params else "", store=set_params)})
            elif gpu.table.driver == "i915":
                out["intel_vgpu"] = Dir(lambda: {"vgpu_id": _const(f"{md.gvt_id}\n")})
            return out
        return fill

    def _uevent(self, d: Dev) -> str:
        s = d.spec
        lines = [f"DRIVER={d.driver}"] if d.driver else []
        lines += [f"PCI_CLASS={s.pci_class:X}", f"PCI_ID={s.vendor:04X}:{self.model.device_id(d):04X}",
                  f"PCI_SUBSYS_ID={s.subsystem_vendor:04X}:{s.subsystem_device:04X}", f"PCI_SLOT_NAME={d.addr}"]
        return "\n".join(lines) + "\n"

    def _set_numa(self, d: Dev, value: str) -> None:
        n = kstrtoint(value, 0)
        if n != -1 and n not in {node.id for node in self.model.profile.nodes}:
            raise oserror(errno.EINVAL)
        d.numa_node = n
        self.model.bump()

    def _set_autoprobe(self, d: Dev, value: str) -> None:
        d.autoprobe = kstrtobool(value)
        self.model.bump()

    def _set_reset_method(self, d: Dev, value: str) -> None:
        v = value[:-1] if value.endswith("\n") else value
        supported = d.spec.reset_method.split() if d.physfn is None else ["flr"]
        if v == "default":
            d.reset_method = " ".join(supported)
        elif v.strip() == "":
            d.reset_method = ""
        else:
            methods = v.split()
            if any(x not in supported for x in methods):
                raise oserror(errno.EINVAL)
            d.reset_method = " ".join(methods)
        self.model.bump()

    @staticmethod
    def _reset(value: str) -> None:
        if kstrtoul(value, 0) != 1:
            raise oserror(errno.EINVAL)

    def _ncpus(self) -> int:
        return max((max(n.cpus) for n in self.model.profile.nodes if n.cpus), default=0) + 1

    def _online(self) -> frozenset[int]:
        out: set[int] = set()
        for n in self.model.profile.nodes:
            out |= n.cpus
        return frozenset(out)

    def _local_cpus(self, d: Dev) -> frozenset[int]:
        for n in self.model.profile.nodes:
            if n.id == d.numa_node:
                return n.cpus
        return self._online()

    # ------------------------------------------------------------------ /sys/devices/system

    def _system(self) -> dict[str, Node]:
        return {"node": Dir(self._nodes), "cpu": Dir(self._cpus)}

    def _nodes(self) -> dict[str, Node]:
        nodes = self.model.profile.nodes
        ids = format_cpulist([n.id for n in nodes]) + "\n"
        out: dict[str, Node] = {"online": _const(ids), "possible": _const(ids), "has_cpu": _const(ids),
                                "has_memory": _const(ids), "has_normal_memory": _const(ids)}
        for n in nodes:
            dist = " ".join("10" if o.id == n.id else "21" for o in nodes) + "\n"
            mem_kb = n.memory_mib * 1024
            hp_kb = sum(size * cnt for size, cnt in self.model.hugepages[n.id].items())
            meminfo = (f"Node {n.id} MemTotal:       {mem_kb:>8d} kB\n"
                       f"Node {n.id} MemFree:        {max(0, mem_kb - hp_kb) // 2:>8d} kB\n"
                       f"Node {n.id} HugePages_Total: {self.model.hugepages[n.id].get(2048, 0):5d}\n")
            out[f"node{n.id}"] = Dir(self._node(n.id, n.cpus, dist, meminfo))
        return out

    def _node(self, nid: int, cpus: frozenset[int], dist: str, meminfo: str) -> Callable[[], dict[str, Node]]:
        def fill() -> dict[str, Node]:
            return {"cpulist": _const(format_cpulist(cpus) + "\n"),
                    "cpumap": _const(_bitmap(cpus, self._ncpus()) + "\n"),
                    "distance": _const(dist), "meminfo": _const(meminfo),
                    "hugepages": Dir(lambda: {f"hugepages-{size}kB": Dir(self._hugepages(size, nid))
                                              for size in sorted(self.model.hugepages[nid])})}
        return fill

    def _hugepages(self, size: int, node: int | None) -> Callable[[], dict[str, Node]]:
        m = self.model

        def total() -> int:
            if node is None:
                return sum(h.get(size, 0) for h in m.hugepages.values())
            return m.hugepages[node].get(size, 0)

        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {
                "nr_hugepages": Attr(show=lambda: f"{total()}\n", store=lambda v: m.set_hugepages(size, node, v)),
                "free_hugepages": Attr(show=lambda: f"{total()}\n"),
                "surplus_hugepages": _const("0\n"),
            }
            if node is None:
                out["resv_hugepages"] = _const("0\n")
                out["nr_overcommit_hugepages"] = Attr(show=lambda: f"{m.overcommit[size]}\n",
                                                      store=lambda v: self._set_overcommit(size, v))
            return out
        return fill

    def _set_overcommit(self, size: int, value: str) -> None:
        self.model.overcommit[size] = kstrtoul(value, 0)
        self.model.bump()

    def _cpus(self) -> dict[str, Node]:
        prof = self.model.profile
        online = self._online()
        text = format_cpulist(online) + "\n"
        out: dict[str, Node] = {"online": _const(text), "possible": _const(text), "present": _const(text)}
        sockets = len(prof.nodes)
        threads = prof.threads_per_core
        per_thread = len(online) // threads if threads else len(online)
        cores = per_thread // sockets if sockets else per_thread
        for c in sorted(online):
            rem = c % per_thread if per_thread else c
            package = rem // cores if cores else 0
            siblings = frozenset(t * per_thread + rem for t in range(threads))
            topo: dict[str, Node] = {"core_id": _const(f"{rem % cores if cores else 0}\n"),
                    "physical_package_id": _const(f"{package}\n"),
                    "thread_siblings_list": _const(format_cpulist(siblings) + "\n"),
                    "core_cpus_list": _const(format_cpulist(siblings) + "\n")}
            out[f"cpu{c}"] = Dir(self._cpu_dir(topo))
        return out

    @staticmethod
    def _cpu_dir(topo: dict[str, Node]) -> Callable[[], dict[str, Node]]:
        return lambda: {"topology": Dir(lambda: dict(topo))}

    # ------------------------------------------------------------------ /sys/kernel

    def _kernel(self) -> dict[str, Node]:
        sizes = sorted(self.model.overcommit)
        return {"iommu_groups": Dir(self._groups),
                "mm": Dir(lambda: {"hugepages": Dir(lambda: {
                    f"hugepages-{size}kB": Dir(self._hugepages(size, None)) for size in sizes})})}

    def _groups(self) -> dict[str, Node]:
        m = self.model
        out: dict[str, Node] = {}
        mdev_names = set(m.mdevs)
        for n, members in sorted(m.groups().items()):
            here = f"/sys/kernel/iommu_groups/{n}/devices"
            links: dict[str, Node] = {}
            for name in members:
                if name in mdev_names:
                    links[name] = Link(_rel(here, self._mdev_dir(m.mdevs[name])))
                else:
                    links[name] = Link(_rel(here, m.devices[name].sysfs_dir))
            out[str(n)] = Dir(self._group_dir(links, all(x in mdev_names for x in members)))
        return out

    @staticmethod
    def _group_dir(links: dict[str, Node], emulated: bool) -> Callable[[], dict[str, Node]]:
        # mdev groups are emulated (no IOMMU domain behind them).
        return lambda: {
            "devices": Dir(lambda: dict(links)),
            "type": _const("unknown\n" if emulated else "DMA-FQ\n"),
            "reserved_regions": _const("" if emulated else "0x00000000fee00000 0x00000000feefffff msi\n"),
        }
