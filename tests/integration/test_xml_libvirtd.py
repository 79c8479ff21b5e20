"""Every template x device mix defined on the real libvirtd (qemu driver); each template, without hostdevs, started.

Defining a domain with mdev/PCI hostdevs works without VFIO; starting one would fail here (no VFIO in this
kernel), so only hostdev-free domains are started. Every domain defined here is undefined again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from conftest import require_part  # type: ignore[import-not-found]
from xmlcheck import cases, check_create

from vgpuvirt.xml import Disk, Domain, DomainOptions, VirtioNic, build_domain

pytestmark = pytest.mark.integration
# One prefix per process: the testbed's libvirtd is shared by xdist workers and by other sessions, so a fixed
# name (and the cases' one fixed UUID) let one run's define, or its clean-up of "leftovers", hit another's
# domains ("already defined with uuid", "Domain not found").
PREFIX = f"vgpuvirt-it-xml-{uuid.uuid4().hex[:8]}-"


@pytest.fixture(scope="module")
def conn(testbed: Any) -> Iterator[Any]:
    try:
        import libvirt
    except ImportError:
        require_part("libvirt-python", False, "pip install 'vgpuvirt[libvirt]'")
        raise
    libvirt.registerErrorHandler(lambda *_a: None, None)
    try:
        c = libvirt.open(testbed.libvirt_uri)
    except libvirt.libvirtError as exc:
        require_part("libvirtd", False, f"cannot connect to {testbed.libvirt_uri}: {exc}")
        raise
    _cleanup(c)
    yield c
    _cleanup(c)
    c.close()


def _undefine(dom: Any) -> None:
    import libvirt
    if dom.isActive():
        dom.destroy()
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)


def _cleanup(c: Any) -> None:
    """Remove what this process defined and left (only its own prefix: other runs' domains are theirs)."""
    for dom in c.listAllDomains():
        if dom.name().startswith(PREFIX):
            _undefine(dom)


@pytest.mark.parametrize("case", sorted(cases()))
def test_define_on_qemu_driver(conn: Any, case: str) -> None:
    template, kw = cases()[case]
    dom = build_domain(template, **{**kw, "name": PREFIX + case, "uuid": uuid.uuid4()})
    xml = dom.to_xml()
    check_create(xml)
    virdom = conn.defineXML(xml)
    try:
        back = Domain.from_xml(virdom.XMLDesc(0))
        assert back.gpu_devices() == dom.gpu_devices()
        assert [d for d in back.hostdevs() if d.guest_address is not None] or not kw.get("pci")
    finally:
        _undefine(virdom)
    assert PREFIX + case not in [d.name() for d in conn.listAllDomains()]


def _kvm_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


# Testbed limits (the defines above prove the full templates, secure boot and Hyper-V included):
# this nested KVM refuses Hyper-V VP_INDEX ("kernel doesn't allow setting HyperV VP_INDEX") and has no SMM
# ("System Management Mode not supported by this hypervisor", which secure boot needs); host-passthrough and
# host-model crash this QEMU unless arch-capabilities is disabled (TESTBED.md); no hugepages are reserved.
@pytest.mark.parametrize("template, options", [
    ("vdi", DomainOptions(tpm=True, graphics="vnc", hyperv=False, disable_arch_capabilities=True,
                          virtio_nics=(VirtioNic("user"),))),
    ("gaming", DomainOptions(disable_arch_capabilities=True, hugepages=False, hyperv=False,
                             virtio_nics=(VirtioNic("user"),))),
    ("compute", DomainOptions(disable_arch_capabilities=True, virtio_nics=(VirtioNic("user"),))),
])
def test_template_without_hostdevs_starts(conn: Any, template: str, options: DomainOptions, tmp_path: Path) -> None:
    disk = None
    if template == "vdi":  # the vdi template has a disk of its own: QEMU opens it, so it must exist
        require_part("qemu-img", shutil.which("qemu-img") is not None, "apt-get install qemu-utils")
        path = tmp_path / "vdi.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "16M"], check=True)
        disk = Disk(str(path))
    dom = build_domain(template, name=f"{PREFIX}start-{template}", memory_mib=256, vcpus=1, options=options,
                       disk=disk)
    if not _kvm_usable():  # TCG: no host CPU to pass through
        dom.root.set("type", "qemu")
        cpu = dom.child("cpu")
        if cpu is not None:
            dom.root.remove(cpu)
    xml = dom.to_xml()
    check_create(xml)
    virdom = conn.defineXML(xml)
    try:
        virdom.create()
        assert virdom.isActive()
        live = Domain.from_xml(virdom.XMLDesc(0))
        assert live.name == f"{PREFIX}start-{template}"
        assert live.root.get("id") is not None  # only a running domain has an id
    finally:
        _undefine(virdom)
