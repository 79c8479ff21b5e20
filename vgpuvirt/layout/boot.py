"""``layout install-boot``: keep a layout across reboots with a systemd unit and nothing but python3.

What a reboot loses (VFs, vGPU 17+ VF types, MIG instances, mdevs that mdevctl does not define) the unit
``vgpuvirt-layout.service`` makes again, after the NVIDIA vGPU manager (its types exist only then) and
before libvirtd and libvirt-guests (so autostarted VMs find their devices). It runs the shipped
``layout_boot.py`` beside the shipped ``agent.py`` on a program of concrete devices (:func:`boot_program`)
taken from the host once it is in the layout: the same PCI addresses and the same mdev UUIDs come back,
so domains that name them start again.

One owner per device: an mdev that mdevctl defines is mdevctl's (it starts it at boot); the program leaves
it out, and the boot script never creates a UUID mdevctl has a definition of.
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

from vgpuvirt.change.boot import InstallBootUnit
from vgpuvirt.change.mdev_service import MdevService
from vgpuvirt.change.runner import run_host
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Host
from vgpuvirt.layout import verbs
from vgpuvirt.layout.model import VFIO, Layout, LayoutConfig
from vgpuvirt.layout.schema import dump_layout
from vgpuvirt.services import host_files
from vgpuvirt.services.nvidia import modes as nvidia_modes

UNIT_NAME = "vgpuvirt-layout.service"
LIB_DIR = "/usr/lib/vgpuvirt"
ETC_DIR = "/etc/vgpuvirt"
PROGRAM = f"{ETC_DIR}/layout-boot.json"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
WANTS_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"

def unit_text(config: str) -> str:
    return f"""\
[Unit]
Description=vgpuvirt GPU layout {config} (SR-IOV, MIG, vGPU types, mdevs) made again at boot
Documentation=https://github.com/vgpuvirt/vgpuvirt/blob/main/docs/layouts.md
After=nvidia-vgpu-mgr.service nvidia-vgpud.service systemd-modules-load.service
Wants=nvidia-vgpu-mgr.service
Before=libvirtd.service libvirt-guests.service virtqemud.service
ConditionPathExists={PROGRAM}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/python3 {LIB_DIR}/layout_boot.py {PROGRAM}

[Install]
WantedBy=multi-user.target
"""


def boot_program(host: Host, config: LayoutConfig, *, mdevctl_defined: set[str] | None = None) -> dict[str, Any]:
    """The concrete devices of the GPUs ``config`` governs, read from ``host`` (which must be in it)."""
    differences = verbs.check(host, config)
    if differences:
        raise InvalidSpec(f"host {host.name} for install-boot", config.name,
                          "a host already in the layout (run `vgpuvirt layout apply` first): "
                          + "; ".join(differences[:3]))
    _, gpus = verbs.read_gpus(host)
    governed = config.resolve([(g.address, g.product, g.pci_id) for g in gpus])
    mode_of = {a: e.layout.mode for a, e in governed.items()}
    out: list[dict[str, Any]] = []
    for g in gpus:
        if g.address not in governed:
            continue
        mdevs = [{"uuid": v.uuid, "parent": str(v.place), "type": v.type_id} for v in g.vgpus
                 if v.uuid is not None and v.uuid not in (mdevctl_defined or set())]
        vf_types = {str(v.place): int(v.type_id.removeprefix("nvidia-")) for v in g.vgpus if v.uuid is None}
        # MIG mode survives a reboot on the GPU; its GPU instances do not (created again, named by PCI bus id)
        mig = {"bus_id": nvidia_modes.nvidia_smi_bus_id(g.address),
               "want": dict(sorted((g.budget.gpu_instances or {}).items())),
               "compute": mode_of.get(g.address) == "mig"} if g.mig is not None and g.mig_enabled else None
        # mixed-size mode does not survive a reboot (the driver starts in equal-size mode): set it again
        sizing = [list(op.argv or ()) for op in nvidia_modes.mixed_size_item(host.name, g.address, True).ops] \
            if g.budget.sizing == "mixed" and g.budget.mixed_size_supported else []
        out.append({"address": str(g.address), "driver": VFIO if g.driver == VFIO else None, "sizing": sizing,
                    "functions": [str(a) for a in g.functions] if g.driver == VFIO else [],
                    "vfs": len(g.vfs), "mig": mig, "vf_types": vf_types, "mdevs": mdevs})
    return {"version": 1, "config": config.name, "root": host.sysfs_root, "gpus": out}


def bundle(layout: Layout, config: LayoutConfig, program: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every file install-boot puts on the host: path -> {"text", "mode"} (or {"link"})."""
    files = importlib.resources.files("vgpuvirt.host")
    return {
        f"{ETC_DIR}/layouts/{config.name}.yaml": {"text": dump_layout(layout), "mode": "644"},
        PROGRAM: {"text": json.dumps(program, indent=1, sort_keys=True) + "\n", "mode": "644"},
        f"{LIB_DIR}/agent.py": {"text": files.joinpath("agent.py").read_text(), "mode": "644"},
        f"{LIB_DIR}/layout_boot.py": {"text": files.joinpath("layout_boot.py").read_text(), "mode": "644"},
        UNIT_PATH: {"text": unit_text(config.name), "mode": "644"},
        WANTS_LINK: {"link": UNIT_PATH},
    }


def install_bundle(host: Host, files: dict[str, dict[str, str]], prefix: str = "/") -> list[str]:
    """Write the files on ``host`` under ``prefix`` in one round trip, as one step of the change engine: a failure
    puts back what was there (:class:`~vgpuvirt.change.boot.InstallBootUnit`)."""
    run_host(host, [InstallBootUnit(host.name, "", json.dumps(files, sort_keys=True), prefix)], what="install-boot")
    return host_files.paths(files, prefix)


def install_boot(host: Host, layout: Layout, config: LayoutConfig, *, prefix: str = "/",
                 target: Host | None = None) -> dict[str, Any]:
    """Install ``config`` on ``host`` for boot; ``target`` writes the files elsewhere (a simulated host has
    no /etc: its tests install into a directory of this machine)."""
    defined = MdevService(host).defined(required=False) or {}
    program = boot_program(host, config, mdevctl_defined={str(u) for u in defined})
    paths = install_bundle(target or host, bundle(layout, config, program), prefix)
    return {"host": host.name, "config": config.name, "installed": paths, "unit": UNIT_NAME,
            "devices": sum(len(g["mdevs"]) + len(g["vf_types"]) for g in program["gpus"])}
