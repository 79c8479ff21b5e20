"""Domain XML for GPU-backed VMs: element classes, templates, lint and schema validation (pure lxml, no I/O).

See docs/xml.md. ``build_domain(...)`` is the one call most callers need.
"""

from vgpuvirt.xml.domain import Domain, GpuDevices, device_xml
from vgpuvirt.xml.element import GuestAddress
from vgpuvirt.xml.hostdev import (
    GpuDevice,
    HostdevInterface,
    MdevHostdev,
    PciHostdev,
    Virtualport,
    device_from_element,
)
from vgpuvirt.xml.lint import LintProblem, check, lint
from vgpuvirt.xml.nodedev import NodeDevice, NodedevMdevType, parse_nodedev, parse_nodedevs
from vgpuvirt.xml.parts import CdRom, CpuPinning, Disk, EvdevInput, Graphics, Tpm, VirtioNic
from vgpuvirt.xml.schema import SchemaMissing, validate
from vgpuvirt.xml.templates import TEMPLATES, DomainOptions, build_domain, load_template

# Names the provisioning layer uses for the build inputs.
MdevSpec = MdevHostdev
PciSpec = PciHostdev
NicVfSpec = HostdevInterface

__all__ = [
    "TEMPLATES", "CdRom", "CpuPinning", "Disk", "Domain", "DomainOptions", "EvdevInput", "GpuDevice", "GpuDevices",
    "Graphics", "GuestAddress", "HostdevInterface", "LintProblem", "MdevHostdev", "MdevSpec", "NicVfSpec",
    "NodeDevice", "NodedevMdevType", "PciHostdev", "PciSpec", "SchemaMissing", "Tpm", "VirtioNic", "Virtualport",
    "build_domain", "check", "device_from_element", "device_xml", "lint", "load_template", "parse_nodedev",
    "parse_nodedevs", "validate",
]
