"""The simulated host's measurements in the driver's formats: the readings part of ``nvidia-smi -q -x``,
``nvidia-smi vgpu -q`` and the NVIDIA lines of ``dmesg`` (state in :mod:`vgpuvirt.sim.telemetry`).

Element names and layouts are the real ones (tests/fixtures/nvidia-smi, tests/fixtures/hostdata,
tests/fixtures/real): the layout follows the profile's driver. Before R555 ECC counters use the
``single_bit``/``double_bit`` layout, from R555 the SRAM/DRAM one; before R560 the power is ``power_draw``,
from R560 ``average_power_draw`` and ``instant_power_draw`` (real H100, R580). Pre-Ampere boards (no SR-IOV,
no MIG: T4, V100) retire pages; Ampere and later remap rows. An idle vGPU-host GPU (no vGPU) sits in P8 with
its PCIe link at generation 1 (INFERRED from desktop boards); an idle Hopper on the datacenter driver stays in
P0 at generation 5 (real H100/H200, persistence mode on). ``Frame Rate Limit : Disabled`` for a vGPU whose
``vgpu_params`` turn the limiter off is INFERRED (real samples show ``N/A`` or ``60 FPS``).
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET

from vgpuvirt.sim.devices import Dev
from vgpuvirt.sim.model import SimModel
from vgpuvirt.sim.profiles import VgpuType
from vgpuvirt.sim.telemetry import BOOT_TIME, SimTelemetry

# (power limit W, max PCIe generation) by product-name hint; the default is a 250 W gen-4 board. H100 SXM5 and
# H200: 700 W, gen 5 (real captures); L4 72 W (real fixture); the others from NVIDIA's data sheets, INFERRED.
_BOARDS = {"T4": (70, 3), "V100": (250, 3), "P40": (250, 3), "A10": (150, 4), "A16": (250, 4), "A100": (300, 4),
           "A30": (165, 4), "A40": (300, 4), "L4": (72, 4), "L40S": (350, 4), "H100": (700, 5), "H200": (700, 5)}

VgpuRef = tuple[str, VgpuType, int | None, str, str]   # (key: mdev UUID or VF address, type, GI, parent, params)


def telemetry(model: SimModel) -> SimTelemetry:
    return model.telemetry


def bus_id(d: Dev) -> str:
    a = d.spec.address
    return f"{a.domain:08X}:{a.bus:02X}:{a.slot:02X}.{a.function:X}"


def _board(d: Dev) -> tuple[int, int]:
    words = (d.spec.product or "").replace("-", " ").split()
    return next((_BOARDS[w] for w in reversed(words) if w in _BOARDS), (250, 4))


def vgpus_of(model: SimModel, d: Dev) -> list[VgpuRef]:
    """The vGPUs on one physical GPU: mdevs on the PF or its VFs, and vGPU 17+ VFs with a type."""
    members = {d.addr} | {v.addr for v in model.vfs(d)}
    out: list[VgpuRef] = [(m.uuid, m.type, m.gi, m.parent, m.vgpu_params)
                          for m in sorted(model.mdevs.values(), key=lambda m: m.uuid) if m.parent in members]
    g = d.gpu
    for v in sorted(model.vfs(d), key=lambda v: v.addr):
        t = g.table.by_number(v.vendor_type) if g is not None and v.vendor_type else None
        if t is not None:
            out.append((v.addr, t, v.vendor_gi, v.addr, ""))
    return out


def _graphics(t: VgpuType) -> bool:
    return t.name.rstrip("0123456789").endswith(("Q", "B", "A")) and not t.name.endswith("C")


def _sub(parent: ET.Element, tag: str, text: str) -> None:
    ET.SubElement(parent, tag).text = text


def _group(parent: ET.Element, tag: str, items: list[tuple[str, str]]) -> None:
    el = ET.SubElement(parent, tag)
    for k, v in items:
        _sub(el, k, v)


def vgpu_util(tel: SimTelemetry, key: str, t: VgpuType, n: int) -> dict[str, float]:
    share = 90.0 / max(1, n)
    enc = _graphics(t)
    return {"sm": round(tel.wave(key, "sm", low=share * 0.2, high=share)),
            "mem": round(tel.wave(key, "mem", low=share * 0.1, high=share * 0.6)),
            "enc": round(tel.wave(key, "enc", high=30.0 / max(1, n))) if enc else 0.0,
            "dec": round(tel.wave(key, "dec", high=10.0 / max(1, n))) if enc else 0.0,
            "fb": round(tel.wave(key, "fb", low=t.framebuffer_mib * 0.1, high=t.framebuffer_mib * 0.8))}


def add_gpu_readings(model: SimModel, d: Dev, e: ET.Element) -> None:
    """Append the readings of one GPU to its ``<gpu>`` element (order as nvidia-smi prints them)."""
    tel = telemetry(model)
    f = tel.gpu_faults(d.addr)
    vgpus = vgpus_of(model, d)
    utils = [vgpu_util(tel, k, t, len(vgpus)) for k, t, _, _, _ in vgpus]
    # a Hopper on the datacenter driver (persistence mode on) stays in P0 at full link speed when idle (real
    # H100/H200); a vGPU host's idle GPU drops to P8 and gen 1
    awake = d.gpu is not None and not d.gpu.vgpu_host
    busy = bool(vgpus) or awake
    limit, gen_max = _board(d)
    major = int(model.driver_version.split(".", 1)[0] or 0)
    sm = min(100.0, sum(u["sm"] for u in utils))
    pci = e.find("pci")
    if pci is not None:
        link = ET.SubElement(pci, "pci_gpu_link_info")
        gen = f.link_gen or (gen_max if busy else 1)
        _group(link, "pcie_gen", [("max_link_gen", str(gen_max)), ("current_link_gen", str(gen)),
                                  ("device_current_link_gen", str(gen)), ("max_device_link_gen", str(gen_max)),
                                  # a guest cannot see the host's root port: N/A (real H100/H200 guests)
                                  ("max_host_link_gen", "N/A" if model.profile.guest else str(gen_max))])
        _group(link, "link_widths", [("max_link_width", "16x"), ("current_link_width", f"{f.link_width or 16}x")])
    fb = e.find("fb_memory_usage")
    pstate = ET.Element("performance_state")
    pstate.text = "P0" if busy else "P8"
    e.insert(list(e).index(fb) if fb is not None else len(e), pstate)     # pci, performance_state, fb (real order)
    if fb is not None and d.gpu is not None:
        used = sum(t.framebuffer_mib for _, t, _, _, _ in vgpus)
        total = d.gpu.table.fb_total_mib or d.gpu.table.framebuffer_mib
        for tag, mib in (("used", used), ("free", total - d.gpu.table.fb_reserved_mib - used)):
            el = fb.find(tag)
            if el is not None:
                el.text = f"{mib} MiB"
    _group(e, "utilization", [("gpu_util", f"{sm:.0f} %"),
                              ("memory_util", f"{min(100.0, sum(u['mem'] for u in utils)):.0f} %"),
                              ("encoder_util", f"{min(100.0, sum(u['enc'] for u in utils)):.0f} %"),
                              ("decoder_util", f"{min(100.0, sum(u['dec'] for u in utils)):.0f} %")])
    sessions = sum(1 for u in utils if u["enc"] > 0)
    fps = round(tel.wave(d.addr, "fps", low=30, high=60)) if sessions else 0
    latency = round(tel.wave(d.addr, "lat", low=2000, high=9000)) if sessions else 0
    _group(e, "encoder_stats", [("session_count", str(sessions)), ("average_fps", str(fps)),
                                ("average_latency", str(latency))])
    ecc = "Enabled" if model.ecc_enabled else "Disabled"
    _group(e, "ecc_mode", [("current_ecc", ecc), ("pending_ecc", ecc)])
    errs = ET.SubElement(e, "ecc_errors")
    for side in ("volatile", "aggregate"):
        el = ET.SubElement(errs, side)
        if major >= 555:
            for tag, n in (("sram_correctable", 0), ("sram_uncorrectable_parity", 0), ("sram_uncorrectable_secded", 0),
                           ("dram_correctable", f.ecc_corrected), ("dram_uncorrectable", f.ecc_uncorrected)):
                _sub(el, tag, str(n))
            continue
        _group(el, "single_bit", [("device_memory", str(f.ecc_corrected)), ("total", str(f.ecc_corrected))])
        _group(el, "double_bit", [("device_memory", str(f.ecc_uncorrected)), ("total", str(f.ecc_uncorrected))])
    remaps = d.spec.sriov is not None or (d.gpu is not None and bool(d.gpu.table.mig_profiles))
    na = "N/A"
    rp = ET.SubElement(e, "retired_pages")
    _group(rp, "multiple_single_bit_retirement", [("retired_count", na if remaps else "0"),
                                                  ("retired_pagelist", na if remaps else "")])
    _group(rp, "double_bit_retirement", [("retired_count", na if remaps else str(min(1, f.ecc_uncorrected))),
                                         ("retired_pagelist", na if remaps else "")])
    _sub(rp, "pending_blacklist", na if remaps else ("Yes" if f.repair_pending else "No"))
    _sub(rp, "pending_retirement", na if remaps else ("Yes" if f.repair_pending else "No"))
    _group(e, "remapped_rows", [("remapped_row_corr", "0" if remaps else na),
                                ("remapped_row_unc", str(min(1, f.ecc_uncorrected)) if remaps else na),
                                ("remapped_row_pending", ("Yes" if f.repair_pending else "No") if remaps else na),
                                ("remapped_row_failure", ("Yes" if f.repair_failed else "No") if remaps else na)])
    _group(e, "temperature", [("gpu_temp", f"{30 + 0.4 * sm:.0f} C")])
    draw = f"{(70 if awake else 15) + (limit - (70 if awake else 15)) * sm / 100:.2f} W"
    # R560+: no power_draw (real H100, R580)
    readings = [("average_power_draw", draw), ("instant_power_draw", draw)] if major >= 560 else [("power_draw", draw)]
    _group(e, "gpu_power_readings", [("power_state", "P0" if busy else "P8"), *readings,
                                     ("current_power_limit", f"{limit:.2f} W")])
    _group(e, "clocks", [("graphics_clock", f"{1590 if busy else 300} MHz"),
                         ("sm_clock", f"{1590 if busy else 300} MHz"),
                         ("mem_clock", f"{5000 if busy else 405} MHz"),
                         ("video_clock", f"{1470 if busy else 540} MHz")])


def _line(key: str, value: str, indent: int) -> str:
    pad = 38 - indent
    return f"{' ' * indent}{key:<{pad}}: {value}\n"


def vgpu_query(model: SimModel, gpus: list[Dev]) -> str:
    """``nvidia-smi vgpu -q`` for every GPU (one block per GPU, one per active vGPU)."""
    tel = telemetry(model)
    out: list[str] = []
    for d in gpus:
        vgpus = vgpus_of(model, d)
        out.append(f"GPU {bus_id(d)}\n")
        out.append(_line("Active vGPUs", str(len(vgpus)), 4))
        for key, t, gi, _parent, params in vgpus:
            u = vgpu_util(tel, key, t, len(vgpus))
            vm_name, vm_uuid = tel.vms.get(key, ("", ""))
            frl_off = "frame_rate_limiter=0" in params.replace(" ", "")
            frl = "Disabled" if frl_off else (f"{t.frl} FPS" if t.frl else "N/A")
            inst = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
            enc = u["enc"] > 0
            out.append(_line("vGPU ID", str(inst), 4))
            for k, v in (("VM UUID", vm_uuid), ("VM Name", vm_name), ("vGPU Name", f"{t.name}"),
                         ("vGPU Type", str(t.number or 0)), ("vGPU UUID", ""),
                         ("MDEV UUID", key if "-" in key else "N/A"), ("Guest Driver Version", "N/A"),
                         ("License Status", "N/A (Expiry: N/A)"), ("GPU Instance ID", str(gi) if gi is not None
                                                                    else "N/A"),
                         ("Accounting Mode", "N/A"), ("ECC Mode", "N/A"), ("Accounting Buffer Size", "4000"),
                         ("Frame Rate Limit", frl)):
                out.append(_line(k, v, 8))
            out.append("        FB Memory Usage\n")
            for k, mib in (("Total", t.framebuffer_mib), ("Used", u["fb"]), ("Free", t.framebuffer_mib - u["fb"])):
                out.append(_line(k, f"{mib:.0f} MiB", 12))
            out.append("        Utilization\n")
            for k, name in (("Gpu", "sm"), ("Memory", "mem"), ("Encoder", "enc"), ("Decoder", "dec")):
                out.append(_line(k, f"{u[name]:.0f} %", 12))
            out.append("        Encoder Stats\n")
            fps = min(float(t.frl or 60), round(tel.wave(key, "fps", low=24, high=60))) if enc else 0
            for k, v in (("Active Sessions", "1" if enc else "0"), ("Average FPS", f"{fps:.0f}"),
                         ("Average Latency", str(round(tel.wave(key, "lat", low=2000, high=9000)) if enc else 0))):
                out.append(_line(k, v, 12))
    return "".join(out)


def dmesg(model: SimModel, gpus: list[Dev]) -> str:
    """The NVIDIA lines of the kernel log: driver load, the scheduler's message per vGPU-capable GPU, XIDs."""
    tel = telemetry(model)
    v = model.driver_version
    # the first two lines as a real R580 prints them (real H100); the builder's name is INFERRED
    lines: list[tuple[float, str]] = [(4.2, "nvidia: loading out-of-tree module taints kernel."),
                                      (4.3, f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {v}  "
                                            "Release Build  (dvs-builder@)  ")]
    for d in gpus:
        if d.gpu is not None and d.gpu.vgpu_host:
            # printed at the driver's load: the policy the loaded registry (RmPVMRL) gave, not later NVML sets
            policy = model.sched.loaded_policy(d.addr)
            state = "DISABLED" if policy == "BEST_EFFORT" else "ENABLED"
            lines.append((9.8, f"NVRM: GPU at {d.addr} has software scheduler {state} with policy {policy}."))
        a = d.spec.address
        for code, at, text in tel.gpu_faults(d.addr).xids:
            lines.append((max(0.0, at - BOOT_TIME),
                          f"NVRM: Xid (PCI:{a.domain:04x}:{a.bus:02x}:{a.slot:02x}): {code}, pid='<unknown>', "
                          f"name=<unknown>, {text}"))
    lines.sort(key=lambda x: x[0])
    return "".join(f"[{ts:12.6f}] {text}\n" for ts, text in lines)
