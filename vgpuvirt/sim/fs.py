"""The simulated sysfs: a filesystem view computed from a :class:`~vgpuvirt.sim.model.SimModel`.

:class:`SimFs` offers the duck-typed interface of ``vgpuvirt.host.agent.OsFs`` (``listdir``,
``kind``, ``exists``, ``readlink``, ``read``, ``write``), so the batch agent runs against it
unchanged. Paths are host paths (``/sys/bus/pci/devices/...``); symlinks anywhere in a path resolve
like the kernel's (relative targets, ``..`` against the link's real directory). Errors are
``OSError(errno, strerror)`` as the kernel gives them: ENOENT, ENOTDIR, EISDIR, EINVAL for
readlink of a non-link, and EACCES for reading a write-only attribute or writing a read-only one
(sysfs refuses such opens even for root, see docs/sim.md).

The nodes are in :mod:`.fs_nodes`; :class:`SimFs` walks paths and opens attributes, then builds, in this order,
the device tree (``/sys/bus``, ``/sys/class``, ``/sys/devices``), the system-wide tree (NUMA, CPUs, IOMMU groups,
hugepages), and ``/etc``, ``/proc`` and the NVML calls of the agent's ``nvml`` op.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from vgpuvirt.model import format_cpulist
from vgpuvirt.sim.devices import gpu_uuid
from vgpuvirt.sim.fs_etc import DRIVER_FILE, MODPROBE_DIR, STATE_DIR, check_driver_version
from vgpuvirt.sim.fs_nodes import (
    MAX_LINKS,
    PAGE_SIZE,
    Attr,
    Dir,
    FsFail,
    Link,
    Node,
    Resolved,
    attr_for,
    bitmap,
    const,
    noop,
    norm_path,
    rel_link,
)
from vgpuvirt.sim.kstrto import kstrtobool, kstrtoint, kstrtoul, oserror
from vgpuvirt.sim.model import Dev, Mdev, SimModel
from vgpuvirt.sim.nvml_migration import MIGRATION_CALLS, answer
from vgpuvirt.sim.profiles import VgpuType

_T = TypeVar("_T")

__all__ = ["MAX_LINKS", "PAGE_SIZE", "Attr", "Dir", "Link", "Node", "SimFs"]


class SimFs:
    """The agent-compatible filesystem of one simulated host."""

    def __init__(self, model: SimModel) -> None:
        self.model = model
        self._version = -1
        self._dircache: dict[str, dict[str, Node]] = {}
        self._children: dict[str, list[Dev]] = {}
        # Path resolutions of the current model version, keyed by (normalized path, follow final link):
        # a full inventory read resolves ~60,000 paths, nearly all sharing their parent with the last one.
        self._ok: dict[tuple[str, bool], Resolved] = {}
        self._bad: dict[tuple[str, bool], tuple[int, int]] = {}
        # Nodes that stay valid across model versions, kept per device or mdev object (see _kept_nodes).
        self._kept: dict[tuple[str, int, int], tuple[Dev | Mdev, Any]] = {}
        # /proc/sys/kernel/random/boot_id: a new one after each simulated reboot, as on Linux
        boot_id = Attr(lambda: self.model.boot_id + "\n")
        random: dict[str, Node] = {"boot_id": boot_id}
        proc: dict[str, Node] = {"sys": Dir(lambda: {"kernel": Dir(lambda: {"random": Dir(lambda: random)})}),
                                 "cmdline": Attr(lambda: self._cmdline() + "\n"),
                                 "driver": Dir(self._proc_driver)}
        files = self.model.state_files
        state = Dir(lambda: {n: Attr(show=lambda n=n: files[n], mode=0o600) for n in sorted(files)})  # type: ignore[misc]
        # the simulated package database: the vGPU manager version installed (what `sim install-driver` writes)
        pkg = Dir(lambda: {"driver_version": Attr(
            show=lambda: (self.model.installed_driver or self.model.driver_version) + "\n", mode=0o644)})
        var: dict[str, Node] = {"lib": Dir(lambda: {"vgpuvirt": state, "vgpuvirt-sim": pkg})}
        self._root = Dir(lambda: {"sys": Dir(self._sys), "etc": Dir(self._etc), "proc": Dir(lambda: proc),
                                  "var": Dir(lambda: var)})

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
            if self._kept:
                self._kept = {k: v for k, v in self._kept.items() if self._alive(v[0])}

    def _alive(self, owner: Dev | Mdev) -> bool:
        if isinstance(owner, Mdev):
            return self.model.mdevs.get(owner.uuid) is owner
        return self.model.devices.get(owner.addr) is owner

    def _kept_nodes(self, kind: str, owner: Dev | Mdev, other: object, make: Callable[[], _T]) -> _T:
        """What ``make()`` builds for ``owner`` (and ``other``), built once while ``owner`` is the model's.

        A model change drops every directory listing and resolution (``_fresh``), and each walk after it used to
        build its directories' nodes anew: a provisioning's create-then-check batch rebuilt the same device
        directories after each write, most of a fleet's allocations in the simulator. Kept here is only what is a
        pure function of the owner object's fixed fields (its spec, address, parent, type) and of ``other``; what
        a change can alter (a driver link, the mdevs of a parent, VF links) is built at each listing, and an
        attribute's text is computed at each read, from live state, as before. Dropped when the owner leaves the
        model (a VF disabled, an mdev removed, a reboot's new devices)."""
        key = (kind, id(owner), id(other))
        hit = self._kept.get(key)
        if hit is None:
            hit = self._kept[key] = (owner, (other, make()))
        return cast(_T, hit[1][1])

    def _entries(self, path: str, node: Dir) -> dict[str, Node]:
        # A listing is only read, never changed: a fill may hand out the same dict at every model version.
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
                node, canon, _ = self._resolve(norm_path(path), follow, 0)
            except FsFail as f:
                raise oserror(f.code) from None
            return node, canon

    def _resolve(self, path: str, follow: bool, depth: int) -> Resolved:
        key = (path, follow)
        hit = self._ok.get(key)
        if hit is not None:
            return hit
        bad = self._bad.get(key)
        if bad is not None:
            raise FsFail(*bad)
        try:
            res = self._resolve_uncached(path, follow, depth)
        except FsFail as f:
            if f.cacheable:
                self._bad[key] = (f.code, f.links)
            raise
        self._ok[key] = res
        return res

    def _resolve_uncached(self, path: str, follow: bool, depth: int) -> Resolved:
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
            raise FsFail(errno.ENOTDIR, plinks)
        child = self._entries(pcanon, pnode).get(name)
        if child is None:
            raise FsFail(errno.ENOENT, plinks)
        if isinstance(child, Link) and follow:
            links = plinks + 1
            if links > MAX_LINKS:
                raise FsFail(errno.ELOOP, links)
            if depth >= MAX_LINKS:      # a cycle of links: ELOOP, but not a fact about the keys on the way
                raise FsFail(errno.ELOOP, MAX_LINKS + 1, cacheable=False)
            target = child.target
            tpath = norm_path(target if target.startswith("/") else (pcanon if pcanon != "/" else "") + "/" + target)
            try:
                node, canon, tlinks = self._resolve(tpath, True, depth + 1)
            except FsFail as f:
                total = links + f.links
                raise FsFail(errno.ELOOP if total > MAX_LINKS else f.code, total, f.cacheable) from None
            total = links + tlinks
            if total > MAX_LINKS:
                raise FsFail(errno.ELOOP, total)
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
        attr_for(node, read, write)

    def read(self, path: str) -> str:
        show = attr_for(self._walk(path, True)[0], read=True, write=False).show
        assert show is not None                 # attr_for checked it
        with self.model.lock:
            return show()

    def write(self, path: str, value: str) -> None:
        store = attr_for(self._walk(path, True)[0], read=False, write=True).store
        assert store is not None                # attr_for checked it
        if len(value.encode("utf-8")) > PAGE_SIZE:
            raise oserror(errno.E2BIG)
        if not value:
            return                              # sysfs_kf_write: a zero-length write never reaches store()
        with self.model.lock:
            store(value)

    # -- the device tree, from ``/sys`` down ------------------------------------------------------------------------
    # ------------------------------------------------------------------ /sys

    def _mdev_loaded(self) -> bool:
        return any(g.spec.mode in ("mdev", "mdev-sriov", "gvtg") for g in self.model.gpus.values())

    def _sys(self) -> dict[str, Node]:
        return {"bus": Dir(self._bus), "class": Dir(self._class), "devices": Dir(self._devices),
                "kernel": Dir(self._kernel), "module": Dir(self._module)}

    def _bus(self) -> dict[str, Node]:
        out: dict[str, Node] = {"pci": Dir(self._bus_pci)}
        if self._mdev_loaded():
            out["mdev"] = Dir(self._bus_mdev)
        return out

    def _bus_pci(self) -> dict[str, Node]:
        m = self.model
        return {
            "devices": Dir(lambda: {d.addr: Link(rel_link("/sys/bus/pci/devices", d.sysfs_dir))
                                    for d in m.devices.values()}),
            "drivers": Dir(lambda: {drv: Dir(self._pci_driver(drv)) for drv in sorted(m.drivers)}),
            "drivers_probe": Attr(store=m.probe),
            "drivers_autoprobe": const("1\n"),
            "rescan": Attr(store=noop),
            "slots": Dir(dict),
            "uevent": Attr(store=noop),
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
                "uevent": Attr(store=noop),
            }
            for d in m.devices.values():
                if d.driver == drv:
                    out[d.addr] = Link(rel_link(here, d.sysfs_dir))
            return out
        return fill

    def _bus_mdev(self) -> dict[str, Node]:
        m = self.model

        def drivers() -> dict[str, Node]:
            names = sorted({g.table.mdev_driver for g in m.gpus.values() if g.spec.mode != "vendor"})
            return {n: Dir(self._mdev_driver(n)) for n in names}
        return {
            "devices": Dir(lambda: {u: Link(rel_link("/sys/bus/mdev/devices", self._mdev_dir(md)))
                                    for u, md in m.mdevs.items()}),
            "drivers": Dir(drivers),
            "drivers_autoprobe": const("1\n"),
            "drivers_probe": Attr(store=noop),
            "uevent": Attr(store=noop),
        }

    def _mdev_driver(self, name: str) -> Callable[[], dict[str, Node]]:
        m = self.model
        here = f"/sys/bus/mdev/drivers/{name}"

        def fill() -> dict[str, Node]:
            out: dict[str, Node] = {"uevent": Attr(store=noop)}
            for u, md in m.mdevs.items():
                g = m.devices[md.parent].gpu
                if g is not None and g.table.mdev_driver == name:
                    out[u] = Link(rel_link(here, self._mdev_dir(md)))
            return out
        return fill

    def _class(self) -> dict[str, Node]:
        m = self.model
        out: dict[str, Node] = {}
        if self._mdev_loaded():
            out["mdev_bus"] = Dir(lambda: {d.addr: Link(rel_link("/sys/class/mdev_bus", d.sysfs_dir))
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
            out: dict[str, Node] = {"uevent": const("")}
            for d in self._children.get(path, []):
                out[d.addr] = Dir(self._device(d))
            return out
        return fill

    def _virtual(self) -> dict[str, Node]:
        if not self.model.iommu:
            return {}
        return {"iommu": Dir(lambda: {"dmar0": Dir(lambda: {"uevent": const("")})})}

    def _device(self, d: Dev) -> Callable[[], dict[str, Node]]:
        return lambda: self._device_entries(d)

    def _device_entries(self, d: Dev) -> dict[str, Node]:
        m = self.model
        spec = d.spec
        here = d.sysfs_dir
        head, sriov = self._kept_nodes("device", d, None, lambda: self._device_fixed(d))
        out = dict(head)
        if d.driver is not None:
            out["driver"] = Link(rel_link(here, f"/sys/bus/pci/drivers/{d.driver}"))
        if d.group is not None:
            out["iommu_group"] = Link(rel_link(here, f"/sys/kernel/iommu_groups/{d.group}"))
            out["iommu"] = Link(rel_link(here, "/sys/devices/virtual/iommu/dmar0"))
        if spec.is_bridge:
            kids = self._children.get(here, [])
            sec = kids[0].spec.address.bus if kids else (spec.address.bus + 1) & 0xFF
            out["pci_bus"] = Dir(lambda: {f"{spec.address.domain:04x}:{sec:02x}": Dir(dict)})
        out.update(sriov)
        if d.physfn is None and spec.sriov is not None:
            for vf in m.vfs(d):
                out[f"virtfn{vf.vf_index}"] = Link(rel_link(here, vf.sysfs_dir))
        table = m.mdev_table(d)
        if table is not None:
            out["mdev_supported_types"] = self._kept_nodes("types", d, table, lambda: Dir(
                lambda: {t.sysfs_id: Dir(self._type_dir(d, t)) for t in table.types}))
            for md in m.mdevs_of(d.addr):
                out[md.uuid] = Dir(self._mdev(md))
        if m.is_vendor_vf(d):
            out["nvidia"] = self._kept_nodes("nvidia", d, None, lambda: Dir(lambda: {
                "creatable_vgpu_types": Attr(show=lambda: self._creatable(d)),
                "current_vgpu_type": Attr(show=lambda: f"{d.vendor_type}\n",
                                          store=lambda v: m.set_vendor_type(d, v)),
            }))
        for child in self._children.get(here, []):
            out[child.addr] = Dir(self._device(child))
        return out

    def _device_fixed(self, d: Dev) -> tuple[dict[str, Node], dict[str, Node]]:
        """A device directory's entries that its fixed fields decide (spec, address, physfn), in the directory's
        order: those before its driver and IOMMU links, and its SR-IOV ones after them. Kept per device."""
        m = self.model
        spec = d.spec
        here = d.sysfs_dir
        dev_id = m.device_id(d)
        cls = spec.pci_class
        head: dict[str, Node] = {
            "vendor": const(f"0x{spec.vendor:04x}\n"),
            "device": const(f"0x{dev_id:04x}\n"),
            "subsystem_vendor": const(f"0x{spec.subsystem_vendor:04x}\n"),
            "subsystem_device": const(f"0x{spec.subsystem_device:04x}\n"),
            "class": const(f"0x{cls:06x}\n"),
            "revision": const(f"0x{spec.revision:02x}\n"),
            "driver_override": Attr(show=lambda: f"{d.override or '(null)'}\n",
                                    store=lambda v: m.set_override(d, v)),
            "numa_node": Attr(show=lambda: f"{d.numa_node}\n", store=lambda v: self._set_numa(d, v)),
            "local_cpulist": Attr(show=lambda: format_cpulist(self._local_cpus(d)) + "\n"),
            "local_cpus": Attr(show=lambda: bitmap(self._local_cpus(d), self._ncpus()) + "\n"),
            "modalias": const(f"pci:v{spec.vendor:08X}d{dev_id:08X}sv{spec.subsystem_vendor:08X}"
                               f"sd{spec.subsystem_device:08X}bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}"
                               f"i{cls & 0xFF:02X}\n"),
            "uevent": Attr(show=lambda: self._uevent(d), store=noop),
            "subsystem": Link(rel_link(here, "/sys/bus/pci")),
        }
        if (cls >> 8) == 0x0300:
            head["boot_vga"] = const("1\n" if spec.boot_vga else "0\n")
        if spec.reset_method:
            head["reset_method"] = Attr(show=lambda: d.reset_method + "\n" if d.reset_method else "",
                                        store=lambda v: self._set_reset_method(d, v))
            head["reset"] = Attr(store=self._reset)
        sriov: dict[str, Node] = {}
        if d.physfn is not None:
            sriov["physfn"] = Link(rel_link(here, m.devices[d.physfn].sysfs_dir))
        elif spec.sriov is not None:
            sr = spec.sriov
            sriov.update({
                "sriov_totalvfs": const(f"{sr.totalvfs}\n"),
                "sriov_numvfs": Attr(show=lambda: f"{d.numvfs}\n", store=lambda v: m.set_numvfs(d, v)),
                "sriov_offset": const(f"{sr.offset}\n"),
                "sriov_stride": const(f"{sr.stride}\n"),
                "sriov_vf_device": const(f"{sr.vf_device:x}\n"),
                "sriov_drivers_autoprobe": Attr(show=lambda: f"{int(d.autoprobe)}\n",
                                                store=lambda v: self._set_autoprobe(d, v)),
            })
        return head, sriov

    def _creatable(self, vf: Dev) -> str:
        rows = "".join(f"{t.number:<5d} : {t.name}\n" for t in self.model.creatable(vf))
        return "ID    : vGPU Name\n" + rows

    def _type_dir(self, parent: Dev, t: VgpuType) -> Callable[[], dict[str, Node]]:
        m = self.model

        def fill() -> dict[str, Node]:
            return self._kept_nodes("type", parent, t, build)

        def build() -> dict[str, Node]:
            out: dict[str, Node] = {
                "name": const(t.name + "\n"),
                "device_api": const(t.device_api + "\n"),
                "available_instances": Attr(show=lambda: f"{m.available(parent, t)}\n"),
                "create": Attr(store=lambda v: self._create(parent, t, v)),
                "devices": Dir(lambda: {md.uuid: Link(f"../../../{md.uuid}") for md in m.mdevs_of(parent.addr)
                                        if md.type.sysfs_id == t.sysfs_id}),
            }
            if t.description:
                out["description"] = const(t.description)
            return out
        return fill

    def _create(self, parent: Dev, t: VgpuType, value: str) -> None:
        self.model.create_mdev(parent, t, value)

    def _mdev(self, md: Mdev) -> Callable[[], dict[str, Node]]:
        m = self.model
        here = self._mdev_dir(md)
        parent = m.devices[md.parent]
        gpu = parent.gpu
        assert gpu is not None

        def set_params(v: str) -> None:
            md.vgpu_params = v.strip()

        def fill() -> dict[str, Node]:
            return self._kept_nodes("mdev", md, None, build)

        def build() -> dict[str, Node]:
            out: dict[str, Node] = {
                "remove": Attr(store=lambda v: m.remove_mdev(md.uuid, v)),
                "mdev_type": Link(f"../mdev_supported_types/{md.type.sysfs_id}"),
                "driver": Link(rel_link(here, f"/sys/bus/mdev/drivers/{gpu.table.mdev_driver}")),
                "iommu_group": Link(rel_link(here, f"/sys/kernel/iommu_groups/{md.group}")),
                "subsystem": Link(rel_link(here, "/sys/bus/mdev")),
                "uevent": Attr(show=lambda: f"DRIVER={gpu.table.mdev_driver}\nMDEV_TYPE={md.type.sysfs_id}\n",
                               store=noop),
            }
            if gpu.table.driver == "nvidia":
                out["nvidia"] = Dir(lambda: {"vgpu_params": Attr(show=lambda: md.vgpu_params + "\n"
                                                                 if md.vgpu_params else "", store=set_params)})
            elif gpu.table.driver == "i915":
                out["intel_vgpu"] = Dir(lambda: {"vgpu_id": const(f"{md.gvt_id}\n")})
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

    # -- the system-wide tree: NUMA, CPUs, IOMMU groups, hugepages --------------------------------------------------
    def _mdev_dir(self, md: Mdev) -> str:
        return f"{self.model.devices[md.parent].sysfs_dir}/{md.uuid}"

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

    @functools.cached_property
    def _cpu_tree(self) -> dict[str, Node]:
        # the CPUs and their topology are the profile's, fixed for the model's life: built once, not after each
        # change (a gathering reads every CPU's topology)
        return self._cpus_of_profile()

    def _nodes(self) -> dict[str, Node]:
        nodes = self.model.profile.nodes
        ids = format_cpulist([n.id for n in nodes]) + "\n"
        out: dict[str, Node] = {"online": const(ids), "possible": const(ids), "has_cpu": const(ids),
                                "has_memory": const(ids), "has_normal_memory": const(ids)}
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
            return {"cpulist": const(format_cpulist(cpus) + "\n"),
                    "cpumap": const(bitmap(cpus, self._ncpus()) + "\n"),
                    "distance": const(dist), "meminfo": const(meminfo),
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
                "surplus_hugepages": const("0\n"),
            }
            if node is None:
                out["resv_hugepages"] = const("0\n")
                out["nr_overcommit_hugepages"] = Attr(show=lambda: f"{m.overcommit[size]}\n",
                                                      store=lambda v: self._set_overcommit(size, v))
            return out
        return fill

    def _set_overcommit(self, size: int, value: str) -> None:
        self.model.overcommit[size] = kstrtoul(value, 0)
        self.model.bump()

    def _cpus(self) -> dict[str, Node]:
        return self._cpu_tree

    def _cpus_of_profile(self) -> dict[str, Node]:
        prof = self.model.profile
        online = self._online()
        text = format_cpulist(online) + "\n"
        out: dict[str, Node] = {"online": const(text), "possible": const(text), "present": const(text)}
        sockets = len(prof.nodes)
        threads = prof.threads_per_core
        per_thread = len(online) // threads if threads else len(online)
        cores = per_thread // sockets if sockets else per_thread
        for c in sorted(online):
            rem = c % per_thread if per_thread else c
            package = rem // cores if cores else 0
            siblings = frozenset(t * per_thread + rem for t in range(threads))
            topo: dict[str, Node] = {"core_id": const(f"{rem % cores if cores else 0}\n"),
                    "physical_package_id": const(f"{package}\n"),
                    "thread_siblings_list": const(format_cpulist(siblings) + "\n"),
                    "core_cpus_list": const(format_cpulist(siblings) + "\n")}
            out[f"cpu{c}"] = Dir(self._cpu_dir(topo))
        return out

    @staticmethod
    def _cpu_dir(topo: dict[str, Node]) -> Callable[[], dict[str, Node]]:
        entries: dict[str, Node] = {"topology": Dir(lambda: topo)}   # fixed: the same entries at every listing
        return lambda: entries

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
                    links[name] = Link(rel_link(here, self._mdev_dir(m.mdevs[name])))
                else:
                    links[name] = Link(rel_link(here, m.devices[name].sysfs_dir))
            out[str(n)] = Dir(self._group_dir(links, all(x in mdev_names for x in members)))
        return out

    @staticmethod
    def _group_dir(links: dict[str, Node], emulated: bool) -> Callable[[], dict[str, Node]]:
        # mdev groups are emulated (no IOMMU domain behind them).
        return lambda: {
            "devices": Dir(lambda: dict(links)),
            "type": const("unknown\n" if emulated else "DMA-FQ\n"),
            "reserved_regions": const("" if emulated else "0x00000000fee00000 0x00000000feefffff msi\n"),
        }

    # -- /etc, /proc and NVML ----------------------------------------------------------------------------------------
    def _etc(self) -> dict[str, Node]:
        files = self.model.sched.modprobe
        return {"modprobe.d": Dir(lambda: {name: Attr(show=lambda n=name: files[n], mode=0o644)  # type: ignore[misc]
                                           for name in sorted(files)})}

    def _module(self) -> dict[str, Node]:
        # The driver registers its parameters with permission 0: no parameters/ file shows them (they are in
        # /proc/driver/nvidia/params); /sys/module/nvidia/version is there (real H100, R580).
        if "nvidia" not in self.model.drivers:
            return {}
        version = Attr(show=lambda: self.model.driver_version + "\n", mode=0o444)
        return {"nvidia": Dir(lambda: {"version": version})}

    def _proc_driver(self) -> dict[str, Node]:
        if "nvidia" not in self.model.drivers:
            return {}
        v = self.model.driver_version
        # R580's open kernel module line (real H100); the GCC line is INFERRED from that capture's shape
        version = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@)  \n"
                   "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")
        return {"nvidia": Dir(lambda: {
            "version": Attr(show=lambda: version, mode=0o444),
            "params": Attr(show=self.model.sched.proc_params, mode=0o444),
            "gpus": Dir(self._proc_gpus)})}

    def _proc_gpus(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for minor, d in enumerate(sorted((d for d in self.model.devices.values()
                                          if d.spec.vendor == 0x10DE and d.physfn is None
                                          and d.spec.pci_class >> 16 == 0x03 and d.driver == "nvidia"),
                                         key=lambda d: d.addr)):
            # the real R580 layout (tabs and all); IRQ, VBIOS and DMA figures are the real H100's, INFERRED for
            # other boards
            text = (f"Model: \t\t {d.spec.product or 'NVIDIA GPU'}\nIRQ:   \t\t {41 + minor}\n"
                    f"GPU UUID: \t {gpu_uuid(d.addr)}\nVideo BIOS: \t 96.00.da.00.0c\nBus Type: \t PCIe\n"
                    "DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
                    f"Bus Location: \t {d.addr}\nDevice Minor: \t {minor}\n"
                    f"GPU Firmware: \t {self.model.driver_version}\nGPU Excluded:\t No\n")
            info: dict[str, Node] = {"information": Attr(show=lambda t=text: t, mode=0o444)}  # type: ignore[misc]
            out[d.addr] = Dir(lambda i=info: i)  # type: ignore[misc]
        return out

    def _cmdline(self) -> str:
        p = self.model.profile
        if p.cmdline:
            return p.cmdline
        # INFERRED: a typical host's boot line, with the IOMMU switched on when the profile has one
        return "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet" + (" intel_iommu=on iommu=pt" if p.iommu else "")

    def replace_file(self, path: str, value: str, mode: int) -> None:
        """The agent's ``replace_file`` op: only plain file names directly in /etc/modprobe.d and in vgpuvirt's
        state directory exist here."""
        directory, _, name = path.rpartition("/")
        if path == DRIVER_FILE:
            # a package install: the new version waits on disk until the driver is reloaded (a reboot)
            try:
                version = check_driver_version(value)
            except ValueError:
                raise oserror(errno.EINVAL) from None
            with self.model.lock:
                self.model.installed_driver = version
                self.model.bump()
            return
        if directory not in (MODPROBE_DIR, STATE_DIR) or not name or name.startswith("."):
            raise oserror(errno.EROFS)
        with self.model.lock:
            if directory == STATE_DIR:
                self.model.state_files[name] = value
                self.model.bump()
                return
            self.model.sched.modprobe[name] = value
            self.model.bump()

    def remove_file(self, path: str) -> None:
        """The agent's ``remove_file`` op: a file of /etc/modprobe.d or of vgpuvirt's state directory goes (already
        absent is fine)."""
        directory, _, name = path.rpartition("/")
        if directory not in (MODPROBE_DIR, STATE_DIR) or not name or name.startswith("."):
            raise oserror(errno.EROFS)
        with self.model.lock:
            (self.model.state_files if directory == STATE_DIR else self.model.sched.modprobe).pop(name, None)
            self.model.bump()

    def nvml(self, op: dict[str, Any]) -> dict[str, Any]:
        # the migration calls ask about the whole host (its mdevs, driver, boards), the rest is the scheduler's
        if op.get("value") in MIGRATION_CALLS:
            with self.model.lock:
                return answer(self.model, str(op["value"]), [str(a) for a in op.get("argv") or []])
        return self.model.sched.nvml(op)
