#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: the host's GPU virtualization picture as facts (thin wrapper over vgpuvirt.inventory)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_info
short_description: Gather facts about a host's GPUs, vGPU types, mdevs, SR-IOV VFs and IOMMU groups
description:
  - Reads the whole GPU virtualization picture of the target host in one pass with C(vgpuvirt.inventory)
    and returns it as the fact C(ansible_facts.vgpuvirt), the same JSON object that
    C(vgpuvirt inventory --json) prints.
  - Use it in C(when:) conditions and templates, for example to pick hosts that still have free
    instances of a vGPU type.
  - The module runs on the target host and needs the C(vgpuvirt) Python package in the target's
    Python (set C(ansible_python_interpreter) to it).
  - It never changes anything, so it always reports C(changed=false), in check mode too.
version_added: "0.1.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt (on the target host)
  - libvirt-python (only when O(uri) is set)
options:
  sysfs_root:
    description:
      - Read sysfs below this directory instead of C(/).
      - Point it at a directory tree or a FUSE-mounted simulator (C(vgpuvirt sim mount PROFILE DIR)) to test
        playbooks without GPUs.
    type: path
    default: /
  uri:
    description:
      - A libvirt connection URI (C(qemu:///system), C(test:///default)).
      - When set, every mdev in the result names the libvirt domain that uses it (C(domain)), so orphans can be told
        apart from vGPUs in use.
      - When omitted, libvirt is not contacted and C(domain) is null.
    type: str
  use_nvml:
    description:
      - Enrich the result with NVML data (MIG mode, driver version) when C(nvidia-ml-py) and an NVIDIA driver are
        present.
      - Left unset, NVML is used when it is available and silently skipped otherwise; C(true) makes its absence a
        warning in C(warnings); C(false) never loads it.
    type: bool
  survey:
    description:
      - Also return the fact C(ansible_facts.vgpuvirt_survey) - the host's raw inventory reads and the libvirt
        domains recorded for it - which the C(vgpu_pool) action plugin places a pool across the play's hosts with.
        Read in the same pass; libvirt is read at O(uri) (C(qemu:///system) when O(uri) is unset).
    type: bool
    default: false
  host_name:
    description:
      - With O(survey=true), the name of this host as vgpuvirt records it in the domains it makes (default - the
        target's hostname). Domains recorded for another host are left out of the survey, so several hosts may
        share one libvirt daemon (test fleets do); give each host a distinct name (C({{ inventory_hostname }})).
    type: str
attributes:
  check_mode:
    support: full
    description: Read-only; behaves the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to diff.
notes:
  - The fact is the DESIGN.md inventory contract; fields may be added in later versions, existing names keep their
    meaning.
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_mdev
  - module: vgpuvirt.kvm_gpu.vgpu_passthrough
  - module: vgpuvirt.kvm_gpu.vgpu_domain
"""

EXAMPLES = r"""
- name: Gather the GPU picture of every hypervisor
  vgpuvirt.kvm_gpu.vgpu_info:
  register: gpu

- name: Show the vGPU types with free instances
  ansible.builtin.debug:
    msg: "{{ item.0.address }} {{ item.1.name }}: {{ item.1.available_instances }} free"
  loop: "{{ ansible_facts.vgpuvirt.mdev_parents | subelements('types') }}"
  when: item.1.available_instances > 0

- name: Only hosts whose IOMMU is on may get passthrough VMs
  ansible.builtin.group_by:
    key: "iommu_{{ ansible_facts.vgpuvirt.iommu_enabled | default(false) }}"

- name: Survey every hypervisor for vgpu_pool (raw reads and the domains recorded for it)
  vgpuvirt.kvm_gpu.vgpu_info:
    survey: true
    host_name: "{{ inventory_hostname }}"

- name: Name the domains that use each mdev (talks to libvirt)
  vgpuvirt.kvm_gpu.vgpu_info:
    uri: qemu:///system

- name: Test a playbook against a simulated host
  vgpuvirt.kvm_gpu.vgpu_info:
    sysfs_root: /srv/vgpu-sim/t4x2
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host's variables.
  returned: always
  type: dict
  contains:
    vgpuvirt:
      description:
        - The inventory of the host, as C(vgpuvirt inventory --json) prints it.
      returned: always
      type: dict
      contains:
        host:
          description: The name vgpuvirt gives the host (C(local) on the target).
          type: str
          sample: local
        iommu_enabled:
          description: Whether the kernel has IOMMU groups (needed for any passthrough).
          type: bool
          sample: true
        pci_devices:
          description: Every PCI device of interest with vendor, device, class, driver, IOMMU group, NUMA node and
            SR-IOV topology.
          type: list
          elements: dict
        iommu_groups:
          description: IOMMU group number (as a string) to member addresses.
          type: dict
          sample: {"35": ["0000:3a:00.0", "0000:3b:00.0"]}
        mdev_parents:
          description: Devices that offer mdev types, each with its types and free instances.
          type: list
          elements: dict
          sample:
            - address: "0000:3b:00.0"
              types:
                - {id: nvidia-231, name: GRID T4-2Q, available_instances: 7, framebuffer_mib: 2048}
        mdevs:
          description: Existing mdev instances with parent, type and (with O(uri)) the domain using it.
          type: list
          elements: dict
          sample:
            - {uuid: e55bf865-6983-4d53-967f-51e8a3bb0f57, parent: "0000:3b:00.0", type: nvidia-231, domain: null}
        vendor_vgpu:
          description: NVIDIA vGPU 17+ virtual functions with their current and creatable vGPU types.
          type: list
          elements: dict
        gpus:
          description: One entry per GPU with its virtualization backend (mdev, mdev-sriov, vendor-vfio,
            passthrough, gvtg, sriov-vf).
          type: list
          elements: dict
        warnings:
          description: Things the inventory noticed but could not resolve.
          type: list
          elements: str
"""

import platform

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    HAS_VGPUVIRT,
    new_module,
    run_module,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    # open_host and domain_pairs stay names of this module: unit tests replace them
    from vgpuvirt.ansible_support import domain_pairs
    from vgpuvirt.host.local import LocalHost
    from vgpuvirt.provision.pool import take_survey
    from vgpuvirt.services.inventory.read import inventory

ARGUMENT_SPEC = dict(
    sysfs_root=dict(type="path", default="/"),
    uri=dict(type="str", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    use_nvml=dict(type="bool"),
    survey=dict(type="bool", default=False),
    host_name=dict(type="str"),
)


def open_host(module):
    """The target below ``sysfs_root``, named ``host_name`` (default ``local``, as the inventory fact says)."""
    return LocalHost(module.params["sysfs_root"], name=module.params["host_name"] or "local")


def run(module, host):
    p = module.params
    domains = domain_pairs(p["uri"]) if p["uri"] else None
    inv = inventory(host, domains=domains, use_nvml=p["use_nvml"])
    facts = dict(vgpuvirt=inv.to_dict())
    if p["survey"]:
        # the pool's domains record the host by this name: the target's hostname unless host_name says
        name = host.name if p["host_name"] else platform.node() or "local"
        pairs = domains if domains is not None else domain_pairs("qemu:///system")
        facts["vgpuvirt_survey"] = take_survey(host, pairs, name=name).to_dict()
    return dict(changed=False, ansible_facts=facts)


def main():
    module = new_module(ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, open_host, run)


if __name__ == "__main__":
    main()
