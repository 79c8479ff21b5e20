"""The simulator against real hardware (issue 22, item 4): for every captured transcript in
tests/fixtures/real/<board>/raw, the simulator's rendering of the same command on the matching profile agrees
with it in structure: XML element names, nesting and order, units and N/A spellings, table columns,
messages, stdout vs stderr, exit codes, /proc and sysfs layouts.

A transcript the simulator does not render is listed in NOT_RENDERED with the reason; a new capture that is
neither compared nor listed fails :func:`test_every_transcript_is_compared_or_listed`. docs/fidelity.md
lists each hardware fact, its source and the test here that pins it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from vgpuvirt.services.nvidia.readings import parse_readings
from vgpuvirt.services.nvidia.smi import parse_nvidia_smi_xml
from vgpuvirt.sim import SimHost

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
#: captured board -> the simulated profile built from it
BOARDS = {"h100-580": "h100-sxm5", "h200-580": "h200"}

#: Transcripts of one exit-0 stdout command (the captures' READMEs: every listing there exited 0, nothing on
#: stderr), compared byte for byte: file -> argv.
EXACT = {
    "mig-lgip.txt": ("nvidia-smi", "mig", "-lgip"),
    "mig-lgipp.txt": ("nvidia-smi", "mig", "-lgipp"),
    "mig-lgi.txt": ("nvidia-smi", "mig", "-lgi"),
    "mig-lci.txt": ("nvidia-smi", "mig", "-lci"),
    "vgpu-q.txt": ("nvidia-smi", "vgpu", "-q"),
    "vgpu-s.txt": ("nvidia-smi", "vgpu", "-s"),
    "vgpu-c.txt": ("nvidia-smi", "vgpu", "-c"),
    "vgpu-ss.txt": ("nvidia-smi", "vgpu", "-ss"),
}
#: compared in structure by the tests named
STRUCTURAL = {"nvidia-smi-q.xml": "test_q_x_structure", "nvidia-smi-L.txt": "test_list_gpus",
              "proc-driver-nvidia.txt": "test_proc_driver_nvidia", "dmesg-nvidia.txt": "test_kernel_log_lines",
              "sys-attrs.txt": "test_sysfs_attributes", "sys-ls.txt": "test_sysfs_listing"}
#: what the simulator does not render, and why (vgpuvirt does not run these)
NOT_RENDERED = {
    "nvidia-smi-q.txt": "the text form of -q: vgpuvirt reads -q -x only",
    "nvidia-smi-help.txt": "help text", "mig-help.txt": "help text", "vgpu-help.txt": "help text",
    "topo.txt": "nvidia-smi topo -m: vgpuvirt reads the topology from sysfs",
    "os-release.txt": "the OS, not the driver",
    "nvidia-smi-query.csv": "--query-gpu is item 5 of issue 22 (another worktree adds it to the simulator)",
    "query-gpu-all-fields.csv": "--query-gpu (item 5)", "query-gpu-field-by-field.csv": "--query-gpu (item 5)",
}


def boards() -> list[str]:
    return sorted(p.name for p in REAL.iterdir() if p.is_dir())


def raw(board: str, name: str) -> str:
    return (REAL / board / "raw" / name).read_text()


def sim(board: str) -> SimHost:
    return SimHost.from_profile(BOARDS[board])


@pytest.mark.parametrize("board", boards())
def test_every_transcript_is_compared_or_listed(board: str) -> None:
    assert board in BOARDS, f"a capture of {board} without a simulated profile"
    files = {p.name for p in (REAL / board / "raw").iterdir()}
    unknown = files - set(EXACT) - set(STRUCTURAL) - set(NOT_RENDERED)
    assert not unknown, f"{board}: transcripts neither compared nor listed in NOT_RENDERED: {sorted(unknown)}"


@pytest.mark.parametrize("board, name", [(b, n) for b in boards() for n in sorted(EXACT)
                                         if (REAL / b / "raw" / n).exists()])
def test_listing_is_what_the_real_driver_printed(board: str, name: str) -> None:
    r = sim(board).run(list(EXACT[name]))
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout == raw(board, name)


# -- nvidia-smi -q -x ---------------------------------------------------------------------------------------

def _tree(text: str) -> Any:
    return etree.fromstring(text.split("\n", 2)[2].encode() if text.startswith("<?xml") else text.encode(),
                            etree.XMLParser(load_dtd=False, no_network=True, resolve_entities=False))


def _paths(el: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    for child in el:
        p = f"{prefix}/{child.tag}"
        out.setdefault(p, child)
        out.update({k: v for k, v in _paths(child, p).items() if k not in out})
    return out


def shape(text: str | None) -> str:
    """A value's spelling with its numbers taken out: ``78.19 W`` -> ``# W``, ``N/A`` stays ``N/A``."""
    return re.sub(r"\d+(?:\.\d+)?", "#", " ".join((text or "").split()))


