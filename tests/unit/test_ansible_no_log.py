"""Which Ansible module options may carry secrets, decided per option and pinned here (issue 15).

An option marked ``no_log=True`` is masked in every output and log Ansible writes; one that carries no secret
stays visible (masking a URI such as ``qemu:///system`` would also mask it inside every error message). Each
option of each module is in :data:`DECISIONS`, so a new option fails this test until someone decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ansible")
from test_ansible_modules import load  # type: ignore[import-not-found]

MODULES = ("vgpu_domain", "vgpu_info", "vgpu_mdev", "vgpu_passthrough", "vgpu_pool")

# option (suboptions as parent.child) -> no_log. Nothing these modules take is a secret: libvirt URIs carry no
# password (libvirt gets credentials from SSH keys, SASL or auth.conf; ?keyfile= names a file, it is not the key),
# and addresses, UUIDs, types, paths and sizes are what the playbook's output must show.
DECISIONS: dict[str, bool] = {
    "name": False, "state": False, "template": False, "gpus": False, "memory_mib": False, "vcpus": False,
    "host_cpus": False, "disk": False, "domain_options": False, "policy": False, "remove_storage": False,
    "uri": False, "sysfs_root": False, "host_name": False, "use_nvml": False, "uuid": False, "vf": False,
    "type": False, "need": False, "parent": False, "persistent": False, "mdevctl_command": False,
    "addresses": False, "binding": False, "domain": False, "timeout": False,
    # issue 16: the fleet pool (vgpu_pool) and vgpu_info's survey for it
    "count": False, "placed": False, "survey": False,
    # issue 28: the pool's disks (a path, or linked clones of a golden image)
    "clone": False, **{f"clone.{k}": False for k in ("golden", "pool", "name", "capacity_gib")},
    # issues 26 and 28: the provisioning options and a licensed desktop. The token is a secret, but the module takes
    # the token FILE's path, read on the target; the contents never become an argument (the library shows only
    # their SHA-256), which tests/integration/test_ansible_license.py checks in -vvv output.
    "networks": False, "bridges": False, "tpm": False, "secure_boot": False, "graphics": False,
    "license": False, **{f"license.{k}": False for k in ("token_file", "feature", "guest", "pool")},
    **{f"{p}.{k}": False for p in ("gpus", "need") for k in (
        "type", "min_framebuffer_mib", "min_heads", "series", "min_resolution", "mig_backed", "vendor", "mode",
        "display", "with_audio")},
}
# Ansible masks and warns about options named like passwords (module_utils.basic.PASSWORD_MATCH); ansible-test's
# sanity check also asks for an explicit no_log on names with key/secret/token/pass
SECRET_LIKE = re.compile(r"pass(?!ive)|secret|token|key|credential|auth", re.I)
# options that could be mistaken for a secret carrier: their "no" must be written out in the spec
EXPLICIT = {"uri"}


def _spec(module: str) -> dict[str, Any]:
    arg_spec: dict[str, Any] = load(module).ARGUMENT_SPEC
    return arg_spec


def _options(spec: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, opts in spec.items():
        yield prefix + name, opts
        if opts.get("options"):
            yield from _options(opts["options"], f"{prefix}{name}.")


@pytest.mark.parametrize("module", MODULES)
def test_every_option_has_a_no_log_decision(module: str) -> None:
    for name, opts in _options(_spec(module)):
        assert name in DECISIONS, f"{module}: option {name!r} is new: decide whether it may carry a secret"
        assert bool(opts.get("no_log", False)) is DECISIONS[name], f"{module}.{name}: no_log differs from DECISIONS"
        if SECRET_LIKE.search(name.rsplit(".", 1)[-1]) or name in EXPLICIT:
            assert "no_log" in opts, f"{module}.{name}: name looks like a secret; set no_log explicitly"


@pytest.mark.parametrize("module", MODULES)
def test_ansible_does_not_warn_about_no_log(module: str) -> None:
    basic = pytest.importorskip("ansible.module_utils.basic")
    for name, opts in _options(_spec(module)):
        leaf = name.rsplit(".", 1)[-1]
        # AnsibleModule._log_invocation warns "Module did not set no_log for X" exactly in this case
        assert not (opts.get("no_log") is None and basic.PASSWORD_MATCH.search(leaf)), f"{module}.{name}"


def test_no_log_options_are_masked_by_ansible() -> None:
    # the mechanism the decisions rely on: a no_log option's value is collected for masking, others are not
    parameters = pytest.importorskip("ansible.module_utils.common.parameters")
    spec = {"uri": {"type": "str", "no_log": False}, "token": {"type": "str", "no_log": True}}
    masked = parameters._list_no_log_values(spec, {"uri": "qemu:///system", "token": "s3cr3t"})
    assert masked == {"s3cr3t"}
