# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""What every module of vgpuvirt.kvm_gpu shares: the one guarded import of vgpuvirt and the argument spec of a
GPU request (the suboptions of ``gpus`` in vgpu_domain and vgpu_pool, ``need`` in vgpu_mdev).

The modules run on the target and drive the vgpuvirt library installed there; AnsiballZ ships this file with
each module, not the library. What the modules share on the library side (opening the host and libvirt,
running a task and reporting its failure) is ``vgpuvirt.ansible_support``, which never imports ansible.
"""

from __future__ import annotations

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from vgpuvirt.ansible_support import run_module as _run_module
    from vgpuvirt.errors import InvalidSpec
    from vgpuvirt.provision.disks import ClonedDisk
    from vgpuvirt.provision.license import License
    from vgpuvirt.provision.request import provisioning_options
except ImportError:
    HAS_VGPUVIRT = False
    VGPUVIRT_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_VGPUVIRT = True
    VGPUVIRT_IMPORT_ERROR = None

#: What a GPU must offer, when it is asked for by need rather than by type (vgpu_mdev's ``need``).
NEED_SPEC = dict(
    min_framebuffer_mib=dict(type="int"),
    min_heads=dict(type="int"),
    series=dict(type="str", choices=["Q", "B", "A", "C"]),
    min_resolution=dict(type="str"),
    mig_backed=dict(type="bool"),
    vendor=dict(type="str"),
)

#: One GPU of a VM (an element of ``gpus``): by type or by need, and how it is attached.
GPU_REQUEST_SPEC = dict(
    type=dict(type="str"),
    mode=dict(type="str", choices=["vgpu", "passthrough", "vf"], default="vgpu"),
    display=dict(type="bool", default=True),
    with_audio=dict(type="bool", default=True),
    **NEED_SPEC,
)


#: A linked clone of a golden image as a VM's disk (vgpu_domain's and vgpu_pool's ``clone``).
CLONE_SPEC = dict(
    golden=dict(type="str", required=True),
    pool=dict(type="str", required=True),
    name=dict(type="str", default="{name}.qcow2"),
    capacity_gib=dict(type="int"),
)


#: A licensed desktop's NVIDIA client configuration token (vgpu_domain's and vgpu_pool's ``license``). The
#: token FILE is read on the target (where the module runs and libvirt is), like ``disk`` and ``clone.golden``;
#: its path is no secret (it stays visible), its contents never enter the module's arguments, and the
#: library shows only their SHA-256. The choices are vgpuvirt.provision.license's FEATURES and GUESTS (a unit
#: test keeps them equal: this file cannot import vgpuvirt unguarded).
LICENSE_SPEC = dict(
    token_file=dict(type="path", required=True, no_log=False),
    feature=dict(type="str", choices=["vgpu", "vws", "vcs"], default="vgpu"),
    guest=dict(type="str", choices=["linux", "windows"], default="linux"),
    pool=dict(type="str"),
)

#: What real hosts need of a VM's domain (vgpuvirt provision's --network/--bridge/--tpm/--secure-boot/--graphics),
#: the same options in vgpu_domain and vgpu_pool.
PROVISIONING_SPEC = dict(
    networks=dict(type="list", elements="str"),
    bridges=dict(type="list", elements="str"),
    tpm=dict(type="bool", default=False),
    secure_boot=dict(type="bool", default=False),
    graphics=dict(type="str", choices=["spice", "vnc", "none"]),
)

# the domain_options keys the options above set: giving one both ways is refused (which would win is a guess)
_PROVISIONING_KEYS = {"networks": "virtio_nics", "bridges": "virtio_nics", "tpm": "tpm",
                      "secure_boot": "secure_boot", "graphics": "graphics"}


def domain_options(params):
    """``VmRequest.options``: the task's ``domain_options`` with what the provisioning options ask for, through
    vgpuvirt's provisioning_options (which checks them as the CLI's flags are checked)."""
    opts = dict(params.get("domain_options") or {})
    given = [k for k in _PROVISIONING_KEYS if params.get(k)]
    clash = sorted({_PROVISIONING_KEYS[k] for k in given} & set(opts))
    if clash:
        both = ", ".join(k for k in given if _PROVISIONING_KEYS[k] in clash)
        raise InvalidSpec("domain_options", clash, f"none of the keys the option(s) {both} set (give each one way)")
    opts.update(provisioning_options(networks=params.get("networks") or (), bridges=params.get("bridges") or (),
                                     tpm=bool(params.get("tpm")), secure_boot=bool(params.get("secure_boot")),
                                     graphics=params.get("graphics")))
    return opts


def license_request(params):
    """The task's ``license`` as vgpuvirt's License (the token file read here, on the target), or None."""
    lic = params.get("license")
    if not lic:
        return None
    return License.from_mapping({k: v for k, v in lic.items() if v is not None})


def disk_request(params):
    """The VM's disk as vgpuvirt's VmRequest takes it: the ``disk`` path (``{name}`` is the VM's name), a
    ``clone`` of a golden image, or None."""
    c = params.get("clone")
    if c:
        return ClonedDisk(c["pool"], c["golden"], name=c.get("name") or "{name}.qcow2",
                          capacity_gib=c.get("capacity_gib"))
    return params.get("disk")


def gpu_requests(gpus):
    """``gpus`` as keyword arguments of vgpuvirt's VgpuRequest: the options the task left unset (None after
    Ansible's validation) are left out, so the library's own defaults apply."""
    return [{k: v for k, v in g.items() if v is not None} for g in gpus or []]


def new_module(argument_spec, **kwargs):
    """The AnsibleModule, failing in Ansible's own words when vgpuvirt is missing on the target."""
    module = AnsibleModule(argument_spec=argument_spec, **kwargs)
    if not HAS_VGPUVIRT:
        module.fail_json(msg=missing_required_lib("vgpuvirt"), exception=VGPUVIRT_IMPORT_ERROR)
    return module


def run_module(module, open_host, run, **kwargs):
    """vgpuvirt.ansible_support.run_module with Ansible's missing_required_lib (for a missing extra)."""
    _run_module(module, missing_required_lib, open_host, run, **kwargs)
