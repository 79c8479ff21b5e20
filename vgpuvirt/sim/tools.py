"""Emulated host tools for SimHost.run and ``exec`` ops: a few nvidia-smi forms and sriov-manage.

Only what vgpuvirt and its users call is emulated; every answer comes from (and changes) the model.

* ``nvidia-smi -q -x`` (with the readings of :mod:`vgpuvirt.sim.nvsmi_render`), ``nvidia-smi -L``,
  ``nvidia-smi vgpu -q``, ``dmesg`` (the NVIDIA lines: scheduler message, XIDs)
* ``nvidia-smi vgpu -i N -shm 0|1``   (heterogeneous mode; rc 19 "In use by another client" with vGPUs)
* ``nvidia-smi [-i N] -mig 0|1`` (pending until reset when the GPU is busy), ``nvidia-smi -i N -r``,
  ``nvidia-smi mig -lgip|-lgipp|-lgi|-lci|-cgi|-cci|-dci|-dgi`` (:mod:`vgpuvirt.sim.mig_tools`)
* ``/usr/lib/nvidia/sriov-manage -e|-d ADDR|ALL``
* ``mkdir -p -m 0700 /var/lib/vgpuvirt`` (vgpuvirt's state directory, always there)
Anything else exits 127 ("command not found").
"""

from __future__ import annotations

import errno
import posixpath
import uuid as _uuid
import xml.etree.ElementTree as ET

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.model import PciAddress
from vgpuvirt.sim import mig_tools
from vgpuvirt.sim.devices import gpu_uuid
from vgpuvirt.sim.fs_etc import STATE_DIR
from vgpuvirt.sim.model import Dev, Gpu, SimModel
from vgpuvirt.sim.nvsmi_query import query_gpu
from vgpuvirt.sim.nvsmi_render import add_gpu_readings, dmesg, vgpu_query

Outcome = tuple[int, str, str]

# NVML return codes as nvidia-smi reports them (exit status == NVML error code).
_NOT_SUPPORTED = 3
_IN_USE = 19
_INVALID = 2


def nvidia_gpus(model: SimModel) -> list[Dev]:
    """The NVML devices: NVIDIA physical functions bound to the nvidia driver, by PCI address."""
    return [d for d in model.devices.values()
            if d.spec.vendor == 0x10DE and d.physfn is None and (d.spec.pci_class >> 16) == 0x03
            and d.driver == "nvidia"]


def _bus_id(d: Dev) -> str:
    a = d.spec.address
    return f"{a.domain:08X}:{a.bus:02X}:{a.slot:02X}.{a.function:X}"


def _gpu_uuid(d: Dev) -> str:
    return gpu_uuid(d.addr)


#: product-name word -> (<product_brand>, <product_architecture>): Hopper (H100, H200) from the real R580
#: captures, Turing (T4), Ampere (A100-class) and Ada (L4) from the real fixtures in tests/fixtures/nvidia-smi;
#: the rest INFERRED from NVIDIA's product lines. GeForce/RTX desktop boards say "GeForce".
_ARCH = {"T4": "Turing", "V100": "Volta", "P40": "Pascal", "A10": "Ampere", "A16": "Ampere", "A100": "Ampere",
         "A30": "Ampere", "A40": "Ampere", "L4": "Ada Lovelace", "L40S": "Ada Lovelace", "H100": "Hopper",
         "H200": "Hopper", "RTX": "Ampere"}


def _brand_arch(d: Dev) -> tuple[str, str]:
    words = (d.spec.product or "").replace("[", " ").replace("]", " ").split()
    arch = next((_ARCH[w] for w in words if w in _ARCH), "N/A")
    return ("GeForce" if "GeForce" in words else "NVIDIA"), arch


def _driver_major(model: SimModel) -> int:
    head = model.driver_version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _xml(model: SimModel) -> str:
    body = ET.tostring(_xml_root(model), encoding="unicode")
    # the DTD's name: v13 on R580 (real), v12 on the R535-R575 samples (tests/fixtures/nvidia-smi)
    dtd = "nvsmi_device_v13.dtd" if _driver_major(model) >= 580 else "nvsmi_device_v12.dtd"
    return f'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "{dtd}">\n' + body + "\n"


