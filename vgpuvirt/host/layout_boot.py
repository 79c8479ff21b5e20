"""Apply an installed GPU layout at boot, with nothing but python3 on the host (stdlib only).

Shipped by ``vgpuvirt layout install-boot`` to /usr/lib/vgpuvirt/ next to agent.py (whose batch engine
it drives) and run by the vgpuvirt-layout.service unit:

    python3 /usr/lib/vgpuvirt/layout_boot.py /etc/vgpuvirt/layout-boot.json

The program (JSON, written by :mod:`vgpuvirt.layout.boot` from the host in that layout) names every device
concretely: per GPU its driver, its VF count, the vGPU type of each VF, the mdevs (UUID, parent, type)
and the MIG instances (nvidia-smi argv). The script reads what is there (one agent read), does only what
is missing, in the layout order (driver binding -> SR-IOV -> MIG -> vGPU types -> mdevs), in one locked
agent batch, and exits 1 when something failed. mdevs that mdevctl defines are mdevctl's to start: the
installer leaves them out of the program and this script never creates a UUID found in ``mdevctl_dir``.

The VMs' own vGPUs come back with their UUIDs (issue 28): a VM provisioned after install-boot names mdevs the
program does not list. The script reads libvirt's persistent definitions (``domains_dir``, default
``/etc/libvirt/qemu``: the unit runs before libvirtd) and, where a VM's vgpuvirt metadata names a missing
mdev of a parent and type the program makes, creates the VM's UUID in place of one the program derived.
"""

import json
import os
import sys
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Optional, Set, Tuple  # python3 >= 3.6 on the host

if __package__:                                 # imported as vgpuvirt.host.layout_boot (tests, the client)
    from vgpuvirt.host import agent
else:                                           # installed: agent.py sits next to this file
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "vgpuvirt_boot_agent", os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py"))
    agent = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    _spec.loader.exec_module(agent)  # type: ignore[union-attr]

PCI = "/sys/bus/pci/devices"
MDEVS = "/sys/bus/mdev/devices"
VFIO = "vfio-pci"
WAIT = 30.0


def _reads(program: "Dict[str, Any]") -> "List[str]":
    out = []  # type: List[str]
    for g in program["gpus"]:
        a = g["address"]
        out += ["%s/%s/driver" % (PCI, a), "%s/%s/sriov_numvfs" % (PCI, a)]
        out += ["%s/%s/driver" % (PCI, f) for f in g.get("functions", [])]
        out += ["%s/%s/nvidia/current_vgpu_type" % (PCI, vf) for vf in g.get("vf_types", {})]
        out += ["%s/%s" % (MDEVS, m["uuid"]) for m in g.get("mdevs", [])]
    return out


def _driver(entries: "Dict[str, Any]", dev: str) -> "Optional[str]":
    e = entries.get("%s/%s/driver" % (PCI, dev))
    return os.path.basename(e[1]) if e and e[0] == "l" and e[1] else None


def _text(entries: "Dict[str, Any]", path: str) -> "Optional[str]":
    e = entries.get(path)
    return e[1].strip() if e and e[0] == "f" and isinstance(e[1], str) else None


def _op(kind: str, path: "Optional[str]" = None, value: "Optional[str]" = None, group: "Optional[str]" = None,
        **kw: Any) -> "Dict[str, Any]":
    op = {"op": kind, "group": group}  # type: Dict[str, Any]
    if path is not None:
        op["path"] = path
    if value is not None:
        op["value"] = value
    op.update(kw)
    return op


PROVENANCE = "{https://vgpuvirt.dev/xmlns/provision/1}"


def vm_mdevs(domains_dir: str) -> "List[Dict[str, str]]":
    """The mdevs (uuid, parent, type) that domains' vgpuvirt metadata lists, from libvirt's persistent
    definitions (``NAME.xml``, written by libvirtd, root's); an unreadable file is skipped."""
    out = []  # type: List[Dict[str, str]]
    try:
        names = sorted(n for n in os.listdir(domains_dir) if n.endswith(".xml"))
    except OSError:
        return out
    for n in names:
        try:
            with open(os.path.join(domains_dir, n), encoding="utf-8", errors="replace") as f:
                text = f.read(4 << 20)
            # stdlib only here (no defusedxml): libvirtd writes these files and never a DTD; a file with one
            # (entity expansion) is skipped rather than parsed
            if "<!DOCTYPE" in text or "<!ENTITY" in text:
                continue
            root = ET.fromstring(text)  # noqa: S314 -- root's libvirt definitions, DTDs refused above
        except (OSError, ET.ParseError):
            continue
        for g in root.iter(PROVENANCE + "gpu"):
            if g.get("kind") == "mdev" and g.get("uuid") and g.get("parent") and g.get("type"):
                out.append({"uuid": str(g.get("uuid")).lower(), "parent": str(g.get("parent")),
                            "type": str(g.get("type")), "domain": n[:-4]})
    return out


