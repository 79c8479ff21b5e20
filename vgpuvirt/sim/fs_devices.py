"""The simulated PCI and mdev tree: ``/sys/bus``, ``/sys/class`` and the device directories."""

from __future__ import annotations

import errno
from collections.abc import Callable

from vgpuvirt.model import format_cpulist
from vgpuvirt.sim.fs_nodes import Attr, Dir, Link, Node, _bitmap, _const, _noop, _rel
from vgpuvirt.sim.fs_system import SystemTree
from vgpuvirt.sim.kstrto import kstrtobool, kstrtoint, kstrtoul, oserror
from vgpuvirt.sim.model import Dev, Mdev
from vgpuvirt.sim.profiles import VgpuType


class DeviceTree(SystemTree):
    """The device part of :class:`~vgpuvirt.sim.fs.SimFs`'s tree, from ``/sys`` down."""

    _children: dict[str, list[Dev]]
    _module: Callable[[], dict[str, Node]]      # /sys/module, from fs_etc.EtcTree

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
