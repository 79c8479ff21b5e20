# Copyright: vgpuvirt contributors. Apache-2.0 (see the project's license).
"""Action plugin for vgpu_pool: places the whole pool on the controller, then runs the module once per host.

Ansible runs an action plugin once per host, each in its own worker, and no task can wait for the others: so
the fleet's state comes from an earlier task (vgpu_info with survey: true, the fact ``vgpuvirt_survey``), and
every host's worker computes the same placement from the same surveys (the play's hosts in play order, the
library's deterministic placement) and keeps its own share. The module then plans and applies that share on
the host in one run: one SSH session per host, whatever the count.

A host of the play that has left it (unreachable, or its survey failed) is unknown, not empty: the members
missing from the other hosts may be on it, so they are held back, not created elsewhere (vgpuvirt's
``place_pool(unreachable=...)``), and the task says so in a warning and in ``fleet``. So are the hosts a
``--limit`` leaves out of the play.
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.vgpuvirt.kvm_gpu.plugins.module_utils.pool import (
    ARGUMENT_SPEC,
    MODULE_KWARGS,
    member_request,
)

SURVEY_FACT = "vgpuvirt_survey"
MODULE = "vgpuvirt.kvm_gpu.vgpu_pool"
LIMITED = "the hosts outside --limit "


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        # the module's own spec (module_utils/pool.py), so the controller and the host validate alike
        validation, dummy = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            mutually_exclusive=MODULE_KWARGS["mutually_exclusive"],
        )
        params = validation.validated_parameters
        # The module gets the task's own arguments, not the validated ones: validation fills every unset
        # suboption of gpus with None, which the module would check against its choices again.
        args = dict(self._task.args)
        fleet = None
        if params["state"] != "absent":
            try:
                fleet, share, host_name = self._place(params, task_vars)
            except _Refused as exc:
                result.update(failed=True, msg=str(exc), **exc.fields)
                return result
            args.update(placed=share, host_name=host_name)
        out = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        result.update(out)
        if fleet is not None:
            result["fleet"] = fleet
            if fleet["unreachable"]:
                silent = [h for h in fleet["unreachable"] if not h.startswith(LIMITED)]
                why = ([f"host(s) {', '.join(silent)} did not answer"] if silent else []) + [
                    h for h in fleet["unreachable"] if h.startswith(LIMITED)]
                result.setdefault("warnings", []).append(
                    f"vgpu_pool {params['name']}: {'; '.join(why)}: what they hold is unknown, so no member was "
                    f"re-created elsewhere"
                    + (f" ({', '.join(fleet['held'])} held back until they answer)" if fleet["held"] else ""))
        return result

    def _place(self, params, task_vars):
        try:
            from vgpuvirt.errors import VgpuvirtError
            from vgpuvirt.provision.pool import Survey, place_pool
        except ImportError as exc:
            raise _Refused(f"vgpu_pool places the pool on the controller: install vgpuvirt in the controller's "
                           f"Python ({exc})", error="MissingDependency") from None
        me = task_vars.get("inventory_hostname")
        hosts = list(task_vars.get("ansible_play_hosts") or [me])
        # hosts the play started with that have left it (unreachable, or a failed survey): unknown, not empty
        gone = [h for h in task_vars.get("ansible_play_hosts_all") or hosts if h not in hosts]
        if task_vars.get("ansible_limit"):
            # --limit leaves the pool's other hosts out of the play altogether: as unknown as a silent one
            gone.append(f"{LIMITED}{task_vars['ansible_limit']}")
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
            mine = next(s.host for h, s in zip(hosts, surveys, strict=True) if h == me)
            if not params["count"]:
                return {"pool": params["name"], "count": 0, "per_host": {}, "unreachable": gone, "held": []}, [], mine
            # plain values: the library checks domain options' exact types, and a task's strings arrive here as
            # Ansible's tagged str subclasses (graphics: vnc was refused as "expected a str")
            template = member_request(_plain(params), params["name"] + "-01", on_target=False)
            pool = place_pool(surveys, params["name"], params["count"], template, policy=params["policy"],
                              unreachable=gone)
        except VgpuvirtError as exc:
            raise _Refused(str(exc), error=type(exc).__name__) from None
        except StopIteration:
            raise AnsibleError(f"vgpu_pool: {me} is not among the play's hosts") from None
        return pool.to_dict(), pool.shares[mine], mine


def _plain(data):
    """Ansible's tagged/unsafe containers as plain dicts, lists and strings (the survey is data)."""
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if isinstance(data, str):
        return str(data)
    if isinstance(data, bool):
        return data
    if isinstance(data, int):
        return int(data)
    if isinstance(data, float):
        return float(data)
    return data


class _Refused(Exception):
    def __init__(self, msg, **fields):
        super().__init__(msg)
        self.fields = fields
