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

from vgpuvirt.errors import HostError, InvalidSpec
from vgpuvirt.host.base import Host
from vgpuvirt.layout import verbs
from vgpuvirt.layout.model import VFIO, Layout, LayoutConfig
from vgpuvirt.layout.schema import dump_layout
from vgpuvirt.services import nvidia_modes
from vgpuvirt.services.mdev import MdevService

UNIT_NAME = "vgpuvirt-layout.service"
LIB_DIR = "/usr/lib/vgpuvirt"
ETC_DIR = "/etc/vgpuvirt"
PROGRAM = f"{ETC_DIR}/layout-boot.json"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
WANTS_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"

# Written into files on the host and run there: stdlib only, argv/stdin data only.
_INSTALLER = """\
import json, os, sys
prefix = sys.argv[1]
for rel, spec in json.load(sys.stdin).items():
    path = os.path.join(prefix, rel.lstrip('/'))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if spec.get('link'):
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(spec['link'], path)
        continue
    tmp = path + '.vgpuvirt-tmp'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, int(spec['mode'], 8))
    with os.fdopen(fd, 'w') as f:
        f.write(spec['text'])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print(path)
"""


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
    """Write the files on ``host`` under ``prefix`` in one round trip (python3 -c, the files as JSON on stdin)."""
    res = host.run(["python3", "-c", _INSTALLER, prefix], stdin=json.dumps(files))
    if not res.ok:
        raise HostError(host.name, f"install-boot: writing the files failed (exit {res.exit_code}): "
                                   f"{res.stderr.strip()[-300:]}")
    return [line for line in res.stdout.splitlines() if line]


def install_boot(host: Host, layout: Layout, config: LayoutConfig, *, prefix: str = "/",
                 target: Host | None = None) -> dict[str, Any]:
    """Install ``config`` on ``host`` for boot; ``target`` writes the files elsewhere (a simulated host has
    no /etc: its tests install into a directory of this machine)."""
    defined = MdevService(host).defined(required=False) or {}
    program = boot_program(host, config, mdevctl_defined={str(u) for u in defined})
    paths = install_bundle(target or host, bundle(layout, config, program), prefix)
    return {"host": host.name, "config": config.name, "installed": paths, "unit": UNIT_NAME,
            "devices": sum(len(g["mdevs"]) + len(g["vf_types"]) for g in program["gpus"])}