def with_vm_uuids(program: "Dict[str, Any]", entries: "Dict[str, Any]", claims: "List[Dict[str, str]]",
                  defined: Any = ()) -> "Dict[str, Any]":
    """The program with each VM mdev (``claims``) in place of a missing mdev of the same parent and type that
    no VM names; the count per parent and type stays the program's."""
    named = set(c["uuid"] for c in claims)
    gpus = []
    for g in program["gpus"]:
        mdevs = [dict(m) for m in g.get("mdevs", [])]
        listed = set(m["uuid"] for m in mdevs)
        for c in claims:
            # a VM's mdev already there still takes its slot: the program's count is what the GPU holds
            if c["uuid"] in listed or c["uuid"] in defined:
                continue
            spare = next((m for m in mdevs if m["parent"] == c["parent"] and m["type"] == c["type"]
                          and m["uuid"] not in named and "%s/%s" % (MDEVS, m["uuid"]) not in entries), None)
            if spare is not None:
                spare["uuid"] = c["uuid"]
                listed.add(c["uuid"])
        gpus.append(dict(g, mdevs=mdevs))
    return dict(program, gpus=gpus)


def plan(program: "Dict[str, Any]", entries: "Dict[str, Any]", defined: Any = (),
         lgi: "Optional[Dict[str, Dict[str, int]]]" = None) -> "List[Dict[str, Any]]":
    """The ops that take the host from ``entries`` (an agent read) and ``lgi`` (GPU -> MIG profile -> GPU
    instances) to the program; [] when it is there."""
    lgi = lgi or {}
    ops = []  # type: List[Dict[str, Any]]
    for g in program["gpus"]:
        a = g["address"]
        if g.get("driver") == VFIO:
            for dev in [a] + list(g.get("functions", [])):
                cur = _driver(entries, dev)
                if cur == VFIO:
                    continue
                grp = "bind:" + dev
                ops.append(_op("write", "%s/%s/driver_override" % (PCI, dev), VFIO, grp))
                if cur:
                    ops.append(_op("write", "/sys/bus/pci/drivers/%s/unbind" % cur, dev, grp))
                ops += [_op("write", "/sys/bus/pci/drivers_probe", dev, grp),
                        _op("wait", "%s/%s/driver" % (PCI, dev), VFIO, grp, state="link_endswith", timeout=WAIT)]
        want, now = int(g.get("vfs", 0)), int(_text(entries, "%s/%s/sriov_numvfs" % (PCI, a)) or 0)
        if want != now:
            grp, path = "sriov:" + a, "%s/%s/sriov_numvfs" % (PCI, a)
            if now:
                ops += [_op("write", path, "0", grp),
                        _op("wait", "%s/%s/virtfn0" % (PCI, a), None, grp, state="absent", timeout=WAIT)]
            if want:
                ops += [_op("write", path, str(want), grp),
                        _op("wait", "%s/%s/virtfn%d" % (PCI, a, want - 1), None, grp, state="exists", timeout=WAIT)]
        mig = g.get("mig")
        if mig:
            have = lgi.get(a, {})
            missing = [p for p, n in sorted(mig["want"].items()) for _ in range(max(0, n - have.get(p, 0)))]
            if missing:
                argv = ["nvidia-smi", "mig", "-i", str(mig["bus_id"]), "-cgi", ",".join(missing)]
                ops.append(_op("exec", group="mig:" + a, argv=argv + (["-C"] if mig.get("compute") else []),
                               timeout=300.0))
        missing_types = [vf for vf, t in g.get("vf_types", {}).items()
                         if _text(entries, "%s/%s/nvidia/current_vgpu_type" % (PCI, vf)) != str(t)]
        if missing_types:
            # only before the first vGPU: with vGPUs on it the driver refuses a switch (exit 19, in use)
            for argv in g.get("sizing", []):
                ops.append(_op("exec", group="sizing:" + a, argv=list(argv), timeout=60.0, ok_codes=[0, 19]))
        for vf, t in sorted(g.get("vf_types", {}).items()):
            path = "%s/%s/nvidia/current_vgpu_type" % (PCI, vf)
            if _text(entries, path) != str(t):
                ops += [_op("write", path, str(t), "type:" + vf),
                        _op("wait", path, str(t), "type:" + vf, state="equals", timeout=WAIT)]
        for m in g.get("mdevs", []):
            if "%s/%s" % (MDEVS, m["uuid"]) in entries or m["uuid"] in defined:
                continue
            grp = "create:" + m["uuid"]
            ops += [_op("write", "/sys/class/mdev_bus/%s/mdev_supported_types/%s/create" % (m["parent"], m["type"]),
                        m["uuid"], grp),
                    _op("wait", "%s/%s" % (MDEVS, m["uuid"]), None, grp, state="exists", timeout=WAIT)]
    return ops


