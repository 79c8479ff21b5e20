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
  - Runs in two parts. The C(vgpu_pool) action plugin (C(examples/ansible/action_plugins)) runs on the controller,
    reads each play host's survey (the fact C(vgpuvirt_survey), from C(vgpu_info) with O(vgpu_info#module:survey=true)
    in an earlier task), places the whole pool, and passes each host its share in O(placed). The module then runs
    once on each host - one SSH session per host, however many VMs - reads the host again, plans its share and
    applies it in one batch, with everything it did undone when a step fails.
  - The controller needs the C(vgpuvirt) package too (the action plugin imports it to place the pool).
  - V(absent) needs no survey - each host removes the members it holds.
  - Check mode plans and reports (C(plan), C(members), the diff) without touching a host or libvirt.
version_added: "0.2.0"
author:
  - vgpuvirt contributors
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
  gpus:
    description:
      - Each member's GPUs, one entry each (the options of M(vgpu_domain)'s O(vgpu_domain#module:gpus)).
      - Required unless O(state=absent) or O(count=0).
    type: list
    elements: dict
    suboptions:
      type:
        description: A type id, number or name (C(nvidia-231), C(231), C(GRID T4-2Q)).
        type: str
      min_framebuffer_mib:
        description: At least this much framebuffer.
        type: int
      min_heads:
        description: At least this many display heads.
        type: int
      series:
        description: The NVIDIA series letter.
        type: str
        choices: [Q, B, A, C]
      min_resolution:
        description: At least this maximum resolution, C(WIDTHxHEIGHT).
        type: str
      mig_backed:
        description: Require (or refuse) a MIG-backed type.
        type: bool
      vendor:
        description: C(nvidia), C(intel) or C(amd).
        type: str
      mode:
        description: C(vgpu), C(passthrough) or C(vf).
        type: str
        choices: [vgpu, passthrough, vf]
        default: vgpu
      display:
        description: Whether this vGPU drives the VM's display.
        type: bool
        default: true
      with_audio:
        description: With O(gpus[].mode=passthrough), pass the GPU's other functions along.
        type: bool
        default: true
  memory_mib:
    description: Memory of each member in MiB.
    type: int
    default: 4096
  vcpus:
    description: vCPUs of each member.
    type: int
    default: 2
  domain_options:
    description: Template switches passed to vgpuvirt's domain builder (C(graphics), C(secure_boot), ...).
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
seealso:
  - module: vgpu_info
  - module: vgpu_domain
"""

EXAMPLES = r"""
- name: What every hypervisor holds (one SSH session per host)
  vgpu_info:
    survey: true
    host_name: "{{ inventory_hostname }}"

- name: 20 desktops with a 2 GiB Q-series vGPU, across the fleet (one batched apply per host)
  vgpu_pool:
    name: vdi
    count: 20
    gpus: [{min_framebuffer_mib: 2048, series: Q}]
    host_name: "{{ inventory_hostname }}"

- name: The same pool, started (needs VFIO on the hosts)
  vgpu_pool:
    name: vdi
    count: 20
    state: running
    gpus: [{min_framebuffer_mib: 2048, series: Q}]

- name: Remove the pool everywhere
  vgpu_pool:
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
  description: The steps on this host, one line each.
  returned: success
  type: list
  elements: str
removed:
  description: What was (or would be) removed - members above O(count), or all of them with O(state=absent).
  returned: success
  type: list
  elements: str
fleet:
  description: The fleet-wide placement the action plugin made - members per host, the shares, every assignment.
  returned: when O(state) is not V(absent)
  type: dict
diff:
  description: Before and after.
  returned: success
  type: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    # open_host and open_libvirt stay names of this module: unit tests replace them
    from vgpuvirt.ansible_support import open_libvirt, run_module
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.errors import InvalidSpec, NoCapacity, ProvisioningError
    from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan, teardown
    from vgpuvirt.provision.pool import check_prefix, member_index, own_domains
    from vgpuvirt.services.inventory import inventory
except ImportError:
    HAS_VGPUVIRT = False
    VGPUVIRT_IMPORT_ERROR: str | None = traceback.format_exc()
else:
    HAS_VGPUVIRT = True
    VGPUVIRT_IMPORT_ERROR = None

GPU_SPEC = dict(
    type=dict(type="str"),
    min_framebuffer_mib=dict(type="int"),
    min_heads=dict(type="int"),
    series=dict(type="str", choices=["Q", "B", "A", "C"]),
    min_resolution=dict(type="str"),
    mig_backed=dict(type="bool"),
    vendor=dict(type="str"),
    mode=dict(type="str", choices=["vgpu", "passthrough", "vf"], default="vgpu"),
    display=dict(type="bool", default=True),
    with_audio=dict(type="bool", default=True),
)

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    count=dict(type="int", default=0),
    state=dict(type="str", choices=["defined", "running", "absent"], default="defined"),
    template=dict(type="str", default="vdi"),
    gpus=dict(type="list", elements="dict", options=GPU_SPEC),
    memory_mib=dict(type="int", default=4096),
    vcpus=dict(type="int", default=2),
    domain_options=dict(type="dict"),
    policy=dict(type="str", choices=["binpack", "spread"], default="binpack"),
    uri=dict(type="str", default="qemu:///system", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
    placed=dict(type="list", elements="str"),
)
MODULE_KWARGS = dict(supports_check_mode=True)


def member_request(p, name):
    """One member's VmRequest from the module's options (the action plugin builds the same one)."""
    gpus = tuple(VgpuRequest(**{k: v for k, v in g.items() if v is not None}) for g in p["gpus"] or [])
    if not gpus:
        raise InvalidSpec("gpus", p["gpus"], f"at least one GPU for the members of pool {p['name']!r}")
    return VmRequest(name=name, gpus=gpus, template=p["template"], memory_mib=p["memory_mib"], vcpus=p["vcpus"],
                     start=p["state"] == "running", options=dict(p["domain_options"] or {}))


def run(module, host, conn):
    p = module.params
    prefix = check_prefix(p["name"])
    if p["count"] < 0:
        raise InvalidSpec("count", p["count"], "0 or more members")
    doms = conn.domains()
    active = {d.name: d.active for d in doms}
    own = own_domains([(d.name, d.xml) for d in doms], host.name)
    mine = {n: ("running" if active.get(n) else "defined") for n, _ in own if member_index(prefix, n) is not None}
    before = dict(sorted(mine.items()))
    if p["state"] == "absent":
        wanted, remove = [], sorted(mine)
    else:
        if p["placed"] is None:
            module.fail_json(msg=f"vgpu_pool {prefix}: no placement (the option placed): run the module through its "
                                 "action plugin (examples/ansible/action_plugins next to the playbook, or "
                                 "action_plugins= in ansible.cfg)")
        wanted = list(p["placed"])
        bad = [n for n in wanted if (member_index(prefix, n) or p["count"] + 1) > p["count"]]
        if bad:
            raise InvalidSpec("placed", bad, f"members {prefix}-01 .. of pool {prefix} of {p['count']}")
        remove = sorted(n for n in mine if (member_index(prefix, n) or 0) > p["count"])
    steps, pl = [], None
    if wanted:
        reqs = [member_request(p, n) for n in wanted]
        inv = inventory(host, domains=own, use_nvml=False)
        pl = plan([inv], reqs, domains={host.name: own}, policy=p["policy"])
        if pl.prep:
            raise NoCapacity(host.name, prefix, "needs SR-IOV first: " + "; ".join(x.describe() for x in pl.prep))
        steps = [s.describe() for s in pl.steps]
    removed = [f"remove {n}" for n in remove]
    if not module.check_mode:
        if pl is not None and pl.steps:
            apply(pl, host, conn)        # one batch per phase on this host; a failure rolls back what it did
        if remove:
            res = teardown(host, conn, remove)
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
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, **MODULE_KWARGS)
    if not HAS_VGPUVIRT:
        module.fail_json(msg=missing_required_lib("vgpuvirt"), exception=VGPUVIRT_IMPORT_ERROR)
    run_module(module, missing_required_lib, open_host, run, open_libvirt=open_libvirt, carried=(ProvisioningError,))


if __name__ == "__main__":
    main()
