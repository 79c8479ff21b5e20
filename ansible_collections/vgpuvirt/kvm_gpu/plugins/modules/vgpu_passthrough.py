#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: IOMMU pre-flight for whole-device passthrough and vfio-pci binding; thin over vgpuvirt."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_passthrough
short_description: Check that PCI devices can be passed through (IOMMU groups) and bind or release vfio-pci
description:
  - V(checked) runs vgpuvirt's IOMMU pre-flight on the devices (one read of the host) and fails with the whole
    report when they cannot be assigned to one VM - IOMMU off, a group member bound to a host driver, a function
    that must go along (the GPU's HDMI audio), a PF with VFs enabled, a device already used by another domain.
  - V(prepared) runs the same check, then binds every endpoint of the devices' IOMMU groups to vfio-pci
    (C(driver_override), unbind, C(drivers_probe); never C(new_id)) and waits until they are bound. It returns a
    C(binding) record of the original drivers.
  - V(released) gives the devices back. With O(binding) (the record O(state=prepared) returned) each device goes
    back to exactly its original driver; without it the override is cleared and the kernel probes the default
    driver.
  - Check mode reports what would be bound or released, with a diff of the drivers; it changes nothing.
version_added: "0.1.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt (on the target host)
  - libvirt-python (only when O(uri) is set)
options:
  addresses:
    description:
      - PCI addresses of the devices for one VM (C(0000:01:00.0), C(0000:01:00.1)). Short forms such as
        C(01:00.0) are accepted.
    type: list
    elements: str
    required: true
  state:
    description:
      - V(checked) only checks, V(prepared) checks and binds to vfio-pci, V(released) restores the host drivers.
    type: str
    choices: [checked, prepared, released]
    default: checked
  binding:
    description:
      - The C(binding) a previous O(state=prepared) returned; used by O(state=released) to restore the original
        drivers.
    type: dict
  uri:
    description:
      - A libvirt URI. With it, devices used by another domain block the check, and a device still used by a domain
        is not released.
    type: str
  domain:
    description:
      - The name of the domain the devices are for; its own use of them does not block the check.
    type: str
  timeout:
    description:
      - Seconds to wait for each device to show the new driver.
    type: float
    default: 10.0
  sysfs_root:
    description:
      - Read and write sysfs below this directory instead of C(/) (a fixture tree or a FUSE-mounted simulator).
    type: path
    default: /
  host_name:
    description:
      - The name this host goes by in messages and results. Defaults to the target's hostname.
    type: str
attributes:
  check_mode:
    support: full
    description: The check runs; binding and release are only reported.
  diff_mode:
    support: full
    description: Before and after map each device to its driver.
notes:
  - A vGPU 17+ VF keeps its C(nvidia) driver (libvirt uses it with C(managed='no')); it is never rebound.
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_info
  - module: vgpuvirt.kvm_gpu.vgpu_domain
"""

EXAMPLES = r"""
- name: Can the GPU and its audio function go to one VM?
  vgpuvirt.kvm_gpu.vgpu_passthrough:
    addresses: ["0000:01:00.0", "0000:01:00.1"]
  register: check

- name: Bind them to vfio-pci (the check runs first and fails with its report)
  vgpuvirt.kvm_gpu.vgpu_passthrough:
    addresses: ["0000:01:00.0", "0000:01:00.1"]
    state: prepared
    uri: qemu:///system
    domain: gaming-01
  register: prep

- name: Later, give them back to exactly the drivers they had
  vgpuvirt.kvm_gpu.vgpu_passthrough:
    addresses: ["0000:01:00.0", "0000:01:00.1"]
    state: released
    binding: "{{ prep.binding }}"
"""

RETURN = r"""
assignable:
  description: The verdict of the pre-flight (always true on success of V(checked) and V(prepared)).
  returned: when state is checked or prepared
  type: bool
  sample: true
report:
  description:
    - The pre-flight report; on failure it is returned too, next to C(msg).
  returned: when state is checked or prepared, and on a failed check
  type: dict
  contains:
    iommu_enabled:
      description: Whether the kernel has IOMMU groups.
      type: bool
    reasons:
      description: Why the devices cannot be assigned (empty when they can).
      type: list
      elements: str
    warnings:
      description: Things that do not block but deserve a look (no reset method).
      type: list
      elements: str
    devices:
      description: Per requested device, its group, every member with driver and class, and what blocks.
      type: list
      elements: dict
binding:
  description: The original drivers of what was bound; pass it to O(state=released).
  returned: when state is prepared
  type: dict
  sample: {"host": "hv01", "bindings": [{"address": "0000:01:00.0", "original_driver": "nouveau",
           "original_override": null}]}
message:
  description: What was (or would be) done.
  returned: success
  type: str
ops:
  description: The host operations applied (or planned, in check mode).
  returned: success
  type: list
  elements: str
diff:
  description: Device to driver, before and after.
  returned: success
  type: dict
"""

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    HAS_VGPUVIRT,
    new_module,
    run_module,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    # open_host and domain_pairs stay names of this module: unit tests replace them
    from vgpuvirt.ansible_support import domain_pairs
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.change.driver import prepare_vfio
    from vgpuvirt.errors import NotAssignable
    from vgpuvirt.model import PciAddress
    from vgpuvirt.services.iommu import api as iommu
    from vgpuvirt.services.pci import sysfs

ARGUMENT_SPEC = dict(
    addresses=dict(type="list", elements="str", required=True),
    state=dict(type="str", choices=["checked", "prepared", "released"], default="checked"),
    binding=dict(type="dict"),
    uri=dict(type="str", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    domain=dict(type="str"),
    timeout=dict(type="float", default=10.0),
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
)
MODULE_KWARGS = dict(supports_check_mode=True)


def drivers(host, addresses):
    """Device -> bound driver, for the diff (one read)."""
    snap = host.read([sysfs.pci(a, "driver") for a in addresses])
    return {a: snap.link_name(sysfs.pci(a, "driver")) for a in addresses}


def run(module, host):
    p = module.params
    domains = domain_pairs(p["uri"]) if p["uri"] else None
    if p["state"] == "checked":
        report = iommu.check_assignable(host, p["addresses"], domains=domains, for_domain=p["domain"])
        if not report.assignable:
            raise NotAssignable(host.name, ", ".join(p["addresses"]), list(report.reasons), report)
        return dict(changed=False, assignable=True, report=report.to_dict(), message="assignable", ops=[])
    if p["state"] == "prepared":
        change, record = prepare_vfio(host, p["addresses"], domains=domains, for_domain=p["domain"],
                                      dry_run=module.check_mode, timeout=p["timeout"])[:2]
        moved = [b.address for b in record.bindings]
        before = {str(b.address): b.original_driver for b in record.bindings}
        after = {str(a): iommu.VFIO for a in moved}
        return dict(changed=change.changed, assignable=True, report=change.data["report"].to_dict(),
                    binding=record.to_dict(), message=change.message, ops=[op.describe() for op in change.ops],
                    diff=dict(before=before, after=after if change.changed else before))
    record = iommu.BindingRecord.from_dict(p["binding"]) if p["binding"] else p["addresses"]
    wanted = [str(b.address) for b in record.bindings] if p["binding"] else None
    before = drivers(host, wanted or [str(PciAddress.parse(a)) for a in p["addresses"]])
    change = iommu.release(host, record, domains=domains, dry_run=module.check_mode, timeout=p["timeout"])
    after = dict(before)
    if p["binding"]:
        after.update({str(b.address): b.original_driver for b in record.bindings
                      if str(b.address) in change.data["devices"]})
    else:
        after.update({a: "(kernel default)" for a in change.data["devices"]})
    if change.changed and not module.check_mode:
        after = drivers(host, list(before))
    return dict(changed=change.changed, message=change.message, ops=[op.describe() for op in change.ops],
                diff=dict(before=before, after=after))


def main():
    module = new_module(ARGUMENT_SPEC, **MODULE_KWARGS)
    # A refused pre-flight returns its whole report with the failure.
    run_module(module, open_host, run, carried=(NotAssignable,))


if __name__ == "__main__":
    main()
