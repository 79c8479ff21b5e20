"""Every ``vgpuvirt`` verb, called in-process with generated argv lists against simulated hosts and libvirt's
test driver (``test:///default``).

Checked for every call: no exception escapes ``main``, no traceback on stderr, a non-zero exit ends with one
``vgpuvirt...: error:`` line; and when the call failed (or could not write by its nature: listings, checks,
``--dry-run``): no simulated host changed (its model's ``version``), no libvirt domain appeared or went, no
file appeared in the working directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzzkit import count, fuzz_settings, junk_text, mutated_xml, one_of_or_junk, run_cli
from hypothesis import assume, given
from hypothesis import strategies as st

N_VERB = 60  # examples per verb (26 verbs): the CLI cases are the slow ones

PROFILES = ["t4x2", "a10-sriov", "desktop", "gvtg", "l40s-vgpu17", "a100-sriov", "mxgpu", "mixed"]
TYPES = ["nvidia-231", "nvidia-591", "i915-GVTg_V5_4", "nvidia-1155"]
UUIDS = ["83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", "a1b2c3d4-0000-4000-8000-000000000001"]
URIS = ["test:///default"]


def _addresses() -> dict[str, list[str]]:
    from vgpuvirt.sim import SimHost
    return {p: sorted(SimHost.from_profile(p).model.devices) for p in PROFILES}


ADDRS = _addresses()
ALL_ADDRS = sorted({a for v in ADDRS.values() for a in v})
SAFE = junk_text(nul=False)  # what an argv word can be (no NUL; non-UTF-8 arrives surrogate-escaped)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("cli-fuzz")
    old = os.getcwd()
    os.chdir(d)  # relative paths the fuzzer makes up (records, destinations) land here
    try:
        yield d
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def libvirt_default() -> Iterator[Any]:
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open("test:///default")  # held open: test:///default keeps one shared state while in use
    yield conn
    conn.close()


def _domains(conn: Any) -> list[tuple[str, bool, bool]]:
    return sorted((d.name(), bool(d.isActive()), bool(d.isPersistent())) for d in conn.listAllDomains())


def opt(s: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), s)


def flag(name: str) -> st.SearchStrategy[list[str]]:
    return st.sampled_from([[], [name]])


def kv(name: str, value: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return opt(value.map(lambda v: [name, v]))


def cat(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: [w for p in ps for w in p])


profile = st.sampled_from(PROFILES)
pci = one_of_or_junk(ALL_ADDRS)
uuid = one_of_or_junk(UUIDS)
mtype = one_of_or_junk(TYPES)
uri = st.one_of(st.sampled_from(URIS), SAFE.map(lambda s: "test:///" + s.lstrip("/")))
num = one_of_or_junk(["0", "1", "2", "4", "16", "64", "-1", "4096", "99999999"])
cpulist = one_of_or_junk(["0-3", "1", "0,2", "2-5", "0-127"])
host = profile.map(lambda p: ["--host", f"sim:{p}"])
# "@F": a file whose (fuzzed) contents the test writes first; "@N": a path that does not exist yet
file_arg = st.sampled_from(["@F", "@F", "@N"])
json_flag = flag("--json")
domains_args = cat(kv("--connect", uri), opt(st.just(["--domain-xml", "@F"])))

VERBS: dict[str, st.SearchStrategy[list[str]]] = {
    "inventory": cat(host, st.just(["inventory"]), json_flag, kv("--connect", uri), flag("--no-nvidia-smi"),
                     kv("--nvml", one_of_or_junk(["auto", "yes", "no"]))),
    "types": cat(host, st.just(["types"]), kv("--parent", pci), flag("--available"), json_flag, kv("--connect", uri),
                 kv("--nvml", one_of_or_junk(["no"]))),
    "mdev create": cat(host, st.just(["mdev"]), kv("--mdevctl", SAFE), st.just(["create", "--parent"]), pci.map(
        lambda v: [v]), st.just(["--type"]), mtype.map(lambda v: [v]), kv("--uuid", uuid),
        kv("--persist", one_of_or_junk(["transient", "persistent"])), json_flag, flag("--dry-run")),
    "mdev remove": cat(host, st.just(["mdev", "remove"]), uuid.map(lambda v: [v]), flag("--keep-definition"),
                       json_flag, flag("--dry-run"), domains_args),
    "mdev list": cat(host, st.just(["mdev"]), kv("--mdevctl", SAFE), st.just(["list"]), flag("--defined"), json_flag),
    "mdev ensure": cat(host, st.just(["mdev", "ensure", "--uuid"]), uuid.map(lambda v: [v]), kv("--parent", pci),
                       kv("--type", mtype), kv("--state", one_of_or_junk(["present", "absent"])),
                       kv("--persist", one_of_or_junk(["transient", "persistent"])), json_flag, flag("--dry-run")),
    "mdev restore": cat(host, st.just(["mdev"]), kv("--mdevctl", SAFE), st.just(["restore"]), flag("--only-auto"),
                        json_flag, flag("--dry-run")),
    "sriov enable": cat(host, st.just(["sriov", "enable"]), pci.map(lambda v: [v]), kv("--num", num),
                        flag("--force"), flag("--no-vendor-tool"), json_flag, flag("--dry-run"), domains_args),
    "sriov disable": cat(host, st.just(["sriov", "disable"]), pci.map(lambda v: [v]), flag("--force"),
                         json_flag, flag("--dry-run"), domains_args),
    "sriov show": cat(host, st.just(["sriov", "show"]), opt(pci.map(lambda v: [v])), json_flag, domains_args),
    "iommu check": cat(host, st.just(["iommu", "check"]), st.lists(pci, min_size=1, max_size=3),
                       kv("--for-domain", one_of_or_junk(["vm-1"])), json_flag, domains_args),
    "iommu prepare": cat(host, st.just(["iommu", "prepare"]), st.lists(pci, min_size=1, max_size=2),
                         kv("--record", st.sampled_from(["@N", "@N", "@F", "@M/rec.json"])), json_flag,
                         flag("--dry-run"), domains_args),
    "iommu release": cat(host, st.just(["iommu", "release"]), st.lists(pci, max_size=2), kv("--record", file_arg),
                         json_flag, flag("--dry-run"), domains_args),
    "xml build": cat(st.just(["xml", "build", "--template"]),
                     one_of_or_junk(["vdi", "gaming", "compute", "@F"]).map(lambda v: [v]),
                     st.just(["--name"]), one_of_or_junk(["vm-1"]).map(lambda v: [v]), kv("--uuid", uuid),
                     kv("--memory-mib", num), kv("--vcpus", num),
                     st.lists(one_of_or_junk([UUIDS[0], UUIDS[0] + ":display", UUIDS[1] + ":display:ramfb"])
                              .map(lambda v: ["--mdev", v]), max_size=2).map(lambda ls: [w for p in ls for w in p]),
                     st.lists(one_of_or_junk(["0000:01:00.0", "0000:01:00.1", "0000:41:00.4:unmanaged"])
                              .map(lambda v: ["--pci", v]), max_size=2).map(lambda ls: [w for p in ls for w in p]),
                     kv("--nic", one_of_or_junk(["0000:5e:02.0,52:54:00:aa:bb:cc",
                                                 "0000:5e:02.0,52:54:00:aa:bb:cc,7"])),
                     kv("--disk", one_of_or_junk(["/var/lib/libvirt/images/a.qcow2"])),
                     kv("--graphics", one_of_or_junk(["spice", "vnc", "none"])), flag("--secure-boot"),
                     flag("--tpm"), kv("--pin", cpulist), kv("--emulator-pin", cpulist), kv("--host-cpus", cpulist),
                     kv("--numa-node", num), flag("--no-validate"), json_flag),
    "xml lint": cat(st.just(["xml", "lint", "@F"]), kv("--host-cpus", cpulist), json_flag),
    "xml devices": cat(st.just(["xml", "devices", "@F"]), json_flag),
    "gc": cat(host, st.just(["gc"]), flag("--apply"), json_flag, domains_args),
    "sim list": st.just(["sim", "list"]),
    "sim show": cat(st.just(["sim", "show"]), one_of_or_junk([*PROFILES, "@F"]).map(lambda v: [v]), json_flag),
    "sim materialize": cat(st.just(["sim", "materialize"]), one_of_or_junk([*PROFILES, "@F"]).map(lambda v: [v]),
                           SAFE.map(lambda v: ["out/" + v.replace("/", "_")])),
    "sim mount": cat(st.just(["sim", "mount"]), one_of_or_junk(["t4x2", "@F"]).map(lambda v: [v]),
                     SAFE.map(lambda v: ["nodir/" + v.replace("/", "_")]), flag("--background")),
    "sim umount": cat(st.just(["sim", "umount", "@N"]), opt(st.just(["--pid-file", "@P"]))),
    "global": cat(st.one_of(
        SAFE.map(lambda v: ["--host", v]),
        SAFE.map(lambda v: ["--host", "sim:" + v]),
        st.just(["--host", "sim:@F"]), st.just(["--host", "sim:@F"]),  # a profile file: any bytes
        SAFE.map(lambda v: ["--host", "ssh://" + v + "\x01"]),       # never a valid ssh target: no connection
        SAFE.map(lambda v: ["--host", "local", "--sysfs-root", "nodir/" + v]),
        st.tuples(profile, SAFE).map(lambda pv: ["--host", f"sim:{pv[0]}", "--sysfs-root", pv[1]]),
    ), st.sampled_from([["inventory"], ["types"], ["inventory", "--json"], ["mdev", "list"], ["sriov", "show"]])),
}
for _verb in ("plan", "provision"):
    VERBS[_verb] = cat(host, st.just([_verb]), kv("--connect", st.sampled_from(URIS)),
                       st.lists(one_of_or_junk(["vm-a", "vm-b"]).map(lambda v: ["--name", v]), max_size=2)
                       .map(lambda ls: [w for p in ls for w in p]),
                       kv("--prefix", one_of_or_junk(["fz"])), kv("--count", num),
                       st.lists(one_of_or_junk(["nvidia-231", "fb>=2G,series=Q", "passthrough", "vf", "GRID T4-2Q"])
                                .map(lambda v: ["--gpu", v]), max_size=2).map(lambda ls: [w for p in ls for w in p]),
                       kv("--template", one_of_or_junk(["vdi", "gaming", "compute", "@F"])),
                       kv("--memory-mib", num), kv("--vcpus", num), kv("--numa-node", num), flag("--numa-strict"),
                       opt(st.one_of(st.just(["--nic-vf"]), pci.map(lambda v: ["--nic-vf", v]))),
                       kv("--policy", one_of_or_junk(["binpack", "spread"])), flag("--heterogeneous"),
                       flag("--no-start"), flag("--explain"),
                       flag("--dry-run") if _verb == "provision" else st.just([]))
VERBS["teardown"] = cat(host, st.just(["teardown"]), kv("--connect", st.sampled_from(URIS)),
                        st.lists(one_of_or_junk(["test", "vm-a", "fz-001"]), max_size=2),
                        st.lists(one_of_or_junk(["*", "vm-*", "t*"]).map(lambda v: ["--pattern", v]), max_size=1)
                        .map(lambda ls: [w for p in ls for w in p]), flag("--remove-storage"), flag("--dry-run"))

VERBS["scheduler show"] = cat(host, st.just(["scheduler", "show"]), st.lists(pci, max_size=2), json_flag)
VERBS["scheduler set"] = cat(host, st.just(["scheduler", "set"]), st.lists(pci, min_size=1, max_size=2),
                             st.just(["--policy"]),
                             one_of_or_junk(["best-effort", "equal-share", "fixed-share"]).map(lambda v: [v]),
                             kv("--timeslice-us", num), opt(st.sampled_from([["--adaptive"], ["--no-adaptive"]])),
                             flag("--persist"), flag("--dry-run"), json_flag)

VERBS["capture"] = cat(host, st.just(["capture", "-o"]), st.sampled_from(["@N", "@N", "@M/c.json", "@N.gz"])
                       .map(lambda v: [v]), flag("--redact"),
                       kv("--program", one_of_or_junk(["nvidia-smi=/nonexistent/nvidia-smi", "dmesg=/bin/true"])),
                       json_flag)
# a replay of a (fuzzed) capture file: any reading verb, and a change it must refuse
VERBS["capture replay"] = cat(st.just(["--host", "capture:@F"]), st.sampled_from(
    [["inventory"], ["types"], ["mig", "show"], ["scheduler", "show"], ["metrics"], ["layout", "export"],
     ["mdev", "create", "--parent", "0000:3b:00.0", "--type", "nvidia-231"]]), json_flag)

READ_ONLY = {"capture replay", "inventory", "types", "mdev list", "sriov show", "iommu check", "xml build", "xml lint",
             "xml devices", "plan", "sim list", "sim show", "global", "scheduler show"}

# file contents: domain XML, JSON records, YAML profiles (a shipped one with one value replaced), junk
PROFILE_TEXT = (Path(__file__).resolve().parents[2] / "vgpuvirt" / "sim" / "profiles" / "t4x2.yaml").read_text()
file_content = st.one_of(
    mutated_xml().map(str.encode),
    st.binary(max_size=200),
    junk_text(200).map(lambda s: s.encode("utf-8", "surrogateescape")),
    st.sampled_from([b"", b"{}", b"[]", b"null", b'{"devices": {}}', b"\xff\xfe", b"&a [*a, *a, *a]"]),
    # deep nesting, past Python's recursion limit (1000) and lxml's depth limit (256): parsers that recurse
    st.sampled_from([b"[" * 1500, b"{" * 1500, b'{"a": ' * 1500 + b"1" + b"}" * 1500, b"- " * 1500,
                     b"<a>" * 1500]),
    st.tuples(st.sampled_from(["GRID T4-2Q", "Tesla T4", "t4x2", "0000:3b:00.0", "nvidia", "35"]), junk_text(30))
    .map(lambda t: PROFILE_TEXT.replace(t[0], t[1].replace("\n", " ").replace('"', "'"), 1)
         .encode("utf-8", "surrogateescape")),
)
def _capture_text() -> str:
    from vgpuvirt.capture.record import capture
    from vgpuvirt.sim import SimHost
    return json.dumps(capture(SimHost.from_profile("t4x2")))


# a real capture (of t4x2), whole or with one value replaced: what `--host capture:FILE` must survive
CAPTURE_TEXT = _capture_text()
file_content = st.one_of(
    file_content,
    st.just(CAPTURE_TEXT.encode()),
    st.tuples(st.sampled_from(['"rc": 0', '"f"', '"l"', "nvidia-231", '"version": 1', '"entries"', '"argv"',
                               '"stdout": "', "0000:3b:00.0", '"ok": true', '"call"', '"host"', '[\\"all\\"]']),
              st.one_of(junk_text(30),           # JSON-valid replacements too, so that the file still parses
                        st.sampled_from(['5', 'null', '[]', '{}', 'true', '"x"', '"stdout": 5, "y": "', '-1']),
                        junk_text(20).map(lambda j: json.dumps(j)[1:-1])))
    .map(lambda t: CAPTURE_TEXT.replace(t[0], t[1], 1).encode("utf-8", "surrogateescape")),
)
pid_content = junk_text(20).filter(lambda s: not s.strip().lstrip("+-").isdigit())


def _materialize(argv: list[str], work: Path, content: bytes, pid_text: str, n: int) -> list[str]:
    inputs = work.parent / (work.name + "-inputs")  # outside the watched directory
    inputs.mkdir(exist_ok=True)
    f = inputs / "in"
    f.write_bytes(content)
    p = inputs / "pid"
    p.write_text(pid_text, errors="surrogateescape")
    out = []
    for w in argv:
        w = w.replace("sim:@F", f"sim:{f}").replace("capture:@F", f"capture:{f}")
        if w == "@N.gz":
            w = f"new-{n}.json.gz"
        if w == "@F":
            w = str(f)
        elif w == "@N":
            w = f"new-{n}.json"
        elif w == "@P":
            w = str(p)
        elif w.startswith("@M/"):
            w = f"missing-dir-{n}/" + w[3:]
        out.append(w)
    return out


def _listing(work: Path) -> set[str]:
    return {str(p.relative_to(work)) for p in work.rglob("*")}


def _cleanup_domains(conn: Any, baseline: list[tuple[str, bool, bool]]) -> None:
    keep = {name for name, _, _ in baseline}
    for d in conn.listAllDomains():
        if d.name() not in keep:
            if d.isActive():
                d.destroy()
            if d.isPersistent():
                d.undefine()


_n = [0]


@pytest.mark.slow
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_cli_verb(verb: str, workdir: Path, libvirt_default: Any, opened_hosts: list[Any]) -> None:
    baseline = _domains(libvirt_default)

    @fuzz_settings(N_VERB)
    @given(argv=VERBS[verb], content=file_content, pid_text=pid_content)
    def case(argv: list[str], content: bytes, pid_text: str) -> None:
        count(f"cli:{verb}")
        _n[0] += 1
        words = _materialize(argv, workdir, content, pid_text, _n[0])
        assume(verb != "sim umount" or not os.path.ismount(words[2]))
        before = _listing(workdir)
        opened_hosts.clear()
        try:
            r = run_cli(words, opened_hosts)
            r.check(report_rc=(1,) if verb in ("iommu check", "xml lint") else ())
            if r.rc != 0 or verb in READ_ONLY or "--dry-run" in words:
                changed = [h.name for h in r.hosts if getattr(getattr(h, "model", None), "version", 0) != 0]
                assert not changed, f"{words!r} exited {r.rc} but changed {changed}: {r.stderr[-300:]!r}"
                assert _domains(libvirt_default) == baseline, f"{words!r} exited {r.rc} but libvirt domains changed"
                new = _listing(workdir) - before
                assert not new, f"{words!r} exited {r.rc} but wrote {sorted(new)}"
            assert ("test", True, True) in _domains(libvirt_default), "a domain vgpuvirt did not make was touched"
        finally:
            _cleanup_domains(libvirt_default, baseline)
            for p in _listing(workdir) - before:
                q = workdir / p
                if q.is_file() or q.is_symlink():
                    q.unlink()
            for p in sorted(_listing(workdir) - before, key=len, reverse=True):
                (workdir / p).rmdir()

    case()
