"""Whose is this vGPU? What teardown checks before it removes a device a domain's metadata lists.

Provenance metadata is plain XML inside the domain: whoever can define a domain can copy another's.
So metadata only says which devices to *consider*. A device is removed for domain D only when

1. its creation record says it was made for D (:meth:`DeviceStep.not_made_for`): an mdev's UUID is
   derived from D's name, which copied metadata cannot fake; a vGPU 17+ VF, which has no
   name-derived identity, must be a hostdev of D itself; and
2. no other domain uses it, in its live XML or in its persistent XML (libvirt's view of every
   domain, read after D was destroyed; a domain whose XML cannot be read counts as a user).

A device that fails (1) is not D's: it is refused and does not hold D back. One that passes (1) but
another domain uses is D's and still due: D stays defined, so a rerun can finish once it is free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpuvirt.change.step import DeviceStep
from vgpuvirt.xml.refs import DomainRefs, domain_device_refs


@dataclass(frozen=True)
class Verdict:
    step: DeviceStep
    refusal: str | None = None       # why the device is left; None: remove it
    blocks: bool = False             # True: D's own device, still due (D stays defined for a rerun)


def domain_refs(views: Mapping[str, Sequence[str]]) -> dict[str, DomainRefs]:
    """Each domain's devices, merged over its XML views; an unreadable view sets ``error``."""
    out: dict[str, DomainRefs] = {}
    for name, xmls in views.items():
        parsed = [domain_device_refs(x) for x in xmls]
        out[name] = DomainRefs(frozenset().union(*(r.mdevs for r in parsed)),
                               frozenset().union(*(r.pci for r in parsed)),
                               next((r.error for r in parsed if r.error), None))
    return out


def judge(vm: str, steps: Sequence[DeviceStep], refs: Mapping[str, DomainRefs]) -> list[Verdict]:
    """One verdict per device ``vm``'s metadata lists, against every domain's devices."""
    own = refs.get(vm, DomainRefs())
    out: list[Verdict] = []
    for s in steps:
        holders = sorted(n if s.used_by(r) else f"{n} (its XML cannot be read)"
                         for n, r in refs.items() if n != vm and (s.used_by(r) or r.error))
        held = "; held by domain " + ", ".join(holders) if holders else "; no other domain holds it"
        why = s.not_made_for(own)
        if why is not None:
            out.append(Verdict(s, f"refused to remove vGPU {s.target} listed in {vm}'s metadata: {why}{held}; "
                                  "left in place"))
        elif holders:
            out.append(Verdict(s, f"vGPU {s.target} of {vm} is used by domain {', '.join(holders)} "
                                  f"(live or persistent XML): left in place, {vm} kept defined so that a rerun "
                                  "can finish", blocks=True))
        else:
            out.append(Verdict(s))
    return out
