#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: host maintenance (docs/mobility.md): cordon, drain, uncordon; thin over vgpuvirt's cordon and
drain (vgpuvirt.services.cordon, vgpuvirt.provision.mobility.drain)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_host
short_description: Cordon, drain or uncordon a GPU host (host maintenance)
description:
  - V(cordoned) marks the target so that every controller's placement (C(vgpuvirt plan), C(provision),
    M(vgpuvirt.kvm_gpu.vgpu_pool), C(migrate)) skips it and says why. The mark lives on the host
    (C(/var/lib/vgpuvirt/cordon.json)), written in its locked, audited batch; it survives a reboot.
  - V(drained) cordons the target and moves its GPU VMs to the hosts in O(to) - running VMs live-migrate, shut-off
    ones move offline - O(parallelism) at a time, each destination checked with the migration's pre-checks
    (board, ECC, vGPU manager version, capacity, cordon) and the least loaded first. A VM no host can take stays
    where it is and fails the task, unless O(shutdown_unmovable) shuts it down (ACPI). The host stays cordoned.
  - V(uncordoned) clears the mark; the host takes VMs again.
  - Check mode reports what would change (the cordon, and for V(drained) where each VM would go) with a diff,
    and changes nothing. A rerun reports no change (a cordoned host with no VMs left to move).
version_added: "0.2.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt (on the target host)
  - libvirt-python (for O(state=drained))
