#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: a libvirt domain with its vGPUs or passthrough GPUs, through vgpuvirt.provision."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_domain
short_description: Define, start, stop or remove a libvirt domain together with its vGPUs or passthrough GPUs
description:
  - Provisions one VM the way C(vgpuvirt provision) does - inventory the host, place the requested GPUs (binpack
    or spread across the host's GPUs), create the vGPUs, build the domain XML from a template, define it and start
    it - with everything it completed undone when a step fails.
  - Reruns converge - an existing domain made by vgpuvirt is kept, a vGPU of it that disappeared (after a reboot)
    is created again, and the domain is started only when it should run and does not. vGPU and domain UUIDs are
    derived from O(name), so nothing is duplicated.
  - An existing domain is not redefined when the options change (remove it first, O(state=absent)); a domain of
    that name not made by vgpuvirt is refused and left alone.
  - V(absent) destroys and undefines the domain and removes the vGPUs vgpuvirt created for it (disks are kept
    unless O(remove_storage=true)).
  - Before anything changes, the same pre-flight as C(vgpuvirt provision) runs - the libvirt networks the
    template names, storage pools and golden images, firmware, hugepages, CPUs - and reports every problem at
    once.
  - Check mode computes the plan and reports it (C(plan), C(changed), the diff) without touching the host or
    libvirt.
version_added: "0.1.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt with its libvirt extra (C(pip install vgpuvirt[libvirt])) on the target host
options:
  name:
    description:
      - The domain name.
    type: str
    required: true
  state:
    description:
      - V(defined) - the domain and its vGPUs exist; its power state is left as it is.
      - V(running) - defined and running.
      - V(stopped) - defined and powered off (a running domain is destroyed, like C(virsh destroy)).
      - V(absent) - no domain, and none of the vGPUs vgpuvirt created for it.
    type: str
    choices: [defined, running, stopped, absent]
    default: running
  template:
    description:
      - C(vdi) (desktop with a display vGPU), C(gaming) (whole GPU, pinned CPUs, hugepages), C(compute) (headless,
        NUMA-local), or the path of your own template on the target.
    type: str
    default: vdi
  memory_mib:
    description: Memory of the VM in MiB.
    type: int
    default: 4096
  vcpus:
    description: Number of vCPUs.
    type: int
    default: 2
  host_cpus:
    description: Pin the vCPUs to these host CPUs (a cpulist such as C(2-5)).
    type: str
  disk:
    description:
      - Path of the VM's disk image on the target (kept on O(state=absent) unless O(remove_storage)). A path
        inside an active storage pool's directory must be a volume of that pool (the pre-flight checks).
      - Mutually exclusive with O(clone).
    type: path
  clone:
    description:
      - Give the VM a qcow2 linked clone of a golden image, created as a volume of a libvirt storage pool (the
        pre-flight checks the pool is active and the golden image is a volume libvirt knows). Mutually
        exclusive with O(disk).
    type: dict
    suboptions:
      golden:
        description: The golden image's path on the target (a volume of a storage pool).
        type: str
        required: true
      pool:
        description: The libvirt storage pool the clone is created in.
        type: str
        required: true
      name:
        description: The clone's volume name, C({name}) standing for the VM's name.
        type: str
        default: "{name}.qcow2"
      capacity_gib:
        description: The guest disk's size in GiB (default - the golden image's).
        type: int
  domain_options:
    description:
      - Template switches passed to vgpuvirt's domain builder (C(hugepages), C(hyperv), C(kvm_hidden), ...).
      - The NICs, TPM, secure boot and graphics have options of their own (O(networks), O(bridges), O(tpm),
        O(secure_boot), O(graphics)); a key set both ways is refused.
    type: dict
  policy:
    description: How GPUs are chosen among the host's GPUs.
    type: str
    choices: [binpack, spread]
    default: binpack
  remove_storage:
    description: With O(state=absent), also delete the domain's disk images.
    type: bool
    default: false
  uri:
    description:
      - The libvirt URI (C(qemu:///system); C(test:///default) is libvirt's in-process test driver, which forgets
        everything when the module exits).
    type: str
    default: qemu:///system
  sysfs_root:
    description:
      - Read and write sysfs below this directory instead of C(/) (a fixture tree or a FUSE-mounted simulator).
    type: path
    default: /
  host_name:
    description:
      - The name of this host as vgpuvirt records it in the domain's metadata. Defaults to the target's hostname.
      - Domains whose metadata names another host are ignored, so several hosts may share one libvirt daemon (test
        fleets do); give each host a distinct name then (C({{ inventory_hostname }})).
    type: str
attributes:
  check_mode:
    support: full
    description: The plan is computed and returned; nothing is created, defined, started or removed.
  diff_mode:
    support: full
    description: Before and after show the domain's state and its GPUs.
extends_documentation_fragment:
  - vgpuvirt.kvm_gpu.gpu_request
  - vgpuvirt.kvm_gpu.provisioning
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_info
  - module: vgpuvirt.kvm_gpu.vgpu_mdev
  - module: vgpuvirt.kvm_gpu.vgpu_passthrough
"""

EXAMPLES = r"""
- name: A VDI desktop with a 2 GiB Q-series vGPU (the smallest type that fits), running
  vgpuvirt.kvm_gpu.vgpu_domain:
    name: desk-001
    gpus:
      - min_framebuffer_mib: 2048
        series: Q
    memory_mib: 8192
    vcpus: 4
    disk: /var/lib/libvirt/images/desk-001.qcow2

- name: Copy the NVIDIA client configuration token to the hypervisor (not shown in the output)
  ansible.builtin.copy:
    src: files/client_configuration_token.tok
    dest: /etc/vgpuvirt/client_configuration_token.tok
    mode: "0600"
  no_log: true

- name: A licensed Windows 11 desktop on bridge br0, with a TPM, secure boot and SPICE
  vgpuvirt.kvm_gpu.vgpu_domain:
    name: desk-002
    gpus: [{type: GRID T4-2Q}]
    bridges: [br0]
    tpm: true
    secure_boot: true
    graphics: spice
    license:
      token_file: /etc/vgpuvirt/client_configuration_token.tok
      feature: vgpu
      guest: windows

- name: A pool of desktops by type, defined but not started
  vgpuvirt.kvm_gpu.vgpu_domain:
    name: "{{ item }}"
    state: defined
    gpus: [{type: GRID T4-2Q}]
  loop: "{{ query('sequence', 'start=1 end=8 format=vdi-%03d') }}"

- name: A gaming VM with a whole GPU and its HDMI audio, pinned CPUs and hugepages
  vgpuvirt.kvm_gpu.vgpu_domain:
    name: gaming-01
    template: gaming
    gpus: [{mode: passthrough}]
    vcpus: 8
    host_cpus: 4-11
    domain_options: {hugepages: true}

- name: Power a desktop off
  vgpuvirt.kvm_gpu.vgpu_domain:
    name: desk-001
    state: stopped

- name: Remove it with its vGPU (the disk is kept)
  vgpuvirt.kvm_gpu.vgpu_domain:
    name: desk-001
    state: absent
"""

RETURN = r"""
domain:
  description: The domain after the task (as it would be, in check mode).
  returned: success
  type: dict
  contains:
    name:
      description: The domain name.
      type: str
    state:
      description: C(absent), C(defined) or C(running).
      type: str
    gpus:
      description: The GPUs vgpuvirt recorded for it (kind, UUID or address, parent, type).
      type: list
      elements: dict
plan:
  description:
    - The steps taken (or, in check mode, that would be taken), one line each.
    - A licensed desktop's seed step names the token's SHA-256, never the token.
  returned: success
  type: list
  elements: str
  sample: ["create vGPU nvidia-231 5b1c...-... on 0000:3b:00.0 (for desk-001)", "define domain desk-001",
           "start domain desk-001"]
kept:
  description: What was found already in place and reused.
  returned: success
  type: list
  elements: str
placement:
  description: Where each GPU went (host, GPU, slot, type), when the domain was placed by this run.
  returned: success
  type: list
  elements: dict
diff:
  description: Before and after.
  returned: success
  type: dict
"""

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    CLONE_SPEC,
    GPU_REQUEST_SPEC,
    HAS_VGPUVIRT,
    LICENSE_SPEC,
    PROVISIONING_SPEC,
    disk_request,
    domain_options,
    gpu_requests,
    license_request,
    new_module,
    run_module,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    # open_host and open_libvirt stay names of this module: unit tests replace them
    from vgpuvirt.ansible_support import open_libvirt
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.errors import InvalidSpec, ProvisioningError
    from vgpuvirt.provision import VgpuRequest, VmRequest, apply, plan, teardown
    from vgpuvirt.provision.plan import domain_meta, mdev_uuid_for
    from vgpuvirt.services.inventory.read import inventory


ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    state=dict(type="str", choices=["defined", "running", "stopped", "absent"], default="running"),
    template=dict(type="str", default="vdi"),
    gpus=dict(type="list", elements="dict", options=GPU_REQUEST_SPEC),
    memory_mib=dict(type="int", default=4096),
    vcpus=dict(type="int", default=2),
    host_cpus=dict(type="str"),
    disk=dict(type="path"),
    clone=dict(type="dict", options=CLONE_SPEC),
    domain_options=dict(type="dict"),
    license=dict(type="dict", options=LICENSE_SPEC),
    **PROVISIONING_SPEC,
    policy=dict(type="str", choices=["binpack", "spread"], default="binpack"),
    remove_storage=dict(type="bool", default=False),
    uri=dict(type="str", default="qemu:///system", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
)
MODULE_KWARGS = dict(supports_check_mode=True, mutually_exclusive=[("disk", "clone")])


def own_domains(conn, host_name):
    """(name, xml, active) of the domains that belong to this host: vgpuvirt's metadata names it, or
    the domain has no vgpuvirt metadata at all (the host's own foreign domains)."""
    out = []
    for d in conn.domains():
        meta = domain_meta(d.xml)
        if meta is None or meta.get("host") in (host_name, None):
            out.append((d.name, d.xml, d.active))
    return out


def describe(name, found):
    """The diff view of a domain: its state and the GPUs vgpuvirt recorded for it."""
    if found is None:
        return dict(name=name, state="absent", gpus=[])
    dummy, xml, active = found
    meta = domain_meta(xml) or {}
    return dict(name=name, state="running" if active else "defined", gpus=meta.get("gpus", []))


def gpu_record(a):
    """An assignment as vgpuvirt records it in the domain's metadata (so before == after on a rerun)."""
    if a.kind == "mdev":
        return dict(kind="mdev", uuid=str(mdev_uuid_for(a.vm, a.index)), parent=str(a.slot), type=a.type.id)
    if a.kind == "vendor-vf":
        return dict(kind="vendor-vf", vf=str(a.slot), type=str(a.type.numeric_id))
    return dict(kind=a.kind, address=str(a.slot))


def vm_request(p, start):
    gpus = [VgpuRequest(**g) for g in gpu_requests(p["gpus"])]
    if not gpus:
        raise InvalidSpec("gpus", p["gpus"], f"at least one GPU to create domain {p['name']!r}")
    return VmRequest(name=p["name"], gpus=tuple(gpus), template=p["template"], memory_mib=p["memory_mib"],
                     vcpus=p["vcpus"], host_cpus=p["host_cpus"], disk=disk_request(p), start=start,
                     options=domain_options(p), license=license_request(p))


def present(module, host, conn, found):
    p = module.params
    pairs = [(n, x) for n, x, dummy in own_domains(conn, host.name)]
    if found is not None:
        # Converge an existing domain; its GPUs come from its metadata, not from the request.
        req = VmRequest(name=p["name"], start=p["state"] == "running")
    else:
        req = vm_request(p, start=p["state"] == "running")
    inv = inventory(host, domains=pairs, use_nvml=False)
    # the CLI's pre-flight: networks, storage pools and golden images, firmware, hugepages, CPUs
    pl = plan([inv], [req], domains={host.name: pairs}, policy=p["policy"], libvirt={host.name: conn.facts()})
    steps = [s.describe() for s in pl.steps]
    if pl.steps and not module.check_mode:
        apply(pl, host, conn)
    gpus = describe(p["name"], found)["gpus"] if found is not None else [gpu_record(a) for a in pl.assignments]
    after = dict(name=p["name"], state="running" if req.start or (found and found[2]) else "defined", gpus=gpus)
    placement = [dict(gpu=str(a.gpu), slot=str(a.slot), kind=a.kind, type=a.type.id, type_name=a.type.name)
                 for a in pl.assignments]
    return bool(pl.steps), steps, [f"{k.what}" for k in pl.kept], placement, after


def run(module, host, conn):
    p = module.params
    found = next((d for d in own_domains(conn, host.name) if d[0] == p["name"]), None)
    before = describe(p["name"], found)
    steps, kept, placement = [], [], []
    if p["state"] == "absent":
        res = teardown(host, conn, [p["name"]], remove_storage=p["remove_storage"], dry_run=module.check_mode)
        if res.failed:
            module.fail_json(msg="; ".join(res.failed), teardown=res.to_dict())
        changed = bool(res.removed)
        steps = res.removed
        after = dict(name=p["name"], state="absent", gpus=[])
    else:
        changed, steps, kept, placement, after = present(module, host, conn, found)
        if p["state"] == "stopped" and found is not None and found[2]:
            steps.append(f"destroy domain {p['name']}")
            changed = True
            if not module.check_mode:
                conn.destroy(p["name"])
            after["state"] = "defined"
    if not changed:
        after = before
    return dict(changed=changed, domain=after, plan=steps, kept=kept, placement=placement,
                diff=dict(before=before, after=after))


def main():
    module = new_module(ARGUMENT_SPEC, **MODULE_KWARGS)
    # A failed apply returns what it had done and what its rollback undid.
    run_module(module, open_host, run, open_libvirt=open_libvirt, carried=(ProvisioningError,))


if __name__ == "__main__":
    main()
