# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""vgpu_pool's argument spec and one member's request, shared by the module (on each host) and its action
plugin (on the controller, where it places the pool): both validate a task the same way and build the same
request from it, so what the controller places is what the host applies."""

from __future__ import annotations

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
)

if HAS_VGPUVIRT:  # else the module fails in Ansible's words, the action plugin names the controller
    from vgpuvirt.errors import InvalidSpec
    from vgpuvirt.provision import VgpuRequest, VmRequest

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    count=dict(type="int", default=0),
    state=dict(type="str", choices=["defined", "running", "absent"], default="defined"),
    template=dict(type="str", default="vdi"),
    gpus=dict(type="list", elements="dict", options=GPU_REQUEST_SPEC),
    memory_mib=dict(type="int", default=4096),
    vcpus=dict(type="int", default=2),
    disk=dict(type="str"),
    clone=dict(type="dict", options=CLONE_SPEC),
    domain_options=dict(type="dict"),
    license=dict(type="dict", options=LICENSE_SPEC),
    **PROVISIONING_SPEC,
    policy=dict(type="str", choices=["binpack", "spread"], default="binpack"),
    uri=dict(type="str", default="qemu:///system", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
    placed=dict(type="list", elements="str"),
)
MODULE_KWARGS = dict(supports_check_mode=True, mutually_exclusive=[("disk", "clone")])


def member_request(p, name, *, on_target=True):
    """One member's VmRequest from the task's validated options. The action plugin (``on_target=False``, on
    the controller) places members without their license: the token file is on the target, and a seed takes
    no GPU."""
    gpus = tuple(VgpuRequest(**g) for g in gpu_requests(p["gpus"]))
    if not gpus:
        raise InvalidSpec("gpus", p["gpus"], f"at least one GPU for the members of pool {p['name']!r}")
    return VmRequest(name=name, gpus=gpus, template=p["template"], memory_mib=p["memory_mib"], vcpus=p["vcpus"],
                     disk=disk_request(p), start=p["state"] == "running", options=domain_options(p),
                     license=license_request(p) if on_target else None)