options:
  state:
    description:
      - V(cordoned), V(drained) or V(uncordoned), as above.
    type: str
    choices: [cordoned, drained, uncordoned]
    default: cordoned
  reason:
    description:
      - Why the host is cordoned (one printable line of at most 200 characters), shown wherever placement skips it.
      - Required for V(cordoned); V(drained) defaults to C(drained). A host already cordoned for another reason
        gets the new one.
    type: str
  uri:
    description:
      - The target's libvirt URI (its VMs). Required for V(drained).
    type: str
  to:
    description:
      - The hosts the VMs may go to (V(drained)). Each is checked with the migration's pre-checks; a cordoned one
        takes nothing.
    type: list
    elements: dict
    suboptions:
      name:
        description:
          - The host's name in vgpuvirt's records (the C(host_name) its VMs were made with). Used for a C(local)
            host; an C(ssh://) host is named by its address.
        type: str
        required: true
      host:
        description:
          - How the target reaches that host's GPUs, a vgpuvirt host spec - C(ssh://[user@]host[:port]) on a real
            fleet (the target's root must be able to SSH there, as libvirt's peer-to-peer migration needs anyway),
            or C(local) for a tree on the target itself (O(to[].sysfs_root); tests and simulated hosts).
        type: str
        required: true
      uri:
        description:
          - That host's libvirt URI, as the target reaches it (for example C(qemu+ssh://root@gpu2/system)).
        type: str
        required: true
      peer_uri:
        description:
          - The URI the target's libvirtd uses to reach that host's libvirtd (peer-to-peer); default O(to[].uri).
        type: str
      sysfs_root:
        description: That host's tree below this directory.
        type: path
        default: /
  parallelism:
    description: Migrations at once (V(drained)), 1 to 64.
    type: int
    default: 2
  shutdown_unmovable:
    description:
      - Shut down (ACPI) the running VMs no host in O(to) can take, instead of failing with them still running.
    type: bool
    default: false
  identity:
    description: SSH private key for the O(to) hosts given as C(ssh://).
    type: path
  known_hosts:
    description: known_hosts file for the O(to) hosts given as C(ssh://) (host keys are always verified).
    type: path
  sysfs_root:
    description: Read and write the target's tree below this directory (tests, simulated hosts).
    type: path
    default: /
  host_name:
    description: The name the target goes by in messages and records (default the target's hostname).
    type: str
attributes:
  check_mode:
    support: full
    description: Reports the cordon it would set or clear and, for V(drained), the plan (each VM's destination).
  diff_mode:
    support: full
    description: Before and after are the cordon's reason and each VM's host.
notes:
  - One inventory read per host and one round of libvirt queries per host for the plan; each migration re-reads
    its two hosts and reserves the destination's vGPUs under its lock. See docs/mobility.md.
  - The running VMs live-migrate; none is stopped unless O(shutdown_unmovable) is set.
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_layout
  - module: vgpuvirt.kvm_gpu.vgpu_pool
"""

EXAMPLES = r"""
- name: Take gpu1 out for a vGPU manager upgrade
  vgpuvirt.kvm_gpu.vgpu_host:
    state: cordoned
    reason: vGPU manager upgrade

- name: Move its VMs to gpu2 and gpu3 (live), two at a time
  vgpuvirt.kvm_gpu.vgpu_host:
    state: drained
    reason: vGPU manager upgrade
    uri: qemu:///system
    to:
      - name: gpu2
        host: ssh://root@gpu2
        uri: qemu+ssh://root@gpu2/system
      - name: gpu3
        host: ssh://root@gpu3
        uri: qemu+ssh://root@gpu3/system
    parallelism: 2

- name: Back in service
  vgpuvirt.kvm_gpu.vgpu_host:
    state: uncordoned
"""

RETURN = r"""
cordon:
  description: The cordon mark after the task (in check mode, the one it would leave); null when not cordoned.
  returned: always
  type: dict
  sample: {"reason": "vGPU manager upgrade", "by": "ansible", "since": "2026-11-26T13:40:00Z"}
plan:
  description: Where each VM goes (V(drained)) - C(vm), C(live), C(dest) (null - no host can take it),
    C(candidates) and C(refusals) (host - reasons).
  returned: state=drained
  type: list
  elements: dict
fates:
  description: What became of each VM (V(drained), not in check mode) - C(vm), C(fate) (C(migrated),
    C(moved-offline), C(shut-down), C(stays), C(failed)), C(dest), C(detail), C(seconds).
  returned: state=drained
  type: list
  elements: dict
round_trips:
  description: Round trips per host during the drain.
  returned: state=drained
  type: dict
"""

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    HAS_VGPUVIRT,
    new_module,
    run_module,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.errors import InvalidSpec

TO_SPEC = dict(
    name=dict(type="str", required=True),
    host=dict(type="str", required=True),
    uri=dict(type="str", required=True, no_log=False),        # no secret: see docs/ansible.md "Secrets"
    peer_uri=dict(type="str", no_log=False),
    sysfs_root=dict(type="path", default="/"),
)
ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["cordoned", "drained", "uncordoned"], default="cordoned"),
    reason=dict(type="str"),
    uri=dict(type="str", no_log=False),
    to=dict(type="list", elements="dict", options=TO_SPEC),
    parallelism=dict(type="int", default=2),
    shutdown_unmovable=dict(type="bool", default=False),
    identity=dict(type="path"),
    known_hosts=dict(type="path"),
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
)
MODULE_KWARGS = dict(
    required_if=[("state", "cordoned", ("reason",)), ("state", "drained", ("uri", "to"))],
    supports_check_mode=True,
)
#: Who a cordon is recorded as set by.
BY = "ansible"


def open_libvirt(uri):
    """A libvirt connection (imported late: libvirt is an extra; unit tests replace this hook)."""
    from vgpuvirt.libvirt_conn import LibvirtConnection

    return LibvirtConnection(uri)


def open_destination(module, to):
    """One ``to`` entry's Host (unit tests replace this hook)."""
    from vgpuvirt.host.local import LocalHost
    from vgpuvirt.hosts import open_host as open_spec

    if to["host"] == "local":
        return LocalHost(to["sysfs_root"], name=to["name"])
    if not to["host"].startswith("ssh://"):
        raise InvalidSpec("to[].host", to["host"], "ssh://[user@]host[:port] or local")
    return open_spec(to["host"], sysfs_root=to["sysfs_root"], identity=module.params["identity"],
                     known_hosts=module.params["known_hosts"])


def _cordon_dict(c):
    return c.to_dict() if c is not None else None


def set_mark(module, host, reason):
    """Cordon (``reason``) or uncordon (None): changed only when the mark differs."""
    from vgpuvirt.services.cordon import check_reason, read_cordon, set_cordon

    if reason is not None:
        reason = check_reason(reason)      # bad input is refused before anything is read or written
    before = read_cordon(host)
    same = (before is None) if reason is None else (before is not None and before.reason == reason)
    diff = dict(before=dict(cordon=before.reason if before else None), after=dict(cordon=reason))
    if same:
        return dict(changed=False, cordon=_cordon_dict(before), diff=dict(before=diff["before"], after=diff["before"]))
    if module.check_mode:
        would = None if reason is None else dict(reason=reason, by=BY, since=None)
        return dict(changed=True, cordon=would, diff=diff)
    dummy, after = set_cordon(host, reason, by=BY)
    return dict(changed=True, cordon=_cordon_dict(after), diff=diff)


def drained(module, host):
    from vgpuvirt.provision.mobility import Side
    from vgpuvirt.provision.mobility.drain import drain
    from vgpuvirt.services.cordon import check_reason, read_cordon

    p = module.params
    reason = check_reason(p["reason"] or "drained")
    names = [t["name"] for t in p["to"]]
    if not names or len(set(names)) != len(names) or host.name in names:
        raise InvalidSpec("to", names, f"distinct hosts other than {host.name}")
    opened = []
    try:
        source = Side(host, open_libvirt(p["uri"]))
        opened.append(source.conn)
        others = []
        peers = {}
        for t in p["to"]:
            h = open_destination(module, t)
            opened.append(h)
            c = open_libvirt(t["uri"])
            opened.append(c)
            others.append(Side(h, c))
            if t["peer_uri"]:
                peers[h.name] = t["peer_uri"]
        before = read_cordon(host)
        # the plan first (a dry run changes nothing): check mode's answer, and the real run's "nothing to do"
        dry = drain(source, others, parallel=p["parallelism"], dry_run=True, reason=reason, peer_uris=peers)
        vms_before = {m.vm: host.name for m in dry.plan.moves}
        cordon_same = before is not None and before.reason == reason
        if module.check_mode or (cordon_same and not dry.plan.moves):
            vms_after = {m.vm: m.dest or host.name for m in dry.plan.moves}
            return dict(changed=not cordon_same or bool(dry.plan.moves),
                        cordon=_cordon_dict(before) if cordon_same else dict(reason=reason, by=BY, since=None),
                        plan=dry.plan.to_dict()["moves"], fates=[], round_trips=dry.round_trips,
                        diff=dict(before=dict(cordon=before.reason if before else None, vms=vms_before),
                                  after=dict(cordon=reason, vms=vms_after)))
        result = drain(source, others, parallel=p["parallelism"], shutdown_unmovable=p["shutdown_unmovable"],
                       reason=reason, peer_uris=peers)
    finally:
        for o in reversed(opened):
            if o is not host:
                o.close()
    fates = [f.to_dict() for f in result.fates]
    vms_after = {f.vm: f.dest or host.name for f in result.fates}
    out = dict(changed=True, cordon=_cordon_dict(read_cordon(host)), plan=result.plan.to_dict()["moves"],
               fates=fates, round_trips=result.round_trips,
               diff=dict(before=dict(cordon=before.reason if before else None, vms=vms_before),
                         after=dict(cordon=reason, vms=vms_after)))
    if not result.ok:
        stuck = [f"{f.vm}: {f.fate} ({f.detail})" for f in result.fates
                 if f.fate not in ("migrated", "moved-offline", "shut-down")]
        module.fail_json(msg=f"{host.name} is cordoned but not drained: " + "; ".join(stuck), **out)
    return out


def run(module, host):
    p = module.params
    if p["state"] == "drained":
        return drained(module, host)
    return set_mark(module, host, p["reason"] if p["state"] == "cordoned" else None)


def main():
    module = new_module(ARGUMENT_SPEC, **MODULE_KWARGS)
    run_module(module, open_host, run)


if __name__ == "__main__":
    main()