#: leaves whose value is an identity or a moment, not a spelling
_IDENTITY = {"/timestamp", "/gpu/uuid"}
#: elements vgpuvirt's parsers read (services/nvidia/smi.py, services/nvidia/readings.py)
PARSED = ["product_name", "product_brand", "product_architecture", "uuid", "fb_memory_usage/total",
          "fb_memory_usage/reserved", "fb_memory_usage/used", "gpu_virtualization_mode/virtualization_mode",
          "gpu_virtualization_mode/host_vgpu_mode", "gpu_virtualization_mode/vgpu_heterogeneous_mode",
          "mig_mode/current_mig", "mig_mode/pending_mig", "mig_devices", "pci/pci_bus_id",
          "utilization/gpu_util", "utilization/memory_util", "utilization/encoder_util", "utilization/decoder_util",
          "temperature/gpu_temp", "gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw",
          "gpu_power_readings/current_power_limit", "clocks/sm_clock", "clocks/mem_clock", "clocks/graphics_clock",
          "performance_state", "ecc_errors/volatile/sram_correctable", "ecc_errors/volatile/dram_uncorrectable",
          "retired_pages/pending_retirement", "remapped_rows/remapped_row_corr", "remapped_rows/remapped_row_unc",
          "remapped_rows/remapped_row_pending", "remapped_rows/remapped_row_failure",
          "pci/pci_gpu_link_info/pcie_gen/current_link_gen", "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
          "pci/pci_gpu_link_info/link_widths/current_link_width"]


@pytest.mark.parametrize("board, path", [(b, p) for b in boards()
                                         for p in ("raw/nvidia-smi-q.xml", "under-load/nvidia-smi-q-load.xml")
                                         if (REAL / b / p).exists()])
def test_q_x_structure(board: str, path: str) -> None:
    real_text = (REAL / board / path).read_text()
    r = sim(board).run(["nvidia-smi", "-q", "-x"])
    assert (r.exit_code, r.stderr) == (0, "")
    doctype = re.compile(r'<!DOCTYPE nvidia_smi_log SYSTEM "([^"]+)">')
    assert doctype.findall(r.stdout) == doctype.findall(real_text)
    real, got = _tree(real_text), _tree(r.stdout)
    real_paths, got_paths = _paths(real), _paths(got)
    # nothing the real driver does not print, nested where it prints it
    assert sorted(set(got_paths) - set(real_paths)) == []
    # everything vgpuvirt reads that the real driver prints, the simulator prints too
    missing = [p for p in PARSED if f"/gpu/{p}" in real_paths and f"/gpu/{p}" not in got_paths]
    assert missing == []
    # the same units and N/A spellings, leaf by leaf
    for p, el in got_paths.items():
        if len(el) == 0 and p not in _IDENTITY:
            assert shape(el.text) == shape(real_paths[p].text), p
    # in the same order
    for p, el in [("", got), *got_paths.items()]:
        real_el = real if p == "" else real_paths[p]
        order = [c.tag for c in real_el]
        mine = [c.tag for c in el]
        positions = [order.index(t) for t in mine]
        assert positions == sorted(positions), (p, mine)