def _gi_counts(text: str) -> "Dict[str, int]":
    """MIG profile -> GPU instances, from ``nvidia-smi mig -i N -lgi`` (rows ``|  0  MIG 3g.40gb  9  1  4:4  |``)."""
    out = {}  # type: Dict[str, int]
    for line in text.splitlines():
        cells = line.strip("| \t").split()
        if len(cells) >= 3 and cells[1] == "MIG":
            out[cells[2]] = out.get(cells[2], 0) + 1
    return out


def mdevctl_defined(mdevctl_dir: str) -> "Set[str]":
    """UUIDs mdevctl keeps definitions of (``/etc/mdevctl.d/PARENT/UUID``): theirs to start, never ours."""
    out = set()  # type: Set[str]
    try:
        parents = os.listdir(mdevctl_dir)
    except OSError:
        return out
    for p in parents:
        try:
            out.update(os.listdir(os.path.join(mdevctl_dir, p)))
        except OSError:
            continue
    return out


def run(program: "Dict[str, Any]", fs: Any = None, locker: Any = None,
        defined: Any = (), claims: "Optional[List[Dict[str, str]]]" = None) -> "Tuple[int, List[str]]":
    """Converge once; returns (exit status, report lines). ``claims``: the VMs' mdevs (:func:`vm_mdevs`)."""
    root = program.get("root", "/")
    claims = claims or []
    migs = [g for g in program["gpus"] if g.get("mig")]
    lgi_ops = [_op("exec", argv=["nvidia-smi", "mig", "-i", str(g["mig"]["bus_id"]), "-lgi"], timeout=60.0,
                   read_only=True, ok_codes=[0, 6]) for g in migs]
    reads = _reads(program) + ["%s/%s" % (MDEVS, c["uuid"]) for c in claims]
    seen = agent.handle({"root": root, "reads": reads, "ops": lgi_ops, "on_error": "continue"}, fs=fs)
    if "fatal" in seen:
        return 1, ["read refused: %s" % seen.get("error")]
    lgi = {g["address"]: _gi_counts(r.get("stdout", "")) for g, r in zip(migs, seen["ops"])}
    program = with_vm_uuids(program, seen["entries"], claims, defined)
    ops = plan(program, seen["entries"], defined, lgi)
    if not ops:
        return 0, ["layout %s: already in place" % program.get("config")]
    lock = {"path": program.get("lock", "/run/vgpuvirt/lock"), "timeout": 60}
    done = agent.handle({"root": root, "ops": ops, "on_error": "continue", "lock": lock}, fs=fs, locker=locker)
    if "fatal" in done:
        return 1, ["batch refused: %s" % done.get("error")]
    lines = []  # type: List[str]
    bad = 0
    for op, r in zip(ops, done["ops"]):
        if not r.get("ok") and not r.get("skipped"):
            bad += 1
            lines.append("FAILED %s %s: %s" % (op["op"], op.get("path") or op.get("argv"), r.get("error")))
    lines.append("layout %s: %d op(s), %d failed" % (program.get("config"), len(ops), bad))
    return (1 if bad else 0), lines


def main(argv: "Optional[List[str]]" = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: layout_boot.py PROGRAM.json\n")
        return 2
    with open(args[0]) as f:
        program = json.load(f)
    rc, lines = run(program, defined=mdevctl_defined(program.get("mdevctl_dir", "/etc/mdevctl.d")),
                    claims=vm_mdevs(program.get("domains_dir", "/etc/libvirt/qemu")))
    for line in lines:
        sys.stdout.write(line + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
