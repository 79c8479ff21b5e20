"""``vgpuvirt xml``: build domain XML from a template, lint a file, list a domain's GPU devices."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vgpuvirt import files
from vgpuvirt.cli.context import printable
from vgpuvirt.errors import InvalidSpec, VgpuvirtError, XmlError
from vgpuvirt.model import MacAddress, MdevUuid, PciAddress, parse_cpulist


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("xml", help="build, lint and inspect libvirt domain XML")
    sub = p.add_subparsers(dest="xml_command", metavar="ACTION")
    sub.required = True

    b = sub.add_parser("build", help="fill a template (vdi, gaming, compute or a file) and print the XML")
    b.add_argument("--template", required=True, help="vdi | gaming | compute | PATH")
    b.add_argument("--name", required=True)
    b.add_argument("--uuid", default=None, help="VM UUID (generated for unmanaged PCI hostdevs if omitted)")
    b.add_argument("--memory-mib", type=int, default=4096)
    b.add_argument("--vcpus", type=int, default=2)
    b.add_argument("--mdev", action="append", default=[], metavar="UUID[:display][:ramfb]")
    b.add_argument("--pci", action="append", default=[], metavar="ADDR[:unmanaged][:display][:ramfb][:iommufd]")
    b.add_argument("--nic", action="append", default=[], metavar="ADDR,MAC[,VLAN]", help="SR-IOV NIC VF")
    b.add_argument("--disk", default=None, metavar="PATH")
    b.add_argument("--graphics", choices=("spice", "vnc", "none"), default=None)
    b.add_argument("--secure-boot", action="store_true")
    b.add_argument("--tpm", action="store_true")
    b.add_argument("--pin", default=None, metavar="CPULIST", help="host CPUs for the vCPUs, in order")
    b.add_argument("--emulator-pin", default="", metavar="CPULIST")
    b.add_argument("--host-cpus", default=None, metavar="CPULIST", help="the host's online CPUs (checked)")
    b.add_argument("--numa-node", type=int, default=None)
    b.add_argument("--no-validate", action="store_true", help="skip libvirt's RelaxNG schema check")
    b.set_defaults(func=_build)

    lint = sub.add_parser("lint", help="check a domain XML file (lint rules + libvirt's schema)")
    lint.add_argument("file")
    lint.add_argument("--host-cpus", default=None, metavar="CPULIST")
    lint.set_defaults(func=_lint)

    dev = sub.add_parser("devices", help="list the GPU-related devices of a domain XML file")
    dev.add_argument("file")
    dev.set_defaults(func=_devices)


def _json(ctx: Any, args: argparse.Namespace) -> bool:
    return bool(ctx.json)


def _split_flags(spec: str, allowed: set[str], what: str) -> tuple[str, set[str]]:
    # UUIDs never contain ':' and PCI addresses do, so only known trailing flag words are split off.
    parts = spec.split(":")
    flags: set[str] = set()
    while parts and parts[-1] in allowed:
        flags.add(parts.pop())
    if not parts:
        raise InvalidSpec(what, spec, "a device followed by optional :flag words")
    return ":".join(parts), flags


def _build(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.xml import (
        CpuPinning,
        Disk,
        DomainOptions,
        HostdevInterface,
        MdevHostdev,
        PciHostdev,
        build_domain,
    )

    mdevs = []
    for spec in args.mdev:
        uuid, flags = _split_flags(spec, {"display", "ramfb"}, "--mdev")
        mdevs.append(MdevHostdev(MdevUuid.parse(uuid), display="display" in flags or "ramfb" in flags,
                                 ramfb="ramfb" in flags))
    pci = []
    for spec in args.pci:
        addr, flags = _split_flags(spec, {"unmanaged", "display", "ramfb", "iommufd"}, "--pci")
        # display/ramfb: a vGPU 17+ VF desktop; these three are newer than libvirt 9.0 (its schema refuses them)
        pci.append(PciHostdev(PciAddress.parse(addr), managed="unmanaged" not in flags,
                              display="display" in flags or "ramfb" in flags, ramfb="ramfb" in flags,
                              iommufd=True if "iommufd" in flags else None))
    nics = []
    for spec in args.nic:
        fields = spec.split(",")
        if len(fields) not in (2, 3):
            raise InvalidSpec("--nic", spec, "ADDR,MAC[,VLAN]")
        vlan = None
        if len(fields) == 3:
            if not fields[2].isdigit():
                raise InvalidSpec("VLAN id", fields[2], "an integer 0..4095")
            vlan = int(fields[2])
        nics.append(HostdevInterface(PciAddress.parse(fields[0]), mac=MacAddress.parse(fields[1]), vlan=vlan))
    pinning = CpuPinning.from_cpulist(args.pin, emulator=args.emulator_pin) if args.pin else None
    dom = build_domain(
        args.template, name=args.name, uuid=args.uuid, memory_mib=args.memory_mib, vcpus=args.vcpus,
        mdevs=mdevs, pci=pci, nics=nics, disk=Disk(args.disk) if args.disk else None, cpu_pinning=pinning,
        host_cpus=parse_cpulist(args.host_cpus) if args.host_cpus is not None else None,
        numa_node=args.numa_node,
        options=DomainOptions(graphics=args.graphics, secure_boot=args.secure_boot, tpm=args.tpm),
        validate=not args.no_validate)
    xml = dom.to_xml()
    if _json(ctx, args):
        ctx.emit_json({"name": dom.name, "uuid": str(dom.uuid) if dom.uuid else None, "xml": xml,
                       "devices": dom.gpu_devices().to_dict()})
    else:
        sys.stdout.write(xml)
    return 0


def _read(path: str) -> bytes:
    # bytes: the XML parser honours the document's own encoding and reports bad bytes as an XmlError
    return files.read_bytes(path, "domain XML file")


def _lint(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.xml import Domain, lint, validate

    dom = Domain.from_xml(_read(args.file))
    problems = [str(p) for p in lint(dom, parse_cpulist(args.host_cpus) if args.host_cpus is not None else None)]
    try:
        validate(dom)
    except XmlError as exc:
        problems += [f"schema: {line}" for line in exc.problems]
    except VgpuvirtError as exc:  # schema missing: say so, but still report the lint result
        problems.append(f"schema: not checked: {exc}")
    if _json(ctx, args):
        ctx.emit_json({"file": args.file, "ok": not problems, "problems": problems})
    else:
        for line in problems:
            print(printable(f"{args.file}: {line}"))
        if not problems:
            print(printable(f"{args.file}: ok"))
    return 1 if problems else 0


def _devices(ctx: Any, args: argparse.Namespace) -> int:
    from vgpuvirt.xml import Domain, HostdevInterface, MdevHostdev, PciHostdev

    dom = Domain.from_xml(_read(args.file))
    rows: list[dict[str, Any]] = []
    for dev in dom.hostdevs():
        ga = str(dev.guest_address.pci) if dev.guest_address else None
        if isinstance(dev, MdevHostdev):
            rows.append({"kind": "mdev", "source": str(dev.uuid), "guest_address": ga, "display": dev.display,
                         "ramfb": dev.ramfb})
        elif isinstance(dev, PciHostdev):
            rows.append({"kind": "pci", "source": str(dev.address), "guest_address": ga, "managed": dev.managed})
        elif isinstance(dev, HostdevInterface):
            rows.append({"kind": "nic-vf", "source": str(dev.address), "guest_address": ga,
                         "mac": str(dev.mac) if dev.mac else None, "vlan": dev.vlan})
    if _json(ctx, args):
        ctx.emit_json({"name": dom.name, "devices": rows, **dom.gpu_devices().to_dict()})
    else:
        for r in rows:
            extra = " ".join(f"{k}={v}" for k, v in r.items() if k not in ("kind", "source", "guest_address"))
            print(printable(f"{r['kind']:7} {r['source']:38} guest={r['guest_address'] or '-'} {extra}".rstrip()))
    return 0
