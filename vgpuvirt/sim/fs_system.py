"""The simulated ``/sys/devices/system`` (NUMA nodes, CPUs) and ``/sys/kernel`` (IOMMU groups, hugepages).

The CPU and node facts here also feed the PCI device directories (:mod:`.fs_devices`).
"""

from __future__ import annotations

from collections.abc import Callable

from vgpuvirt.model import format_cpulist
from vgpuvirt.sim.fs_nodes import Attr, Dir, Link, Node, _bitmap, _const, _rel
from vgpuvirt.sim.kstrto import kstrtoul
from vgpuvirt.sim.model import Dev, Mdev, SimModel


class SystemTree:
    """The system-wide part of :class:`~vgpuvirt.sim.fs.SimFs`'s tree."""

    model: SimModel

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
