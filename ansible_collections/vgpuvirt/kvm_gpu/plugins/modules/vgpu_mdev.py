#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: one vGPU present or absent (an mdev instance or a vGPU-17 VF type); thin over vgpuvirt."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_mdev
short_description: Create or remove a vGPU (mdev instance or NVIDIA vGPU 17+ VF type), by type or by need
description:
  - Makes one vGPU present or absent on the target host.
  - On mdev hosts (NVIDIA time-sliced vGPU up to 16, A100/A10 VFs with mdev, Intel GVT-g) the vGPU is an mdev
    instance identified by O(uuid), or by O(name) from which a stable UUID is derived, so a rerun finds the same
    device.
  - On NVIDIA vGPU 17+ hosts (kernel 6.8+, no mdev) the vGPU is a virtual function whose C(current_vgpu_type) is
    set; it is identified by its PCI address O(vf).
  - The vGPU type is given by O(type) (an id such as C(nvidia-231), a number such as C(231), or a name such as
    C(GRID T4-2Q)) or by O(need) (framebuffer, heads, series...); vgpuvirt then picks the smallest fitting type
    and, without O(parent), the GPU by its binpack placement.
  - Capacity is checked before writing and again under the host-side lock, so two runs racing for the last
    instance cannot both get it.
  - Check mode reports what would change (with a diff) and changes nothing.
version_added: "0.1.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt (on the target host)
  - mdevctl (on the target host, only with O(persistent=true))
  - libvirt-python (only when O(uri) is set)
