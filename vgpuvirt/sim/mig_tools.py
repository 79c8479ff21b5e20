"""Emulated ``nvidia-smi mig ...``, ``nvidia-smi -mig 0|1`` and ``nvidia-smi -r`` (tables and messages as the
MIG user guide and the transcripts in tests/fixtures/nvidia-smi/mig_*.txt print them).

``nvidia-smi mig`` forms: ``-lgip``, ``-lgipp``, ``-lgi``, ``-lci``, ``-cgi P[:START][,...] [-C]``,
``-cci [P,...]``, ``-dci``, ``-dgi``, with ``-i GPU[,GPU]``, ``-gi GI[,GI]``, ``-ci CI[,CI]`` selectors.
Without ``-i`` a command works on every GPU in MIG mode. Exit codes are NVML's (6 not found, 19 in use,
23 insufficient resources, 3 not supported, 2 invalid argument).
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from vgpuvirt.sim import mig_rules as R
from vgpuvirt.sim.model import Dev, Gpu, SimModel
from vgpuvirt.sim.profile_spec import MigProfile

Outcome = tuple[int, str, str]
_INVALID_ARGS = (2, "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
_WHY = {errno.ENOSPC: (23, "Insufficient Resources"), errno.EOPNOTSUPP: (3, "Not Supported"),
        errno.EINVAL: (2, "Invalid Argument"), errno.ENOENT: (6, "Not Found"),
        errno.EBUSY: (19, "In use by another client")}
_PENDING_TAIL = ("{bus} is currently being used by one or more other processes (e.g. CUDA application or a "
                 "monitoring application such as another instance of nvidia-smi). Please first kill all processes "
                 "using the device and retry the command or reboot the system to make MIG mode effective.\n")


def _why(exc: OSError) -> tuple[int, str]:
    return _WHY.get(exc.errno or 0, (999, "Unknown Error"))


def _opt(argv: list[str], flag: str) -> str | None:
    if flag in argv:
        i = argv.index(flag)
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def _int_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        return []


Pick = Callable[[str], "tuple[Dev, Gpu | None] | None"]


def _targets(gpus: list[Dev], pick: Pick, argv: list[str], *, capable: bool = False
             ) -> list[tuple[int, Dev, Gpu]] | None:
    """(index, PF, GPU) of the MIG-enabled GPUs ``-i`` names (all of them without ``-i``), or with ``capable``
    of the MIG-capable ones whatever their mode; None: a bad -i."""
    sel = _opt(argv, "-i")
    if sel is None:
        chosen = gpus
    else:
        chosen = []
        for item in sel.split(","):
            p = pick(item)
            if p is None:
                return None
            chosen.append(p[0])
    return [(gpus.index(d), d, d.gpu) for d in chosen
            if d.gpu is not None and (d.gpu.mig_enabled or (capable and bool(d.gpu.table.mig_profiles)))]


def _box(title: str, head: list[str], rows: list[str], width: int) -> str:
    line = "+" + "-" * (width - 2) + "+\n"
    out = [line, f"| {title:<{width - 4}} |\n"] + [f"|{h[:width - 2]:<{width - 2}}|\n" for h in head]
    out.append("|" + "=" * (width - 2) + "|\n")
    for r in rows:
        out.append(r)
        out.append(line)
    return "".join(out)


def _gib(g: Gpu, p: MigProfile) -> str:
    gib = p.memory_gib or g.table.framebuffer_mib / 1024 * R.memory_size(g.table, p) / g.table.memory_slices
    return f"{gib:.2f}"


def lgip(targets: list[tuple[int, Dev, Gpu]]) -> str:
    rows = []
    for i, _d, g in targets:
        gis = g.gi_table()
        for p in g.table.mig_profiles:
            sm, dec, enc, ce, jpeg, ofa = p.engines or (14 * p.slices, p.slices // 2, 0, p.slices, 0, 0)
            ft = f"{R.remaining(g.table, gis, p)}/{p.max}"
            # the SM column is left-aligned (a real 132-SM 7g row: "No     132    7"), the others right-aligned
            rows.append(f"|{i:>4}  MIG {p.name:<16}{p.id:>2}     {ft:<11}{_gib(g, p):<11}{'No':<7}{sm:<7}{dec}"
                        f"{enc:>6}   |\n|{'':57}{ce:>7}{jpeg:>6}{ofa:>6}   |\n")
    head = [" GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  ",
            "                                Free/Total   GiB              CE    JPEG  OFA  "]
    return _box("GPU instance profiles:", head, rows, 81)


def lgipp(targets: list[tuple[int, Dev, Gpu]]) -> str:
    out = []
    for i, _d, g in targets:
        for p in g.table.mig_profiles:
            starts = R.placements(g.table, p)
            word = "Placements:" if len(starts) > 1 else "Placement :"
            out.append(f"GPU {i:2d} Profile ID {p.id:2d} {word} {{{','.join(map(str, starts))}}}:"
                       f"{R.memory_size(g.table, p)}\n")
    return "".join(out)


def _prof(g: Gpu, name: str) -> MigProfile:
    return next(p for p in g.table.mig_profiles if p.name == name)


def mig_devices(g: Gpu) -> list[tuple[int, int, str]]:
    """(GI id, CI id, CI profile name) of every MIG device (one per compute instance), in GI then CI order."""
    out: list[tuple[int, int, str]] = []
    for gi, cis in sorted(g.compute_instances.items()):
        name = g.gpu_instances[gi]
        slices = _prof(g, name).slices
        out.extend((gi, ci, R.ci_name(name, slices, k)) for ci, (k, _start) in sorted(cis.items()))
    return out


def lgi(targets: list[tuple[int, Dev, Gpu]]) -> Outcome:
    rows = []
    for i, _d, g in targets:
        for gi, (name, start) in sorted(g.gi_table().items()):
            p = _prof(g, name)
            rows.append(f"|{i:>4}  MIG {name:<16}{p.id:>2}{gi:>9}{start:>11}:{R.memory_size(g.table, p):<1}     |\n")
    if not rows:
        return 6, "", "No GPU instances found: Not Found\n"
    return 0, _box("GPU instances:", [" GPU   Name             Profile  Instance   Placement  ",
                                      "                          ID       ID       Start:Size "], rows, 57), ""


def lci(targets: list[tuple[int, Dev, Gpu]], gi_sel: list[int] | None) -> Outcome:
    rows = []
    for i, _d, g in targets:
        for gi, cis in sorted(g.compute_instances.items()):
            if gi_sel is not None and gi not in gi_sel:
                continue
            name = g.gpu_instances[gi]
            slices = _prof(g, name).slices
            for ci, (k, start) in sorted(cis.items()):
                rows.append(f"|{i:>4}{gi:>7}       MIG {R.ci_name(name, slices, k):<16}{R.CI_PROFILE_IDS[k]:>2}"
                            f"{ci:>10}{start:>11}:{k:<1}     |\n")
    if not rows:
        return 6, "", "No compute instances found: Not Found\n"
    head = [" GPU     GPU       Name             Profile   Instance   Placement  ",
            "       Instance                       ID        ID       Start:Size ",
            "         ID                                                         "]
    return 0, _box("Compute instances:", head, rows, 70), ""


def _ci_line(i: int, gi: int, ci: int, pid: int, name: str) -> str:
    return (f"Successfully created compute instance ID {ci:2d} on GPU {i:2d} GPU instance ID {gi:2d} using profile "
            f"MIG {name} (ID {pid:2d})\n")


def cgi(model: SimModel, targets: list[tuple[int, Dev, Gpu]], spec: str, default_ci: bool) -> Outcome:
    out: list[str] = []
    for i, _d, g in targets:
        for item in spec.split(","):
            key, _, start_text = item.partition(":")
            mp = next((p for p in g.table.mig_profiles if key in (str(p.id), p.name, f"MIG {p.name}")), None)
            if mp is None or (start_text and not start_text.isdigit()):
                return 2, "".join(out), f"Invalid GPU instance profile: {item}\n"
            try:
                gi = model.create_gi(g, mp.id, int(start_text) if start_text else None)
            except OSError as exc:
                rc, why = _why(exc)
                return rc, "".join(out), f"Unable to create a GPU instance on GPU {i:2d} using profile {mp.id}: {why}\n"
            out.append(f"Successfully created GPU instance ID {gi:2d} on GPU {i:2d} using profile MIG {mp.name} "
                       f"(ID {mp.id:2d})\n")
            if default_ci:
                ci, pid, name = model.create_ci(g, gi, str(R.CI_PROFILE_IDS[mp.slices]))
                out.append(_ci_line(i, gi, ci, pid, name))
    return 0, "".join(out), ""


def cci(model: SimModel, targets: list[tuple[int, Dev, Gpu]], spec: str | None, gi_sel: list[int] | None) -> Outcome:
    out: list[str] = []
    for i, _d, g in targets:
        for gi in sorted(g.gpu_instances) if gi_sel is None else gi_sel:
            if gi not in g.gpu_instances:
                return 6, "".join(out), f"Unable to find GPU instance ID {gi:2d} on GPU {i:2d}: Not Found\n"
            items = spec.split(",") if spec else [str(R.CI_PROFILE_IDS[_prof(g, g.gpu_instances[gi]).slices])]
            for item in items:
                try:
                    ci, pid, name = model.create_ci(g, gi, item)
                except OSError as exc:
                    rc, why = _why(exc)
                    return rc, "".join(out), (f"Unable to create a compute instance on GPU {i:2d} GPU instance ID "
                                              f"{gi:2d} using profile {item}: {why}\n")
                out.append(_ci_line(i, gi, ci, pid, name))
    return 0, "".join(out), ""


def dci(model: SimModel, targets: list[tuple[int, Dev, Gpu]], gi_sel: list[int] | None,
        ci_sel: list[int] | None) -> Outcome:
    out: list[str] = []
    err: list[str] = []
    rc = 0
    for i, _d, g in targets:
        for gi in sorted(g.gpu_instances) if gi_sel is None else gi_sel:
            present = sorted(g.compute_instances.get(gi, {}))
            for ci in present if ci_sel is None else ci_sel:
                try:
                    model.destroy_ci(g, gi, ci)
                except OSError as exc:
                    rc, why = _why(exc)
                    err.append(f"Unable to destroy compute instance ID {ci:2d} from GPU {i:2d} GPU instance ID "
                               f"{gi:2d}: {why}\n")
                    continue
                out.append(f"Successfully destroyed compute instance ID {ci:2d} from GPU {i:2d} GPU instance ID "
                           f"{gi:2d}\n")
    if not out and not err:
        return 6, "", "No compute instances found: Not Found\n"
    return rc, "".join(out), "".join(err)


def dgi(model: SimModel, targets: list[tuple[int, Dev, Gpu]], gi_sel: list[int] | None) -> Outcome:
    out: list[str] = []
    err: list[str] = []
    rc = 0
    for i, _d, g in targets:
        for gi in sorted(g.gpu_instances) if gi_sel is None else gi_sel:
            try:
                model.destroy_gi(g, gi)
            except OSError as exc:
                rc, why = _why(exc)
                err.append(f"Unable to destroy GPU instance ID {gi:2d} from GPU {i:2d}: {why}\n")
                continue
            out.append(f"Successfully destroyed GPU instance ID {gi:2d} from GPU {i:2d}\n")
    if not out and not err:
        return 6, "", "No GPU instances found: Not Found\n"
    return rc, "".join(out), "".join(err)


def mig(model: SimModel, gpus: list[Dev], pick: Pick, args: list[str]) -> Outcome:
    """``nvidia-smi mig ARGS``."""
    targets = _targets(gpus, pick, args)
    if targets is None:
        return 2, "", "Invalid GPU index.\n"
    gi_sel, ci_sel = _int_list(_opt(args, "-gi")), _int_list(_opt(args, "-ci"))
    if gi_sel == [] or ci_sel == []:
        return _INVALID_ARGS
    profiles = {"-lgip", "-lgipp"} & set(args)
    if profiles:
        # A MIG-capable board lists its profiles whatever its MIG mode (real H100/H200 on R580, MIG off: all 7,
        # exit 0). With no MIG-capable board the answer below is INFERRED.
        capable = _targets(gpus, pick, args, capable=True) or []
        if not capable:
            return 6, "", "No MIG-enabled devices found.\n"
        return (0, lgip(capable), "") if "-lgip" in args else (0, lgipp(capable), "")
    if not targets and {"-lgi", "-lci"} & set(args):
        # R580 says so on stdout with exit 0 (real H100/H200, MIG off)
        return 0, "No MIG-enabled devices found.\n", ""
    if not targets and {"-cgi", "-cci", "-dci", "-dgi"} & set(args):
        return 6, "", "No MIG-enabled devices found.\n"     # INFERRED: no capture of a create with MIG off
    if "-lgi" in args:
        return lgi(targets)
    if "-lci" in args:
        return lci(targets, gi_sel)
    if "-cgi" in args:
        spec = _opt(args, "-cgi")
        return cgi(model, targets, spec, "-C" in args) if spec else _INVALID_ARGS
    if "-cci" in args:
        return cci(model, targets, _opt(args, "-cci"), gi_sel)
    if "-dci" in args:
        return dci(model, targets, gi_sel, ci_sel)
    if "-dgi" in args:
        return dgi(model, targets, gi_sel)
    return _INVALID_ARGS


def bus_text(d: Dev) -> str:
    a = d.spec.address
    return f"{a.domain:08X}:{a.bus:02X}:{a.slot:02X}.{a.function:X}"


def set_mode(model: SimModel, chosen: list[tuple[Dev, Gpu | None]], on: bool) -> Outcome:
    """``nvidia-smi [-i GPU] -mig 0|1`` on each chosen GPU."""
    out: list[str] = []
    err: list[str] = []
    rc = 0
    verb, word = ("enable", "Enabled") if on else ("disable", "Disabled")
    for d, g in chosen:                       # each GPU on its own: one refusal does not stop the others
        bus = bus_text(d)
        if g is None or not g.table.mig_profiles:
            rc = 3
            err.append(f"Unable to {verb} MIG Mode for GPU {bus}: Not Supported\n")
            continue
        try:
            pending = model.set_mig(g, on)
        except OSError:
            rc = 19
            err.append(f"Unable to {verb} MIG Mode for GPU {bus}: In use by another client\n")
            continue
        if pending:
            out.append(f"Warning: MIG mode is in pending {verb} state for GPU {bus}:In use by another client\n"
                       + _PENDING_TAIL.format(bus=bus))
        else:
            out.append(f"{word} MIG Mode for GPU {bus}\n")
    return rc, "".join(out) + ("All done.\n" if rc == 0 else ""), "".join(err)


def reset(model: SimModel, chosen: list[tuple[Dev, Gpu | None]]) -> Outcome:
    """``nvidia-smi -i GPU -r`` (INFERRED message when in use)."""
    out: list[str] = []
    for d, g in chosen:
        bus = bus_text(d)
        try:
            if g is not None:
                model.reset_gpu(g)
        except OSError:
            return 19, "".join(out), (f"GPU {bus} is currently in use by another process.\n\n1 device is currently "
                                      "being used by one or more other processes (e.g., Fabric Manager, CUDA "
                                      "application, graphics application such as an X server, or a monitoring "
                                      "application such as another instance of nvidia-smi). Please first kill all "
                                      "processes using this device and all compute applications running in the "
                                      "system.\n")
        out.append(f"GPU {bus} was successfully reset.\n")
    return 0, "".join(out) + "All done.\n", ""
