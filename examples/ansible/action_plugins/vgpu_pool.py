# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Action plugin for vgpu_pool: places the whole pool on the controller, then runs the module once per host.

Ansible runs an action plugin once per host, each in its own worker, and no task can wait for the others: so
the fleet's state comes from an earlier task (vgpu_info with survey: true, the fact ``vgpuvirt_survey``), and
every host's worker computes the same placement from the same surveys (the play's hosts in play order, the
library's deterministic placement) and keeps its own share. The module then plans and applies that share on
the host in one run: one SSH session per host, whatever the count.
"""

from __future__ import annotations

import importlib.util

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

SURVEY_FACT = "vgpuvirt_survey"


def _module_spec(loader):
    """The module's own ARGUMENT_SPEC (the file Ansible will ship), so controller and host validate alike."""
    ctx = loader.find_plugin_with_context("vgpu_pool")
    if not ctx.resolved:
        raise AnsibleError("vgpu_pool: the module vgpu_pool was not found next to its action plugin (library/)")
    spec = importlib.util.spec_from_file_location("_vgpu_pool_module", ctx.plugin_resolved_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        module = _module_spec(self._shared_loader_obj.module_loader)
        validation, args = self.validate_argument_spec(argument_spec=module.ARGUMENT_SPEC)
        args = {k: v for k, v in args.items() if v is not None}
        fleet = None
        if args["state"] != "absent":
            try:
                fleet, share, host_name = self._place(module, validation.validated_parameters, task_vars)
            except _Refused as exc:
                result.update(failed=True, msg=str(exc), **exc.fields)
                return result
            args.update(placed=share, host_name=host_name)
        out = self._execute_module(module_name="vgpu_pool", module_args=args, task_vars=task_vars)
        result.update(out)
        if fleet is not None:
            result["fleet"] = fleet
        return result

    def _place(self, module, params, task_vars):
        try:
            from vgpuvirt.errors import VgpuvirtError
            from vgpuvirt.provision.pool import Survey, place_pool
        except ImportError as exc:
            raise _Refused(f"vgpu_pool places the pool on the controller: install vgpuvirt in the controller's "
                           f"Python ({exc})", error="MissingDependency") from None
        me = task_vars.get("inventory_hostname")
        hosts = list(task_vars.get("ansible_play_hosts") or [me])
        hostvars = task_vars.get("hostvars", {})
        try:
            surveys = []
            for h in hosts:
                facts = hostvars[h].get("ansible_facts", {}) if h in hostvars else {}
                data = facts.get(SURVEY_FACT)
                if data is None:
                    raise _Refused(f"vgpu_pool {params['name']}: no survey of host {h}: run vgpu_info with "
                                   f"survey: true on every host of the play first (the fact {SURVEY_FACT})",
                                   error="InvalidSpec")
                surveys.append(Survey.from_dict(_plain(data), f"{h}'s {SURVEY_FACT}"))
            template = module.member_request(params, params["name"] + "-01") if params["count"] else None
            if template is None:
                mine = next(s.host for h, s in zip(hosts, surveys, strict=True) if h == me)
                return {"pool": params["name"], "count": 0, "per_host": {}}, [], mine
            pool = place_pool(surveys, params["name"], params["count"], template, policy=params["policy"])
        except VgpuvirtError as exc:
            raise _Refused(str(exc), error=type(exc).__name__) from None
        mine = next(s.host for h, s in zip(hosts, surveys, strict=True) if h == me)
        return pool.to_dict(), pool.shares[mine], mine


def _plain(data):
    """Ansible's tagged/unsafe containers as plain dicts, lists and strings (the survey is data)."""
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if isinstance(data, str):
        return str(data)
    return data


class _Refused(Exception):
    def __init__(self, msg, **fields):
        super().__init__(msg)
        self.fields = fields