options:
  state:
    description:
      - V(present) creates the vGPU when it is missing; an existing one with the same parent and type is left
        alone, one with another parent or type is an error (mdevctl's rules).
      - V(absent) removes the mdev (and its mdevctl definition), or resets the VF's vGPU type to 0 and waits until
        it reads back 0.
    type: str
    choices: [present, absent]
    default: present
  uuid:
    description:
      - The mdev UUID. Mutually exclusive with O(name) and O(vf).
    type: str
  name:
    description:
      - A stable label for the mdev (typically the VM it is for). The UUID is derived from it the same way
        M(vgpuvirt.kvm_gpu.vgpu_domain) derives the UUID of a VM's first vGPU, so a domain of that name adopts
        the device.
      - Mutually exclusive with O(uuid) and O(vf).
    type: str
  vf:
    description:
      - PCI address of an NVIDIA vGPU 17+ virtual function (C(0000:41:00.4)). Mutually exclusive with O(uuid) and
        O(name).
    type: str
  type:
    description:
      - The vGPU type by id (C(nvidia-231), C(i915-GVTg_V5_4)), number (C(231), vendor-specific VFs) or name
        (C(GRID T4-2Q), C(NVIDIA L40S-2Q)).
      - Mutually exclusive with O(need). One of them is required with O(state=present) unless the device already
        exists (then it is kept as it is).
    type: str
  need:
    description:
      - The vGPU by need instead of by type; the smallest type that fits wins.
    type: dict
    suboptions:
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
  parent:
    description:
      - Where to create the mdev, by its parent PCI address (the GPU, or one of its SR-IOV VFs on A100/A10 class
        boards). Without it the placement chooses.
      - For O(vf) it is ignored (the VF is the place).
    type: str
  persistent:
    description:
      - Also define the mdev with C(mdevctl define --auto) so it comes back after a reboot (mdev only).
      - Fails with a clear message when mdevctl is not installed on the target.
    type: bool
    default: false
  mdevctl_command:
    description:
      - The argv used to run mdevctl (a prefix such as C([unshare, -m, ..., mdevctl]) is allowed).
    type: list
    elements: str
    default: [mdevctl]
  uri:
    description:
      - A libvirt URI. With it, O(state=absent) refuses to remove a vGPU that a domain still uses.
    type: str
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
    description: Reports what would be created or removed, with a diff; changes nothing.
  diff_mode:
    support: full
    description: Before and after show the vGPU (absent, or its parent and type).
notes:
  - All reads of one run are one batch, all writes one batch under the host-side lock (C(/run/vgpuvirt/lock)).
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_info
  - module: vgpuvirt.kvm_gpu.vgpu_domain
"""

EXAMPLES = r"""
- name: A 2Q vGPU for desk-001 on whichever T4 has room (UUID derived from the name)
  vgpuvirt.kvm_gpu.vgpu_mdev:
    name: desk-001
    type: GRID T4-2Q

- name: Exactly this UUID on this parent, persistent across reboots
  vgpuvirt.kvm_gpu.vgpu_mdev:
    uuid: e55bf865-6983-4d53-967f-51e8a3bb0f57
    parent: "0000:3b:00.0"
    type: nvidia-231
    persistent: true

- name: By need - at least 2 GiB, Q series, the smallest type that fits
  vgpuvirt.kvm_gpu.vgpu_mdev:
    name: cad-07
    need:
      min_framebuffer_mib: 2048
      series: Q

- name: vGPU 17+ - give a VF the L40S-2Q type
  vgpuvirt.kvm_gpu.vgpu_mdev:
    vf: "0000:41:00.4"
    type: NVIDIA L40S-2Q

- name: Remove it again, unless a libvirt domain still uses it
  vgpuvirt.kvm_gpu.vgpu_mdev:
    name: desk-001
    state: absent
    uri: qemu:///system
"""

RETURN = r"""
vgpu:
  description: The vGPU as it is after the task (as it would be, in check mode).
  returned: success
  type: dict
  contains:
    kind:
      description: C(mdev) or C(vendor-vf).
      type: str
      sample: mdev
    state:
      description: C(present) or C(absent).
      type: str
    uuid:
      description: The mdev UUID (mdev only).
      type: str
      sample: e55bf865-6983-4d53-967f-51e8a3bb0f57
    vf:
      description: The VF address (vendor-vf only).
      type: str
    parent:
      description: The mdev parent, or the VF's physical function.
      type: str
      sample: "0000:3b:00.0"
    type:
      description: The mdev type id, or the numeric vGPU type of the VF (as a string).
      type: str
      sample: nvidia-231
    persistent:
      description: Whether an mdevctl definition was asked for.
      type: bool
message:
  description: What was (or would be) done, in words.
  returned: success
  type: str
  sample: created
ops:
  description: The host operations applied (or planned, in check mode).
  returned: success
  type: list
  elements: str
  sample: ["write 'e55bf865-...' > /sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-231/create"]
diff:
  description: Before and after, for C(--diff).
  returned: success
  type: dict
"""

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    HAS_VGPUVIRT,
    NEED_SPEC,
    new_module,
    run_module,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    # open_host and domain_pairs stay names of this module: unit tests replace them
    from vgpuvirt.ansible_support import domain_pairs
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.change.mdev_service import MdevService
    from vgpuvirt.errors import InvalidSpec
    from vgpuvirt.model import MdevUuid, PciAddress
    from vgpuvirt.provision.by_need import place_one, profile_at, smallest_fitting_type
    from vgpuvirt.provision.plan import mdev_uuid_for
    from vgpuvirt.provision.request import TypeProfile, VgpuRequest, fit
    from vgpuvirt.services.inventory.read import VendorType, inventory
    from vgpuvirt.services.vgpu.vendor import VendorVgpuService
    from vgpuvirt.usage import GpuUse


ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    uuid=dict(type="str"),
    name=dict(type="str"),
    vf=dict(type="str"),
    type=dict(type="str"),
    need=dict(type="dict", options=NEED_SPEC),
    parent=dict(type="str"),
    persistent=dict(type="bool", default=False),
    mdevctl_command=dict(type="list", elements="str", default=["mdevctl"]),
    uri=dict(type="str", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
)
MODULE_KWARGS = dict(
    mutually_exclusive=[("uuid", "name", "vf"), ("type", "need")],
    required_one_of=[("uuid", "name", "vf")],
    supports_check_mode=True,
)


def the_request(params):
    need = {k: v for k, v in (params["need"] or {}).items() if v is not None}
    if params["type"] is None and not need:
        return None
    return VgpuRequest(type=params["type"], **need)


def mdev_present(module, host, inv, u, req):
    p = module.params
    svc = MdevService(host, mdevctl=p["mdevctl_command"])
    persist = "persistent" if p["persistent"] else "transient"
    parent = PciAddress.parse(p["parent"]) if p["parent"] else None
    found = next((m for m in inv.mdevs if m.uuid == u), None)
    if found is not None:
        # Keep an existing device that satisfies the request; ensure() refuses one that does not.
        type_id = found.type
        prof = profile_at(inv, PciAddress.parse(found.parent), found.type)
        if req is not None and (prof is None or fit(req, prof) is not None):
            # Name the type that was asked for, so ensure() reports the conflict in mdevctl's words.
            type_id = smallest_fitting_type(inv, req, PciAddress.parse(found.parent)) or found.type
        return svc.ensure(u, str(parent) if parent else found.parent, type_id, persist=persist,
                          dry_run=module.check_mode), found.parent, found.type
    if req is None:
        raise InvalidSpec("type/need", None, f"a vGPU type or need: mdev {u} does not exist yet")
    chosen = place_one(inv, req, kind=GpuUse.MDEV, vm=str(u), where=parent)
    change = svc.ensure(u, chosen.slot, chosen.type.id, persist=persist, dry_run=module.check_mode)
    return change, None, None


def current_vf_profile(vf):
    """The TypeProfile of the type a VF carries (its creatable list no longer shows it)."""
    t = VendorType(vf.current_type, vf.current_type_name or "").to_dict()
    return TypeProfile(id=f"nvidia-{t['id']}", name=t["name"], vendor="nvidia", framebuffer_mib=t["framebuffer_mib"],
                       series=t["series"], mig_backed=t["mig_backed"])


def vf_present(module, host, inv, vf, req):
    svc = VendorVgpuService(host)
    found = next((v for v in inv.vendor_vgpu if v.address == vf), None)
    if found is not None and found.current_type != 0:
        prof = current_vf_profile(found)
        if req is None or (prof is not None and fit(req, prof) is None):
            # Already carrying a fitting type: assign() of that same type is a no-op.
            return svc.assign(found.current_type, vf=vf, dry_run=module.check_mode), found.current_type
    if req is None:
        raise InvalidSpec("type/need", None, f"a vGPU type or need: VF {vf} has no vGPU type yet")
    name = f"vf-{vf.bus:02x}-{vf.slot:02x}-{vf.function}"
    prof = place_one(inv, req, kind=GpuUse.VENDOR_VF, vm=name, where=vf).type \
        if found is not None and found.current_type == 0 else None
    type_id = prof.numeric_id if prof is not None else req.type
    return svc.assign(type_id, vf=vf, dry_run=module.check_mode), (found.current_type if found else None)


def run(module, host):
    p = module.params
    req = the_request(p)
    domains = domain_pairs(p["uri"]) if p["uri"] else None
    if p["vf"]:
        vf = PciAddress.parse(p["vf"])
        if p["state"] == "absent":
            change = VendorVgpuService(host).release(vf, dry_run=module.check_mode, domains=domains)
            before_type = change.data.get("type")
            after = dict(kind="vendor-vf", state="absent", vf=str(vf), parent=change.data.get("physfn"), type=None)
        else:
            inv = inventory(host, use_nvml=False)
            change, before_type = vf_present(module, host, inv, vf, req)
            after = dict(kind="vendor-vf", state="present", vf=str(vf), parent=change.data.get("physfn"),
                         type=str(change.data.get("type")))
        before = dict(after, state="present" if before_type else "absent",
                      type=str(before_type) if before_type else None)
    else:
        u = MdevUuid.parse(p["uuid"]) if p["uuid"] else mdev_uuid_for(p["name"], 0)
        if p["state"] == "absent":
            change = MdevService(host, mdevctl=p["mdevctl_command"]).remove(
                u, dry_run=module.check_mode, domains=domains)
            existed = change.data.get("parent") is not None or change.data.get("defined")
            before = dict(kind="mdev", state="present" if existed else "absent", uuid=str(u),
                          parent=change.data.get("parent"), type=change.data.get("type"))
            after = dict(kind="mdev", state="absent", uuid=str(u), parent=None, type=None)
        else:
            inv = inventory(host, use_nvml=False)
            change, old_parent, old_type = mdev_present(module, host, inv, u, req)
            after = dict(kind="mdev", state="present", uuid=str(u), parent=change.data.get("parent"),
                         type=change.data.get("type"), persistent=bool(p["persistent"]))
            before = dict(kind="mdev", state="present" if old_parent else "absent", uuid=str(u),
                          parent=old_parent, type=old_type)
            if old_parent:
                before["persistent"] = bool(p["persistent"]) and not change.changed
    if not change.changed:
        before = after
    return dict(changed=change.changed, vgpu=after, message=change.message,
                ops=[op.describe() for op in change.ops], diff=dict(before=before, after=after))


def main():
    module = new_module(ARGUMENT_SPEC, **MODULE_KWARGS)
    run_module(module, open_host, run)


if __name__ == "__main__":
    main()
