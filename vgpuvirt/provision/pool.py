"""A pool of VMs counted across a fleet: ``count`` members named ``PREFIX-01`` .. ``PREFIX-NN``, placed on
whichever hosts have room, with the library's own placement over every host at once.

This is what the Ansible ``vgpu_pool`` action plugin runs on the controller. Ansible gives it each host's
*survey* (what the ``vgpu_info`` module returns with ``survey: true``: the host's raw sysfs reads and the
libvirt domains recorded for it); :func:`place_pool` rebuilds every host's inventory from those reads (the
same pure :func:`~vgpuvirt.services.inventory.build.build_inventory` the host itself uses), plans the whole
pool in one go, and says which members each host must hold. Each host then plans and applies its share in
ONE module run (one SSH session per host, however many VMs), re-reading its state first, so a plan made from
a survey is never applied blindly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.change.domain import DefineDomain
from vgpuvirt.errors import InvalidSpec, NoCapacity
from vgpuvirt.host.base import Host
from vgpuvirt.host.snapshot import Snapshot
from vgpuvirt.provision.placement import Policy
from vgpuvirt.provision.plan import Plan, domain_meta, plan
from vgpuvirt.provision.request import VmRequest

#: Member names: PREFIX-01 .. PREFIX-99, PREFIX-100 ... (the index keeps at least two digits, so a pool
#: that grows past 99 keeps the names it has).
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,60}")
SURVEY_VERSION = 1


def check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise InvalidSpec("pool name", prefix, "letters, digits, '_', '.' or '-' (at most 61), not starting with "
                                               "a punctuation mark")
    return prefix


def member_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:02d}"


def member_index(prefix: str, name: str) -> int | None:
    """The index of pool member ``name`` (``PREFIX-07`` -> 7), None when it is no member of this pool."""
    m = re.fullmatch(re.escape(prefix) + r"-(\d{2,})", name)
    if m is None or (len(m[1]) > 2 and m[1].startswith("0")):
        return None
    return int(m[1])


def members(prefix: str, count: int) -> list[str]:
    if not isinstance(count, int) or isinstance(count, bool) or count < 0 or count > 10000:
        raise InvalidSpec("pool count", count, "an integer from 0 to 10000")
    return [member_name(check_prefix(prefix), i) for i in range(1, count + 1)]


def own_domains(pairs: Iterable[tuple[str, str]], host_name: str) -> list[tuple[str, str]]:
    """The (name, xml) pairs that belong to ``host_name``: vgpuvirt's metadata names it, or the domain has
    none (a foreign domain of this host). Several test hosts may share one libvirt daemon."""
    out = []
    for name, xml in pairs:
        meta = domain_meta(xml)
        if meta is None or meta.get("host") in (host_name, None):
            out.append((name, xml))
    return out


# ------------------------------------------------------------------------------------------------ surveys


@dataclass(frozen=True)
class Survey:
    """One host as the pool's placement sees it: its name, its raw inventory reads, its libvirt domains."""

    host: str
    snapshot: Snapshot
    domains: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"version": SURVEY_VERSION, "host": self.host, "snapshot": self.snapshot.to_wire(),
                "domains": [[n, x] for n, x in self.domains]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "survey") -> Survey:
        """Validate what came back from a host (a fact: data, never trusted as code)."""
        if not isinstance(data, Mapping) or data.get("version") != SURVEY_VERSION:
            raise InvalidSpec(source, type(data).__name__, f"a vgpuvirt survey of version {SURVEY_VERSION} "
                                                           "(vgpu_info with survey: true)")
        host, wire, doms = data.get("host"), data.get("snapshot"), data.get("domains")
        if not isinstance(host, str) or not host or not isinstance(wire, Mapping) or not isinstance(doms, list):
            raise InvalidSpec(source, "survey", "host (a name), snapshot (a mapping) and domains (a list)")
        try:
            snap = Snapshot.from_wire({str(p): (str(e[0]), e[1], e[2]) for p, e in wire.items()}, host=host)
            pairs = tuple((str(n), str(x)) for n, x in doms)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InvalidSpec(source, "survey", f"well-formed reads and (name, xml) domain pairs ({exc})") from None
        return cls(host, snap, pairs)


