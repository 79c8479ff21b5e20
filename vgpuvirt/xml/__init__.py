"""Domain XML for GPU-backed VMs: element classes, templates, lint and schema validation (pure lxml, no I/O).

See docs/xml.md. ``build_domain(...)`` is the one call most callers need.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# The names load on first use: a module that imports one submodule (vgpuvirt.xml.refs, to read which devices a
# domain uses) runs this file first, and importing every builder, the templates and lint here cost each CLI call
# ~25 ms it did not need.
_LAZY = {
    "Domain": "domain", "GpuDevices": "domain", "device_xml": "domain", "GuestAddress": "element",
    "GpuDevice": "hostdev", "HostdevInterface": "hostdev", "MdevHostdev": "hostdev", "PciHostdev": "hostdev",
    "Virtualport": "hostdev", "device_from_element": "hostdev", "LintProblem": "lint", "check": "lint",
    "lint": "lint", "NodeDevice": "nodedev", "NodedevMdevType": "nodedev", "parse_nodedev": "nodedev",
    "parse_nodedevs": "nodedev", "CdRom": "parts", "CpuPinning": "parts", "Disk": "parts", "EvdevInput": "parts",
    "Graphics": "parts", "Tpm": "parts", "VirtioNic": "parts", "SchemaMissing": "schema", "validate": "schema",
    "TEMPLATES": "templates", "DomainOptions": "templates", "build_domain": "templates",
    "load_template": "templates",
}
_ALIASES = {"MdevSpec": "MdevHostdev", "PciSpec": "PciHostdev", "NicVfSpec": "HostdevInterface"}


def __getattr__(name: str) -> Any:
    real = _ALIASES.get(name, name)
    module = _LAZY.get(real)
    if module is None:
        raise AttributeError(f"module 'vgpuvirt.xml' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"vgpuvirt.xml.{module}"), real)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_ALIASES])


class _Package(types.ModuleType):
    """``vgpuvirt.xml.lint`` is both a submodule and the function the package exports under that name. The
    import system sets the package's attribute to the submodule when it is first imported (which, with lazy
    names, may come after ``lint`` was looked up or never); the function keeps the name, as when every name
    was imported here eagerly."""

    @property
    def lint(self) -> Any:
        from vgpuvirt.xml.lint import lint
        return lint

    @lint.setter
    def lint(self, value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package


__all__ = [
    "TEMPLATES", "CdRom", "CpuPinning", "Disk", "Domain", "DomainOptions", "EvdevInput", "GpuDevice", "GpuDevices",
    "Graphics", "GuestAddress", "HostdevInterface", "LintProblem", "MdevHostdev", "MdevSpec", "NicVfSpec",
    "NodeDevice", "NodedevMdevType", "PciHostdev", "PciSpec", "SchemaMissing", "Tpm", "VirtioNic", "Virtualport",
    "build_domain", "check", "device_from_element", "device_xml", "lint", "load_template", "parse_nodedev",
    "parse_nodedevs", "validate",
]