@pytest.mark.parametrize("board", boards())
def test_parsers_read_the_same_facts_from_the_real_and_the_simulated_document(board: str) -> None:
    real_text = raw(board, "nvidia-smi-q.xml")
    sim_text = sim(board).run(["nvidia-smi", "-q", "-x"]).stdout
    (real,) = parse_nvidia_smi_xml(real_text).gpus
    (got,) = parse_nvidia_smi_xml(sim_text).gpus
    keys = ("address", "product_name", "product_brand", "architecture", "memory_total_mib", "virtualization_mode",
            "host_vgpu_mode", "vgpu_heterogeneous_mode", "mig_mode_current", "mig_mode_pending", "mig_devices")
    assert {k: getattr(got, k) for k in keys} == {k: getattr(real, k) for k in keys}
    assert parse_nvidia_smi_xml(sim_text).driver_version == parse_nvidia_smi_xml(real_text).driver_version
    (rr,) = parse_readings(real_text).values()
    (gr,) = parse_readings(sim_text).values()
    for k in ("fb_total_mib", "fb_reserved_mib", "fb_used_mib", "power_limit_w", "performance_state"):
        assert getattr(gr, k) == getattr(rr, k), k
    assert (gr.pcie.gen_current, gr.pcie.gen_max) == (rr.pcie.gen_current, rr.pcie.gen_max)
    assert gr.memory_repair.retired_sbe is None and rr.memory_repair.retired_sbe is None   # rows remapped
    assert gr.power_w is not None and rr.power_w is not None


# -- the other transcripts ----------------------------------------------------------------------------------

_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.mark.parametrize("board", boards())
def test_list_gpus(board: str) -> None:
    r = sim(board).run(["nvidia-smi", "-L"])
    assert (r.exit_code, r.stderr) == (0, "")
    assert _UUID.sub("GPU-<uuid>", r.stdout) == _UUID.sub("GPU-<uuid>", raw(board, "nvidia-smi-L.txt"))


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split("### ")[1:]:
        head, _, body = part.partition("\n")
        out[head.strip()] = body
    return out


def _keys(text: str) -> list[str]:
    return [line.split(":", 1)[0] for line in text.splitlines() if ":" in line]


@pytest.mark.parametrize("board", boards())
def test_proc_driver_nvidia(board: str) -> None:
    real = _sections(raw(board, "proc-driver-nvidia.txt"))
    host = sim(board)
    snap = host.read([f"{p}" for p in real])
    for path, text in real.items():
        got = snap.raw(path)
        assert got is not None, path
        if path.endswith("/version"):
            # the module line up to the builder: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  V  ..."
            assert got.split("Release Build")[0] == text.split("Release Build")[0]
        else:
            assert _keys(got) == _keys(text), path
            gv = {k: shape(v) for k, v in (line.split(":", 1) for line in got.splitlines() if ":" in line)}
            rv = {k: shape(v) for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}
            # the UUID and the board's firmware version are identities, not spellings
            ids = ("GPU UUID", "Video BIOS")
            assert {k: v for k, v in gv.items() if k not in ids} == {k: v for k, v in rv.items() if k not in ids}


_STAMP = re.compile(r"^\[\s*\d+\.\d{6}\] ")


@pytest.mark.parametrize("board", boards())
def test_kernel_log_lines(board: str) -> None:
    real = raw(board, "dmesg-nvidia.txt").splitlines()
    r = sim(board).run(["dmesg"])
    assert (r.exit_code, r.stderr) == (0, "")
    got = r.stdout.splitlines()
    assert got and all(_STAMP.match(line) for line in got) and all(_STAMP.match(line) for line in real)

    def kind(line: str) -> str:
        return shape(_STAMP.sub("", line).split("(")[0])

    real_kinds = {kind(line) for line in real}
    assert [line for line in got if kind(line) not in real_kinds] == []