def take_survey(host: Host, domain_pairs: Iterable[tuple[str, str]], *, name: str | None = None) -> Survey:
    """Read what placement needs from ``host`` in ONE round trip (the inventory's sysfs reads, kept raw: the
    controller builds the inventory). ``name``: the host's name in the domains' metadata (default ``host.name``)."""
    from vgpuvirt.services.inventory.host_read import Want, read_host

    name = name or host.name
    return Survey(name, read_host(host, {Want.SYSFS}).snapshot, tuple(own_domains(domain_pairs, name)))


# ------------------------------------------------------------------------------------------------ placement


@dataclass
class PoolPlan:
    """The pool across the fleet: which members each host holds (kept or placed there) and the fleet plan."""

    prefix: str
    count: int
    shares: dict[str, list[str]] = field(default_factory=dict)     # host -> member names it must hold
    surplus: dict[str, list[str]] = field(default_factory=dict)    # host -> members beyond ``count`` to remove
    plan: Plan | None = None
    unreachable: list[str] = field(default_factory=list)           # hosts that could not be surveyed
    held: list[str] = field(default_factory=list)                  # members not placed: maybe on those hosts

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.prefix, "count": self.count, "shares": self.shares, "surplus": self.surplus,
                "per_host": {h: len(v) for h, v in self.shares.items()},
                "unreachable": self.unreachable, "held": self.held,
                "steps": [s.describe() for s in self.plan.steps] if self.plan else [],
                "assignments": self.plan.to_dict()["assignments"] if self.plan else []}


def place_pool(surveys: Sequence[Survey], prefix: str, count: int, template: VmRequest, *,
               policy: Policy = "binpack", unreachable: Sequence[str] = ()) -> PoolPlan:
    """Place ``count`` members across the surveyed hosts. ``template`` is one member's request (its name is
    replaced). Members that exist are kept where they are; the missing ones are placed fleet-wide; members
    beyond ``count`` are listed as surplus on the host that holds them. Pure: touches no host.

    ``unreachable``: hosts of the pool that could not be surveyed. What they hold is unknown, not nothing:
    a member missing from the surveyed hosts may be running there, so it is ``held`` (not placed anywhere)
    until every host answers again; the members found stay where they are and the surplus found is removed.
    Placing them elsewhere would leave two desktops of one name when the host comes back."""
    from dataclasses import replace

    from vgpuvirt.services.inventory.build import build_inventory

    names = members(prefix, count)
    if not surveys:
        raise InvalidSpec("pool hosts", [], "at least one surveyed host")
    hosts = [s.host for s in surveys]
    gone = sorted(set(unreachable) - set(hosts))
    dup = sorted(h for h, k in Counter(hosts).items() if k > 1)
    if dup:
        raise InvalidSpec("pool hosts", dup, "distinct host names (set host_name per host)")
    invs = {s.host: build_inventory(s.snapshot, host=s.host, domains=s.domains) for s in surveys}
    domains = {s.host: list(s.domains) for s in surveys}
    out = PoolPlan(prefix, count, {h: [] for h in hosts}, {h: [] for h in hosts}, unreachable=gone)
    found: set[str] = set()
    for s in surveys:
        for name, _ in s.domains:
            i = member_index(prefix, name)
            if i is not None and i > count:
                out.surplus[s.host].append(name)
            elif i is not None:
                found.add(name)
    if gone:
        out.held = [n for n in names if n not in found]
        names = [n for n in names if n in found]
    reqs = [replace(template, name=n) for n in names]
    try:
        p = plan(invs, reqs, domains=domains, policy=policy)
    except NoCapacity as exc:
        raise NoCapacity(", ".join(hosts), f"pool {prefix} of {count}", f"does not fit the fleet: {exc}") from None
    if p.prep:
        raise NoCapacity(", ".join(hosts), prefix, "the pool fits only after SR-IOV is enabled: "
                         + ", ".join(pr.describe() for pr in p.prep) + " (vgpuvirt sriov enable, then rerun)")
    where: dict[str, str] = {a.vm: a.host for a in p.assignments}
    where.update({k.vm: k.host for k in p.kept if isinstance(k.step, DefineDomain)})
    for n in names:
        out.shares[where[n]].append(n)
    out.plan = p
    return out
