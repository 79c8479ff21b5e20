#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: a pool of VMs counted across the play's hosts (with its action plugin, which places it)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_pool
short_description: A pool of VMs with vGPUs counted across the play's hosts, placed fleet-wide
description:
  - Keeps O(count) VMs named C(NAME-01), C(NAME-02), ... across every host of the play - "20 desktops across the
    fleet", not per host. Members that exist stay where they are; the missing ones go where vgpuvirt's placement
    (binpack or spread, over all hosts at once) finds room; members numbered above O(count) are removed.
  - Runs in two parts. The collection's C(vgpu_pool) action plugin runs on the controller, reads each play host's
    survey (the fact C(vgpuvirt_survey), from M(vgpuvirt.kvm_gpu.vgpu_info) with
    O(vgpuvirt.kvm_gpu.vgpu_info#module:survey=true) in an earlier task), places the whole pool, and passes each
    host its share in O(placed). The module then runs once on each host - one SSH session per host, however many
    VMs - reads the host again, runs the same pre-flight as C(vgpuvirt provision) (networks, storage pools, the
    golden image, firmware, hugepages, CPUs), plans its share and applies it in one batch, with everything it did
    undone when a step fails.
  - A host of the play that cannot be reached (or whose survey failed) is unknown, not empty - members missing
    from the other hosts may be on it, so none is created elsewhere until it answers again (the task warns and
    lists them in C(fleet.held)); when it is back, the next run finds its members where they are. A play run
    with C(--limit) is treated the same way - the hosts it leaves out may hold members.
  - The controller needs the C(vgpuvirt) package too (the action plugin imports it to place the pool).
  - V(absent) needs no survey - each host removes the members it holds. Without O(host_name) the members are
    found by the host name their ownership records (vgpuvirt's domain metadata) carry; when the libvirt daemon
    holds members recorded for several hosts, the task refuses and asks for O(host_name).
  - Every option of a O(gpus) entry is optional, as in M(vgpuvirt.kvm_gpu.vgpu_domain).
  - Check mode plans and reports (C(plan), C(members), the diff) without touching a host or libvirt.
version_added: "0.2.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt with its libvirt extra on the target hosts, and vgpuvirt on the controller
options:
  name:
    description:
      - The pool's name; its members are C(NAME-01) .. C(NAME-99), C(NAME-100) ...
    type: str
    required: true
  count:
    description:
      - How many members across all the play's hosts. Ignored with O(state=absent).
    type: int
    default: 0
  state:
    description:
      - V(defined) - the members and their vGPUs exist; power states are left as they are. The default, because a
        vGPU VM cannot start without VFIO (test machines, simulated GPUs).
      - V(running) - defined, and started.
      - V(absent) - no member of this pool on the host, nor the vGPUs vgpuvirt created for them.
    type: str
    choices: [defined, running, absent]
    default: defined
  template:
    description: C(vdi), C(gaming), C(compute), or the path of your own template on the target.
    type: str
    default: vdi
  memory_mib:
    description: Memory of each member in MiB.
    type: int
    default: 4096
  vcpus:
    description: vCPUs of each member.
    type: int
    default: 2
  disk:
    description:
      - Each member's disk image on the target, C({name}) standing for the member's name
        (C(/var/lib/libvirt/images/{name}.qcow2)). Checked by the pre-flight - a path inside an active storage
        pool's directory must be a volume of that pool. Mutually exclusive with O(clone).
    type: str
  clone:
    description:
      - Give each member a qcow2 linked clone of a golden image, created as a volume of a libvirt storage pool
        (the pre-flight checks the pool is active and the golden image is a volume libvirt knows). Mutually
        exclusive with O(disk).
    type: dict
    suboptions:
      golden:
        description: The golden image's path on the target (a volume of a storage pool).
        type: str
        required: true
      pool:
        description: The libvirt storage pool the clones are created in.
        type: str
        required: true
      name:
        description: The clone's volume name, C({name}) standing for the member's name.
        type: str
        default: "{name}.qcow2"
      capacity_gib:
        description: The guest disk's size in GiB (default - the golden image's).
        type: int
  domain_options:
    description:
      - Template switches passed to vgpuvirt's domain builder (C(hugepages), C(hyperv), ...).
      - The NICs, TPM, secure boot and graphics have options of their own (O(networks), O(bridges), O(tpm),
        O(secure_boot), O(graphics)); a key set both ways is refused.
    type: dict
  policy:
    description: How members spread over the fleet's GPUs - V(binpack) fills GPUs (and hosts) in turn, V(spread)
      evens them out.
    type: str
    choices: [binpack, spread]
    default: binpack
  uri:
    description: The libvirt URI on each host.
    type: str
    default: qemu:///system
  sysfs_root:
    description: Read and write sysfs below this directory instead of C(/) (a FUSE-mounted simulator).
    type: path
    default: /
  host_name:
    description:
      - The name vgpuvirt records in the domains; the action plugin sets it to the name the host's survey gave.
      - With O(state=absent), the host whose members are removed (default - the one name the members' records
        carry on this libvirt daemon).
    type: str
  placed:
    description:
      - The members this host must hold. Set by the action plugin from its fleet-wide placement; not for playbooks.
    type: list
    elements: str
attributes:
  check_mode:
    support: full
    description: The fleet placement and each host's plan are computed and returned; nothing changes.
  diff_mode:
    support: full
    description: Before and after show the pool's members on the host with their states.
  action:
    support: full
    description: Placement runs on the controller (action plugin C(vgpu_pool)).
extends_documentation_fragment:
  - vgpuvirt.kvm_gpu.gpu_request
  - vgpuvirt.kvm_gpu.provisioning
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_info
  - module: vgpuvirt.kvm_gpu.vgpu_domain
"""

EXAMPLES = r"""
- name: What every hypervisor holds (one SSH session per host)
  vgpuvirt.kvm_gpu.vgpu_info:
    survey: true
    host_name: "{{ inventory_hostname }}"

- name: 20 desktops with a 2 GiB Q-series vGPU, across the fleet (one batched apply per host)
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: vdi
    count: 20
    gpus: [{min_framebuffer_mib: 2048, series: Q}]
    host_name: "{{ inventory_hostname }}"

- name: The same pool, started (needs VFIO on the hosts)
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: vdi
    count: 20
    state: running
    gpus: [{min_framebuffer_mib: 2048, series: Q}]

- name: 20 desktops with a Q-series vGPU each, on linked clones of a golden image
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: vdi
    count: 20
    gpus: [{series: Q}]
    clone:
      golden: /var/lib/libvirt/images/golden-win11.qcow2
      pool: default

- name: 20 desktops on the libvirt network vdi-net, with a TPM and VNC
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: vdi
    count: 20
    gpus: [{series: Q}]
    networks: [vdi-net]
    tpm: true
    graphics: vnc

- name: 8 licensed Linux desktops (the token file copied to each host first, with no_log)
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: lic
    count: 8
    gpus: [{series: Q}]
    license:
      token_file: /etc/vgpuvirt/client_configuration_token.tok
      feature: vws

- name: 4 desktops of a given vGPU type, each with its own disk file
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: lab
    count: 4
    gpus: [{type: nvidia-231}]
    disk: /var/lib/libvirt/images/{name}.qcow2

- name: Remove the pool everywhere
  vgpuvirt.kvm_gpu.vgpu_pool:
    name: vdi
    state: absent
"""

RETURN = r"""
members:
  description: The pool's members on this host after the task (as they would be, in check mode), name to state.
  returned: success
  type: dict
  sample: {"vdi-01": "defined", "vdi-04": "defined"}
plan:
  description:
    - The steps on this host, one line each.
    - A licensed member's seed step names the token's SHA-256, never the token.
  returned: success
  type: list
  elements: str
removed:
  description: What was (or would be) removed - members above O(count), or all of them with O(state=absent).
  returned: success
  type: list
  elements: str
fleet:
  description:
    - The fleet-wide placement the action plugin made - members per host, the shares, every assignment.
    - C(unreachable) lists the play's hosts that did not answer, C(held) the members not placed because they may
      be on those hosts.
  returned: when O(state) is not V(absent)
  type: dict
diff:
  description: Before and after.
  returned: success
  type: dict
"""

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    HAS_VGPUVIRT,
    new_module,
    run_module,
)
from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.pool import (
    ARGUMENT_SPEC,
    MODULE_KWARGS,
    member_request,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    # open_host and open_libvirt stay names of this module: unit tests replace them
    from vgpuvirt.ansible_support import open_libvirt
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.errors import InvalidSpec, NoCapacity, ProvisioningError
    from vgpuvirt.provision import apply, plan, teardown
    from vgpuvirt.provision.plan import domain_meta
    from vgpuvirt.provision.pool import check_prefix, member_index, own_domains
    from vgpuvirt.services.inventory.read import inventory


def recorded_host(prefix, doms):
    """The host whose members O(state=absent) removes when no host_name is given: the one name the pool's
    members on this libvirt daemon record as theirs. Several names (hosts sharing a daemon): refused."""
    names = sorted({(domain_meta(d.xml) or {}).get("host") for d in doms if member_index(prefix, d.name) is not None}
                   - {None})
    if len(names) > 1:
        raise InvalidSpec("host_name", None, f"the host whose members of pool {prefix} to remove: this libvirt "
                                             f"holds members recorded for {', '.join(names)}")
    return names[0] if names else None


def run(module, host, conn):
    p = module.params
    prefix = check_prefix(p["name"])
    if p["count"] < 0:
        raise InvalidSpec("count", p["count"], "0 or more members")
    doms = conn.domains()
    active = {d.name: d.active for d in doms}
    owner = host.name     # the name the members' records carry; teardown removes only what they record for it
    if p["state"] == "absent" and not p["host_name"]:
        owner = recorded_host(prefix, doms) or owner
    own = own_domains([(d.name, d.xml) for d in doms], owner)
    mine = {n: ("running" if active.get(n) else "defined") for n, dummy in own if member_index(prefix, n) is not None}
    before = dict(sorted(mine.items()))
    if p["state"] == "absent":
        wanted, remove = [], sorted(mine)
    else:
        if p["placed"] is None:
            module.fail_json(msg=f"vgpu_pool {prefix}: no placement (the option placed): call it as "
                                 "vgpuvirt.kvm_gpu.vgpu_pool, whose action plugin places the pool")
        wanted = list(p["placed"])
        bad = [n for n in wanted if (member_index(prefix, n) or p["count"] + 1) > p["count"]]
        if bad:
            raise InvalidSpec("placed", bad, f"members {prefix}-01 .. of pool {prefix} of {p['count']}")
        remove = sorted(n for n in mine if (member_index(prefix, n) or 0) > p["count"])
    steps, pl = [], None
    if wanted:
        reqs = [member_request(p, n) for n in wanted]
        inv = inventory(host, domains=own, use_nvml=False)
        # the CLI's pre-flight: networks, storage pools and golden images, firmware, hugepages, CPUs
        pl = plan([inv], reqs, domains={host.name: own}, policy=p["policy"], libvirt={host.name: conn.facts()})
        if pl.prep:
            raise NoCapacity(host.name, prefix, "needs SR-IOV first: " + "; ".join(x.describe() for x in pl.prep))
        steps = [s.describe() for s in pl.steps]
    removed = [f"remove {n}" for n in remove]
    if not module.check_mode:
        if pl is not None and pl.steps:
            apply(pl, host, conn)        # one batch per phase on this host; a failure rolls back what it did
        if remove:
            res = teardown({owner: host}, conn, remove)
            if res.failed:
                module.fail_json(msg="; ".join(res.failed), teardown=res.to_dict(), plan=steps)
            removed = res.removed
    after = {n: s for n, s in mine.items() if n not in remove}
    for n in wanted:
        after[n] = "running" if p["state"] == "running" or after.get(n) == "running" else "defined"
    after = dict(sorted(after.items()))
    changed = bool(steps or remove)
    return dict(changed=changed, members=after, plan=steps, removed=removed,
                placement=[dict(vm=a.vm, gpu=str(a.gpu), slot=str(a.slot), kind=a.kind, type=a.type.id,
                                type_name=a.type.name) for a in (pl.assignments if pl else [])],
                diff=dict(before=dict(members=before), after=dict(members=after)))


def main():
    module = new_module(ARGUMENT_SPEC, **MODULE_KWARGS)
    run_module(module, open_host, run, open_libvirt=open_libvirt, carried=(ProvisioningError,))


if __name__ == "__main__":
    main()
