"""``vgpuvirt sim fault PROFILE GPU KIND [VALUE]``: inject a fault into the simulated hosts of a profile.

The fault is written to the faults file (``--file``, default ``$VGPUVIRT_SIM_FAULTS``); every ``--host
sim:PROFILE`` command run with ``VGPUVIRT_SIM_FAULTS`` naming that file sees it (nvidia-smi readings, dmesg
XIDs), so inventory warns and placement skips the GPU::

    export VGPUVIRT_SIM_FAULTS=/tmp/sim-faults.json
    vgpuvirt sim fault t4x2 0000:3b:00.0 xid 79
    vgpuvirt sim fault t4x2 0000:d8:00.0 link-width 8
    vgpuvirt sim fault t4x2 ALL --clear
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from vgpuvirt.cli.context import Context, plain
from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress


def register(actions: Any) -> None:
    from vgpuvirt.sim.telemetry import FAULT_KINDS
    p = actions.add_parser("fault", help="inject a GPU fault (XID, ECC, pending repair, PCIe link) into sim hosts")
    p.add_argument("profile", help="the profile whose simulated hosts get the fault (t4x2, large, ...)")
    p.add_argument("gpu", help="the physical GPU's PCI address (ALL with --clear)")
    p.add_argument("kind", nargs="?", choices=FAULT_KINDS, help="what goes wrong")
    p.add_argument("value", nargs="?", type=int, help="xid: the XID code; ecc: errors (1); link-width/-gen: new value")
    p.add_argument("--clear", action="store_true", help="remove the GPU's faults (ALL: every GPU's)")
    p.add_argument("--file", default=None, help="the faults file (default: $VGPUVIRT_SIM_FAULTS)")
    p.set_defaults(func=run)


def run(ctx: Context, args: argparse.Namespace) -> int:
    from vgpuvirt.sim import load_profile
    from vgpuvirt.sim.telemetry import FAULTS_ENV, save_fault

    path = args.file or os.environ.get(FAULTS_ENV)
    if not path:
        raise InvalidSpec("--file", None, f"a faults file (or set {FAULTS_ENV})")
    profile = load_profile(args.profile)
    gpu = args.gpu
    if not (args.clear and gpu == "ALL"):
        gpu = str(PciAddress.parse(gpu))
        gpus = {str(d.address) for d in profile.devices
                if d.vgpu is not None or (d.vendor == 0x10DE and d.pci_class >> 16 == 0x03)}
        if gpu not in gpus:
            raise InvalidSpec("GPU", args.gpu, f"a GPU of profile {profile.name}")
    if args.clear == (args.kind is not None):
        raise InvalidSpec("fault", args.kind, "a fault kind, or --clear (not both)")
    if args.kind in ("xid", "link-width", "link-gen") and (args.value is None or args.value < 0):
        raise InvalidSpec(args.kind, args.value, "a non-negative integer value")
    faults = save_fault(os.path.abspath(path), profile.name, gpu, None if args.clear else args.kind, args.value)
    if ctx.json:
        ctx.emit_json({"profile": profile.name, "file": path, "faults": faults})
    else:
        what = "cleared" if args.clear else f"{args.kind}{'' if args.value is None else ' ' + str(args.value)}"
        ctx.console().print(plain(f"{profile.name} {gpu}: {what} ({path})"))
    return 0