def _attrs(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("/sys/") and (": " in line or " -> " in line):
            sep = " -> " if " -> " in line.split(": ", 1)[0] + (": " if ": " not in line else "") else ": "
            path, _, value = line.partition(sep)
            out[path] = value
    return out


@pytest.mark.parametrize("board", boards())
def test_sysfs_attributes(board: str) -> None:
    """Every attribute of the capture's PCI devices that the simulator renders has the real value (links: the
    real target's last part); the ones vgpuvirt's inventory reads are all rendered."""
    real = _attrs(raw(board, "sys-attrs.txt"))
    host = sim(board)
    snap = host.read(list(real))
    read_by_inventory = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class", "numa_node",
                         "local_cpulist", "reset_method", "driver_override", "driver")
    for path, value in real.items():
        e = snap.get(path)
        attr = path.rsplit("/", 1)[1]
        if e is None:
            assert attr not in read_by_inventory or (attr == "driver" and value == ""), path
            continue
        if e.kind == "link":
            assert (e.target or "").rsplit("/", 1)[-1] == value.rsplit("/", 1)[-1], path
        else:
            assert (e.text or "").strip() == value.strip(), path


@pytest.mark.parametrize("board", boards())
def test_sysfs_listing(board: str) -> None:
    """The guest's IOMMU folder is there and empty; there is no mdev bus (raw/sys-ls.txt)."""
    listing = raw(board, "sys-ls.txt")
    assert "/sys/kernel/iommu_groups:\ntotal 0\n" in listing
    assert "cannot access '/sys/class/mdev_bus'" in listing
    snap = sim(board).read(["/sys/kernel/iommu_groups", "/sys/kernel/iommu_groups/*", "/sys/class/mdev_bus",
                            "/sys/class/mdev_bus/*"])
    assert {p: e.kind for p, e in snap.items()} == {"/sys/kernel/iommu_groups": "dir"}


@pytest.mark.parametrize("board", boards())
def test_inventory_of_the_profile_is_the_inventory_of_the_real_host(board: str) -> None:
    """vgpuvirt's inventory of the simulated profile says of the GPU what it says when built from the real
    host's own answers (vgpuvirt/snapshot.json: its sysfs entries and programs), identities aside."""
    import json

    from vgpuvirt.host.base import Entry, OpResult, Snapshot
    from vgpuvirt.services.inventory.read import build_inventory, inventory

    data = json.loads((REAL / board / "vgpuvirt" / "snapshot.json").read_text())
    entries = {p: Entry(k, t, tg, e) for p, (k, t, tg, e) in data["entries"].items()}
    entries["/sys/kernel/iommu_groups"] = Entry("dir")     # raw/sys-ls.txt: there and empty (not asked at 97383fc)
    programs = {" ".join(a.strip().strip("'") for a in p["op"].split("argv=(", 1)[1].split(")", 1)[0].split(",")
                         if a.strip()): OpResult(op=None, ok=p["ok"], rc=p["rc"], stdout=p["stdout"],  # type: ignore
                                                 stderr=p["stderr"]) for p in data["programs"]}
    real = build_inventory(Snapshot(entries), host="h", nvidia_smi=programs["nvidia-smi -q -x"],
                           mig_lgi=programs.get("nvidia-smi mig -lgi"), mig_lgip=programs.get("nvidia-smi mig -lgip"))
    got = inventory(sim(board))

    def view(inv: Any) -> dict[str, Any]:
        d = inv.to_dict()
        (g,) = d["gpus"]
        nv = {k: v for k, v in g["nvidia"].items() if k not in ("uuid", "source", "not_supported", "errors")}
        return {"gpu": {k: g[k] for k in ("address", "vendor", "device", "class", "name", "driver", "backend",
                                          "numa_node", "iommu_group", "reset_methods", "notes")},
                "nvidia": nv, "capacity": {k: g["capacity"][k] for k in ("mode", "budget", "types")},
                "iommu_enabled": d["iommu_enabled"], "warnings": d["warnings"], "mdev_parents": d["mdev_parents"],
                "driver": d["nvidia_driver_version"]}

    assert view(got) == view(real)
