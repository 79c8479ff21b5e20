"""The host's CPUs and free hugepages, read in the inventory's one round trip, for the plan's pre-flight.

:data:`RESOURCE_GLOBS` ride along in ``INVENTORY_GLOBS``; :func:`host_resources` is a pure function of the
snapshot. What the kernel says is the truth here: ``free_hugepages`` per size, system-wide
(``/sys/kernel/mm/hugepages``) and per NUMA node (``/sys/devices/system/node/nodeN/hugepages``), the online
CPUs and each node's CPUs, each CPU's SMT siblings (``thread_siblings_list``: gaming VMs take whole cores),
and the default page size (``default_hugepagesz=`` on the kernel command line, else 2 MiB, the x86-64
default) that a domain's bare ``<hugepages/>`` takes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Snapshot
from vgpuvirt.model import parse_cpulist
from vgpuvirt.services.pci.sysfs import PROC_CMDLINE

CPU_ONLINE = "/sys/devices/system/cpu/online"
NODES = "/sys/devices/system/node"
HUGEPAGES = "/sys/kernel/mm/hugepages"

RESOURCE_GLOBS: tuple[str, ...] = (
    CPU_ONLINE,
    "/sys/devices/system/cpu/cpu*/topology/thread_siblings_list",
    f"{NODES}/node*/cpulist",
    f"{NODES}/node*/hugepages/hugepages-*/free_hugepages",
    f"{HUGEPAGES}/hugepages-*/free_hugepages",
)
DEFAULT_PAGE_KB = 2048
_SIZE_RE = re.compile(r"^hugepages-(\d+)kB$")
_NODE_RE = re.compile(r"^node(\d+)$")
_CMDLINE_SIZE = re.compile(r"(?:^|\s)default_hugepagesz=(\d+)([KkMmGg]?)(?:\s|$)")


@dataclass(frozen=True)
class HostResources:
    """CPUs and free hugepages as read. ``online_cpus`` None: the tree does not say (nothing is checked)."""

    online_cpus: frozenset[int] | None = None
    node_cpus: dict[int, frozenset[int]] = field(default_factory=dict)
    #: (node, page size kB) -> free pages; node None is the system-wide count.
    free_pages: dict[tuple[int | None, int], int] = field(default_factory=dict)
    default_page_kb: int = DEFAULT_PAGE_KB
    #: CPU -> the CPUs of its core (SMT siblings, itself included); empty: the tree does not say
    siblings: dict[int, frozenset[int]] = field(default_factory=dict)

    def free(self, size_kb: int, node: int | None = None) -> int | None:
        """Free pages of ``size_kb`` (on ``node``, or system-wide); None when the size is not known here."""
        return self.free_pages.get((node, size_kb))

    @property
    def page_sizes(self) -> list[int]:
        return sorted({size for (node, size) in self.free_pages if node is None})


def _page_kb(name: str) -> int | None:
    m = _SIZE_RE.match(name)
    return int(m[1]) if m else None


def default_page_kb(cmdline: str | None) -> int:
    m = _CMDLINE_SIZE.search(cmdline or "")
    if not m:
        return DEFAULT_PAGE_KB
    scale = {"": 1 / 1024, "k": 1, "m": 1024, "g": 1024 * 1024}[m[2].lower()]
    return int(int(m[1]) * scale) or DEFAULT_PAGE_KB


def host_resources(snap: Snapshot) -> HostResources:
    """Parse the resource part of a snapshot (pure). Unreadable or odd files are left out, never guessed."""
    online: frozenset[int] | None = None
    text = snap.text(CPU_ONLINE)
    if text is not None:
        try:
            online = parse_cpulist(text)
        except InvalidSpec:
            online = None
    node_cpus: dict[int, frozenset[int]] = {}
    for path in snap.glob(f"{NODES}/node*/cpulist"):
        m = _NODE_RE.match(path.split("/")[-2])
        cpus = snap.text(path)
        if m and cpus is not None:
            try:
                node_cpus[int(m[1])] = parse_cpulist(cpus)
            except InvalidSpec:
                continue
    free: dict[tuple[int | None, int], int] = {}
    for path in snap.glob(f"{HUGEPAGES}/hugepages-*/free_hugepages"):
        size, n = _page_kb(path.split("/")[-2]), snap.int(path)
        if size is not None and n is not None:
            free[(None, size)] = n
    for path in snap.glob(f"{NODES}/node*/hugepages/hugepages-*/free_hugepages"):
        parts = path.split("/")
        m, size, n = _NODE_RE.match(parts[-4]), _page_kb(parts[-2]), snap.int(path)
        if m and size is not None and n is not None:
            free[(int(m[1]), size)] = n
    siblings: dict[int, frozenset[int]] = {}
    for path in snap.glob("/sys/devices/system/cpu/cpu*/topology/thread_siblings_list"):
        name, text = path.split("/")[-3], snap.text(path)
        if not name[3:].isdigit() or text is None:
            continue
        try:
            siblings[int(name[3:])] = parse_cpulist(text)
        except InvalidSpec:
            continue
    return HostResources(online, node_cpus, free, default_page_kb(snap.text(PROC_CMDLINE)), siblings)
