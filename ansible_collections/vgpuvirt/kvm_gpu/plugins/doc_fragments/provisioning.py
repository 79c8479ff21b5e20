# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""The documentation of what real hosts need of a VM (network or bridge, TPM, secure boot, graphics) and of a
licensed desktop's token, shared by vgpu_domain and vgpu_pool (their argument specs are module_utils/common.py's
PROVISIONING_SPEC and LICENSE_SPEC)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  networks:
    description:
      - The VM's ordinary NICs on these libvirt networks, one virtio NIC each (C(vgpuvirt provision --network)).
        With O(bridges), the networks' NICs come first.
      - Neither given - the template's NIC on the network C(default). The pre-flight refuses a network the host's
        libvirt does not have, naming the ones it has.
    type: list
    elements: str
  bridges:
    description:
      - The VM's ordinary NICs on these host bridges, one virtio NIC each (C(vgpuvirt provision --bridge)).
        The pre-flight refuses a bridge the host's libvirt does not list, or an interface that is no bridge.
    type: list
    elements: str
  tpm:
    description: Give the VM a TPM 2.0 (swtpm, C(vgpuvirt provision --tpm)).
    type: bool
    default: false
  secure_boot:
    description:
      - Boot the VM with UEFI secure boot (C(vgpuvirt provision --secure-boot)); the pre-flight checks the host
        has the firmware for it.
    type: bool
    default: false
  graphics:
    description: The VM's remote display (C(vgpuvirt provision --graphics)); V(none) leaves only the vGPU's.
    type: str
    choices: [spice, vnc, none]
  license:
    description:
      - A licensed desktop (C(vgpuvirt provision --license-token)) - the NVIDIA client configuration token and the
        licensing feature are delivered into the guest on a read-only seed CD-ROM, a volume of a libvirt storage
        pool that O(state=absent) deletes. Linux guests get a cloud-init NoCloud seed writing the token under
        C(/etc/nvidia/ClientConfigToken/) and C(FeatureType) in C(/etc/nvidia/gridd.conf); Windows guests an
        OpenStack config drive that cloudbase-init reads.
      - The token is a secret - it is read from O(license.token_file) on the target host, never passed as an
        argument, and the task's results, diff and logs show only its SHA-256.
      - Applies when a VM is created; an existing VM is not changed.
    type: dict
    suboptions:
      token_file:
        description:
          - The client configuration token file on the target host (as downloaded from the NVIDIA licensing
            portal or a DLS instance). Copy it there first, with mode C(0600)
            (M(ansible.builtin.copy)).
        type: path
        required: true
      feature:
        description:
          - The licensed feature, C(FeatureType) in the guest - V(vgpu) (1, the vGPU type decides the edition),
            V(vws) (2, RTX Virtual Workstation), V(vcs) (4, Virtual Compute Server).
        type: str
        choices: [vgpu, vws, vcs]
        default: vgpu
      guest:
        description: The guest's first-boot agent - V(linux) (cloud-init) or V(windows) (cloudbase-init).
        type: str
        choices: [linux, windows]
        default: linux
      pool:
        description:
          - The libvirt storage pool for the seed volume (default - the pool of the VM's O(clone), else
            C(default)). The pre-flight checks it is active.
        type: str
"""