def _xml_root(model: SimModel) -> ET.Element:
    """The ``nvidia-smi -q -x`` document of this moment (``--query-gpu`` reads its fields off it too)."""
    # Elements in the order a real R580 prints them (tests/fixtures/real/h100-580/raw/nvidia-smi-q.xml); the
    # simulator prints the ones vgpuvirt reads, a subset, and nothing a real driver does not print.
    gpus = nvidia_gpus(model)
    root = ET.Element("nvidia_smi_log")
    ET.SubElement(root, "timestamp").text = "Thu Jan  1 00:00:00 2026"
    ET.SubElement(root, "driver_version").text = model.driver_version
    # "Not Found" on the vGPU host (no CUDA there); a datacenter driver has CUDA (13.0 with R580, real)
    ET.SubElement(root, "cuda_version").text = "13.0" if _driver_major(model) >= 580 else "Not Found"
    ET.SubElement(root, "attached_gpus").text = str(len(gpus))
    for d in gpus:
        g = d.gpu
        e = ET.SubElement(root, "gpu", id=_bus_id(d))
        ET.SubElement(e, "product_name").text = d.spec.product or "NVIDIA GPU"
        brand, arch = _brand_arch(d)
        ET.SubElement(e, "product_brand").text = brand
        ET.SubElement(e, "product_architecture").text = arch
        mig = ET.SubElement(e, "mig_mode")
        capable = g is not None and bool(g.table.mig_profiles)
        if g is not None and capable:
            pending = g.mig_enabled if g.mig_pending is None else g.mig_pending
            ET.SubElement(mig, "current_mig").text = "Enabled" if g.mig_enabled else "Disabled"
            ET.SubElement(mig, "pending_mig").text = "Enabled" if pending else "Disabled"
        else:
            ET.SubElement(mig, "current_mig").text = "N/A"
            ET.SubElement(mig, "pending_mig").text = "N/A"
        if g is not None and g.mig_enabled and any(g.compute_instances.values()):
            devs = ET.SubElement(e, "mig_devices")     # one MIG device per compute instance (mig_a100.xml layout)
            for n, (gi, ci, _name) in enumerate(mig_tools.mig_devices(g)):
                md = ET.SubElement(devs, "mig_device")
                ET.SubElement(md, "index").text = str(n)
                ET.SubElement(md, "gpu_instance_id").text = str(gi)
                ET.SubElement(md, "compute_instance_id").text = str(ci)
        elif capable:
            # a MIG-capable GPU with no MIG device prints the element with "None" (real H100, MIG off; the same
            # with MIG on and no compute instance is INFERRED)
            ET.SubElement(e, "mig_devices").text = "\n\t\t\tNone\n\t\t"
        ET.SubElement(e, "uuid").text = _gpu_uuid(d)
        virt = ET.SubElement(e, "gpu_virtualization_mode")
        if g is None or not g.vgpu_host:
            # a guest sees its passed-through GPU as "Pass-Through" (real H100/H200); bare metal says "None"
            ET.SubElement(virt, "virtualization_mode").text = "Pass-Through" if model.profile.guest else "None"
            ET.SubElement(virt, "host_vgpu_mode").text = "N/A"
            ET.SubElement(virt, "vgpu_heterogeneous_mode").text = "N/A"
        else:
            ET.SubElement(virt, "virtualization_mode").text = "Host VGPU"
            ET.SubElement(virt, "host_vgpu_mode").text = "SR-IOV" if d.spec.sriov else "Non SR-IOV"
            ET.SubElement(virt, "vgpu_heterogeneous_mode").text = "Enabled" if g.heterogeneous else "Disabled"
            # Newer drivers list the GPU's vGPU capabilities (hostdata nvml_nvidia_smi.txt: "Heterogeneous
            # Time-Slice Sizes : Supported"); the XML element names are INFERRED from nvidia-smi's naming.
            cap = ET.SubElement(virt, "vgpu_device_capability")
            ET.SubElement(cap, "heterogeneous_timeslice_sizes").text = (
                "Supported" if g.table.heterogeneous else "Not Supported")
        pci = ET.SubElement(e, "pci")
        a = d.spec.address
        for tag, val in (("pci_bus", f"{a.bus:02X}"), ("pci_device", f"{a.slot:02X}"),
                         ("pci_domain", f"{a.domain:04X}"),
                         ("pci_device_id", f"{d.spec.device:04X}{d.spec.vendor:04X}"), ("pci_bus_id", _bus_id(d)),
                         ("pci_sub_system_id", f"{d.spec.subsystem_device:04X}{d.spec.subsystem_vendor:04X}")):
            ET.SubElement(pci, tag).text = val
        fb = ET.SubElement(e, "fb_memory_usage")
        total = (g.table.fb_total_mib or g.table.framebuffer_mib) if g is not None else 0
        reserved = g.table.fb_reserved_mib if g is not None else 0
        for tag, mib in (("total", total), ("reserved", reserved), ("used", 0), ("free", total - reserved)):
            ET.SubElement(fb, tag).text = f"{mib} MiB"
        add_gpu_readings(model, d, e)
    return root


