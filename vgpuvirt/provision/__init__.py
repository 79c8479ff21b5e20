"""Provisioning: requests by need, explainable placement, plan/apply with rollback, teardown.

::

    from vgpuvirt.provision import VmRequest, VgpuRequest, plan, apply, teardown
    vms = VmRequest.pool("vdi", 40, gpu=VgpuRequest(min_framebuffer_mib=2048, series="Q"))
    p = plan([inventory(host)], vms, domains={host.name: list(conn.domain_xml_pairs())})
    print(p.format())                  # dry run
    apply(p, host, conn)               # or ProvisioningError, with everything it did undone
"""

from vgpuvirt.provision.apply import apply
from vgpuvirt.provision.placement import Assignment, Candidate, place
from vgpuvirt.provision.plan import Plan, plan
from vgpuvirt.provision.request import NicRequest, TypeProfile, VgpuRequest, VmRequest, provisioning_options
from vgpuvirt.provision.run import provision
from vgpuvirt.provision.teardown import TeardownResult, teardown

__all__ = [
    "Assignment", "Candidate", "NicRequest", "Plan", "TeardownResult", "TypeProfile", "VgpuRequest", "VmRequest",
    "apply", "place", "plan", "provision", "provisioning_options", "teardown",
]
