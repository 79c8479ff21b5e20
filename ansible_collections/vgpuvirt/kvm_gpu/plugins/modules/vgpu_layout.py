#!/usr/bin/python
# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Ansible module: a host's GPU layout applied or asserted (docs/layouts.md); thin over vgpuvirt.layout."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vgpu_layout
short_description: Apply or assert a declared GPU layout (passthrough, vGPU, MIG, SR-IOV) on the target host
description:
  - Takes the target's GPUs to one named config of a vgpuvirt layout (YAML, C(version) v1, see docs/layouts.md) -
    driver binding, SR-IOV VFs, MIG mode and GPU instances, vGPU types and mdevs, in that order, in one
    locked batch per phase; a failure rolls back what the task did.
  - A change that would remove or retype a device a libvirt domain uses is refused, naming the VMs, unless
    O(drain=shutdown) (needs O(uri)).
  - Check mode plans and reports what would change, with a diff, and changes nothing. A rerun reports no change.
version_added: "0.1.0"
author:
  - vgpuvirt contributors (@vgpuvirt)
requirements:
  - python >= 3.10
  - vgpuvirt (on the target host)
  - libvirt-python (only when O(uri) is set)
options:
  layout:
    description:
      - The layout, as YAML text (for example C(lookup('file', 'lab.yaml'))) or as a mapping.
      - An nvidia-mig-parted (C(mig-configs)) or vGPU Device Manager (C(vgpu-configs)) file works as it is.
      - Mutually exclusive with O(path); one of them is required.
    type: raw
  path:
    description:
      - A layout file on the target.
    type: path
  config:
    description:
      - The config to apply; may be left out when the layout has one config (or one called C(default)).
    type: str
  state:
    description:
      - V(applied) takes the host to the config; V(asserted) changes nothing and fails when the host differs.
    type: str
    choices: [applied, asserted]
    default: applied
  drain:
    description:
      - What to do with VMs that use a device the layout removes or retypes. V(refuse) fails naming them;
        V(shutdown) shuts them down, applies, and starts again those that still fit (their XML moved to the new
        device); the others are reported and left defined, stopped.
    type: str
    choices: [refuse, shutdown]
    default: refuse
  drain_timeout:
    description: Seconds to wait for a graceful shutdown.
    type: float
    default: 120
  force:
    description: Destroy the VMs still running after O(drain_timeout).
    type: bool
    default: false
  uri:
    description:
      - libvirt URI whose domains are checked (and drained). Without it no VM is checked.
    type: str
  sysfs_root:
    description: Read and write sysfs below this directory (tests, simulated hosts).
    type: path
    default: /
  host_name:
    description: The name the host goes by in messages (default the target's hostname).
    type: str
attributes:
  check_mode:
    support: full
    description:
      - Plans and reports the steps, with a diff - before, the governed GPUs as a layout; after, the same with the
        GPUs the config changes in its words (a GPU already in state is as before).
  diff_mode:
    support: full
    description: Before and after are the governed GPUs exported as a layout.
notes:
  - One round trip per phase (read, prepare, re-read, devices), whatever the number of GPUs; see docs/layouts.md.
seealso:
  - module: vgpuvirt.kvm_gpu.vgpu_info
  - module: vgpuvirt.kvm_gpu.vgpu_mdev
"""

EXAMPLES = r"""
- name: The lab's day layout
  vgpuvirt.kvm_gpu.vgpu_layout:
    layout: "{{ lookup('file', 'layouts/lab.yaml') }}"
    config: day
    uri: qemu:///system
    drain: shutdown
"""

RETURN = r"""
steps:
  description: What was done (or, in check mode, would be), in order.
  returned: success
  type: list
  elements: str
differences:
  description: How the host differs from the config (state=asserted; before the change otherwise).
  returned: always
  type: list
  elements: str
round_trips:
  description: Round trips per phase to the host.
  returned: state=applied
  type: dict
unfit:
  description: Drained VMs that no longer fit, with why.
  returned: drain=shutdown
  type: dict
"""

from pathlib import Path

from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.common import (
    HAS_VGPUVIRT,
    new_module,
    run_module,
)

if HAS_VGPUVIRT:  # else new_module() fails the task in Ansible's words
    from vgpuvirt.ansible_support import open_local_host as open_host
    from vgpuvirt.errors import InvalidSpec, ProvisioningError
    from vgpuvirt.layout import verbs
    from vgpuvirt.layout.drain import apply_with_drain
    from vgpuvirt.layout.interop import read_any as parse_layout  # mig-parted / vGPU DM files work as they are

ARGUMENT_SPEC = dict(
    layout=dict(type="raw"),
    path=dict(type="path"),
    config=dict(type="str"),
    state=dict(type="str", choices=["applied", "asserted"], default="applied"),
    drain=dict(type="str", choices=["refuse", "shutdown"], default="refuse"),
    drain_timeout=dict(type="float", default=120.0),
    force=dict(type="bool", default=False),
    uri=dict(type="str", no_log=False),  # no secret: see docs/ansible.md "Secrets"
    sysfs_root=dict(type="path", default="/"),
    host_name=dict(type="str"),
)
MODULE_KWARGS = dict(
    mutually_exclusive=[("layout", "path")],
    required_one_of=[("layout", "path")],
    supports_check_mode=True,
)


def the_layout(params):
    if params["path"]:
        return parse_layout(Path(params["path"]).read_text(encoding="utf-8"), params["path"])
    raw = params["layout"]
    if isinstance(raw, dict):
        import yaml  # a mapping is dumped and read back: the same checks, lines of the dump

        return parse_layout(yaml.safe_dump(raw, sort_keys=False), "layout (task argument)")
    if not isinstance(raw, str):
        raise InvalidSpec("layout", type(raw).__name__, "YAML text or a mapping")
    return parse_layout(raw, "layout (task argument)")


def governed(host, cfg):
    """The governed GPUs as the host exports them and as the config would leave them (vgpuvirt's
    diff_documents: a GPU already in state is the same in both), two layout documents: the diff."""
    d = verbs.diff_documents(host, cfg)
    return d.before, d.after


def run(module, host):
    p = module.params
    layout = the_layout(p)
    cfg = layout.config(p["config"])
    differences = verbs.check(host, cfg)
    if p["state"] == "asserted":
        if differences:
            module.fail_json(msg=f"{host.name} is not in layout {cfg.name}: " + "; ".join(differences),
                             differences=differences, changed=False)
        return dict(changed=False, differences=[], steps=[])
    if module.check_mode or not differences:
        plan = verbs.plan(host, cfg)
        steps = [s.text for s in plan.phase(1) + plan.phase(2)] + [f"then: {x}" for x in plan.pending]
        before, after = governed(host, cfg)
        return dict(changed=bool(differences), differences=differences, steps=steps,
                    diff=dict(before=before, after=after if differences else before))
    before, dummy = governed(host, cfg)
    conns = None
    if p["uri"]:
        from vgpuvirt.libvirt_conn import LibvirtConnection

        conns = {host.name: LibvirtConnection(p["uri"])}
    try:
        report = apply_with_drain([host], cfg, conns=conns or {host.name: None}, drain=p["drain"],
                                  timeout=p["drain_timeout"], force=p["force"])
    finally:
        for c in (conns or {}).values():
            c.close()
    r = report.results[0]
    out = dict(changed=r.changed, differences=differences, steps=[s.text for s in r.done],
               round_trips=r.round_trips, drained=report.drained.get(host.name, []),
               restarted=report.restarted.get(host.name, []), unfit=report.unfit.get(host.name, {}),
               diff=dict(before=before, after=governed(host, cfg)[0]))
    if not report.ok:
        module.fail_json(msg=f"{host.name}: layout {cfg.name} applied, but drained VMs no longer fit: "
                             + "; ".join(f"{vm} ({why})" for vm, why in sorted(out["unfit"].items())), **out)
    return out


def main():
    module = new_module(ARGUMENT_SPEC, **MODULE_KWARGS)
    run_module(module, open_host, run, carried=(ProvisioningError,))


if __name__ == "__main__":
    main()