def _bus_key(text: str) -> tuple[int, int, int, int] | None:
    parts = text.strip().split(":")
    try:
        dom = int(parts[0], 16) if len(parts) == 3 else 0
        bus, rest = parts[-2], parts[-1]
        slot, func = rest.split(".")
        return dom, int(bus, 16), int(slot, 16), int(func, 16)
    except (ValueError, IndexError):
        return None


def _pick_gpu(model: SimModel, index: str) -> tuple[Dev, Gpu | None] | None:
    """``-i``: an index, or a PCI bus id (``00000000:3D:00.0`` as nvidia-smi prints it, or ``3d:00.0``)."""
    gpus = nvidia_gpus(model)
    if ":" in index:
        key = _bus_key(index)
        d = next((g for g in gpus if key is not None and _bus_key(_bus_id(g)) == key), None)
        return (d, d.gpu) if d is not None else None
    try:
        d = gpus[int(index)]
    except (ValueError, IndexError):
        return None
    return d, d.gpu


def _opt(argv: list[str], flag: str) -> str | None:
    if flag in argv:
        i = argv.index(flag)
        if i + 1 < len(argv):
            return argv[i + 1]
    return None


def _nvidia_smi(model: SimModel, args: list[str]) -> Outcome:
    gpus = nvidia_gpus(model)
    if not gpus:
        return 9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    if args in (["-q", "-x"], ["-x", "-q"]):
        return 0, _xml(model), ""
    if args[:1] == ["vgpu"] and not any(d.gpu is not None and d.gpu.vgpu_host for d in gpus):
        # every `vgpu` query on a driver that is not the vGPU host driver (real H100/H200, R580: -q -s -c -ss)
        return 0, "No supported devices in vGPU mode\n", ""
    if len(args) == 2 and args[0].startswith("--query-gpu=") and args[1].startswith("--format="):
        return query_gpu(_xml_root(model), args[0].split("=", 1)[1].split(","), args[1].split("=", 1)[1])
    if args == ["vgpu", "-q"]:
        return 0, vgpu_query(model, gpus), ""
    if args == ["-L"]:
        lines = []
        for i, d in enumerate(gpus):
            lines.append(f"GPU {i}: {d.spec.product or 'NVIDIA GPU'} (UUID: {_gpu_uuid(d)})\n")
            if d.gpu is not None and d.gpu.mig_enabled:
                for n, (gi, ci, name) in enumerate(mig_tools.mig_devices(d.gpu)):
                    mig_uuid = _uuid.uuid5(_uuid.NAMESPACE_URL, f"vgpuvirt-sim-mig:{d.addr}:{gi}:{ci}")
                    lines.append(f"  MIG {name:<12}Device {n:2d}: (UUID: MIG-{mig_uuid})\n")
        return 0, "".join(lines), ""
    if args[:1] == ["vgpu"] and "-shm" in args:
        picked = _pick_gpu(model, _opt(args, "-i") or "")
        value = _opt(args, "-shm")
        if picked is None or value not in ("0", "1"):
            return _INVALID, "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
        d, g = picked
        if g is None:
            return _NOT_SUPPORTED, "", f"Setting vGPU heterogeneous mode is not supported for GPU {_bus_id(d)}.\n"
        try:
            model.set_heterogeneous(g, value == "1")
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                return _NOT_SUPPORTED, "", f"Setting vGPU heterogeneous mode is not supported for GPU {_bus_id(d)}.\n"
            return _IN_USE, "", (f"Failed to set vGPU heterogeneous mode for GPU {_bus_id(d)}: "
                                 "In use by another client\n")
        word = "Enabled" if value == "1" else "Disabled"
        return 0, f"{word} vGPU heterogeneous mode for GPU {_bus_id(d)}\n", ""
    if args[:1] == ["mig"]:
        return mig_tools.mig(model, gpus, lambda key: _pick_gpu(model, key), args[1:])
    if "-mig" in args or "-r" in args or "--gpu-reset" in args:
        sel = _opt(args, "-i")
        chosen: list[tuple[Dev, Gpu | None]] = []
        for key in (sel.split(",") if sel is not None else [str(i) for i in range(len(gpus))]):
            picked = _pick_gpu(model, key)
            if picked is None:
                return _INVALID, "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
            chosen.append(picked)
        if "-mig" not in args:
            return mig_tools.reset(model, chosen)
        value = _opt(args, "-mig")
        if value not in ("0", "1"):
            return _INVALID, "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
        return mig_tools.set_mode(model, chosen, value == "1")
    return _INVALID, "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def _sriov_manage(model: SimModel, args: list[str]) -> Outcome:
    if len(args) != 2 or args[0] not in ("-e", "-d"):
        return 1, "", "Usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>\n"
    enable = args[0] == "-e"
    if args[1] == "ALL":
        targets = [d for d in nvidia_gpus(model) if d.spec.sriov is not None]
    else:
        try:
            addr = str(PciAddress.parse(args[1]))
        except InvalidSpec:
            return 1, "", f"Invalid PCI address {args[1]}\n"
        d = model.devices.get(addr)
        if d is None or d.spec.vendor != 0x10DE or d.spec.sriov is None or d.physfn is not None:
            return 1, "", f"{args[1]} is not an NVIDIA SR-IOV physical function\n"
        targets = [d]
    out = []
    for d in targets:
        assert d.spec.sriov is not None
        out.append(f"{'Enabling' if enable else 'Disabling'} VFs on {d.addr}\n")
        want = d.spec.sriov.totalvfs if enable else 0
        if d.numvfs == want or (enable and d.numvfs):
            continue
        try:
            model.set_numvfs(d, str(want))
        except OSError as exc:
            return 1, "".join(out), f"Cannot {'enable' if enable else 'disable'} VFs on {d.addr}: {exc.strerror}\n"
    return 0, "".join(out), ""


def run_tool(model: SimModel, argv: list[str], stdin: str) -> Outcome:
    """Run one emulated tool against the model: (exit status, stdout, stderr)."""
    prog = posixpath.basename(argv[0])
    with model.lock:
        if prog == "nvidia-smi":
            return _nvidia_smi(model, argv[1:])
        if prog == "sriov-manage":
            return _sriov_manage(model, argv[1:])
        if prog == "dmesg" and len(argv) == 1:
            return 0, dmesg(model, nvidia_gpus(model)), ""
        if prog == "mkdir" and argv[1:] == ["-p", "-m", "0700", STATE_DIR]:
            return 0, "", ""          # vgpuvirt's state directory always exists on a simulated host
    return 127, "", f"{argv[0]}: command not found\n"
