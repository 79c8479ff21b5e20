"""``apply(plan, hosts, conn)``: run a provisioning plan on the one change engine (:mod:`vgpuvirt.change.runner`).

Per host, in this order (hosts in parallel, one thread and one libvirt connection each): every host step of the
host (create vGPU, set VF type, mixed-size mode) in ONE locked batch, then each libvirt step in plan order
(volumes, ``define``, ``start``). A plan is one change: on any failure every host's completed steps are undone
in reverse and :class:`~vgpuvirt.errors.ProvisioningError` says what was done and what the rollback did. Only
journaled steps are undone; after a cut batch, only devices absent when the plan was made
(``plan.absent_before``) are removed.
"""

from __future__ import annotations

from collections.abc import Mapping

from vgpuvirt.change.runner import Conns, Hosts, Progress, Report, Runner, run_hosts
from vgpuvirt.provision.plan import Plan


def apply(plan: Plan, hosts: Hosts, conn: Conns, *, progress: Progress | None = None, parallel: bool = True,
          wait_timeout: float = 10.0, prior: Mapping[str, Runner] | None = None) -> Report:
    """Run ``plan``; on any failure roll back every host's completed steps (and what ``prior``, the runners of a
    preparation the plan was made after, did) and raise ProvisioningError."""
    return run_hosts({h: plan.for_host(h) for h in plan.hosts}, hosts, conn, what="provisioning", progress=progress,
                     parallel=parallel, wait_timeout=wait_timeout,
                     ours={h: plan.absent_before.get(h, frozenset()) for h in plan.hosts},
                     kept=[f"{k.host}: {k.what}" for k in plan.kept], prior=prior)
