"""Every simulated host file: random text written to the writable sysfs attributes of a SimHost (through
``host.apply([Op.write(...)])``, the path every service takes), random bytes in the files of a materialized
tree read by a LocalHost (what a broken or hostile host can show), and shipped profiles with one value replaced.

After any of it ``inventory()`` must still answer (or refuse with a one-line error), a refused write must
leave the simulated host unchanged, and a write that the kernel would refuse fails with an errno.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzzkit import INJECTIONS, count, fuzz_settings, junk_text, refuses_cleanly
from hypothesis import given
from hypothesis import strategies as st

from vgpuvirt.host.base import Op
from vgpuvirt.services.inventory.read import inventory
from vgpuvirt.sim import SimHost

PROFILES = ["t4x2", "a10-sriov", "a100-sriov", "desktop", "gvtg", "l40s-vgpu17", "mxgpu", "mixed"]


def _files(host: SimHost) -> tuple[list[str], list[str]]:
    """(writable, read-only) attribute paths of the host's real directories (links are not followed)."""
    fs = host.fs
    writable: list[str] = []
    readonly: list[str] = []

    def walk(d: str) -> None:
        for name in fs.listdir(d):
            p = f"{d}/{name}"
            kind, mode = fs.stat(p)
            if kind == "d":
                walk(p)
            elif kind == "f":
                (writable if mode & 0o222 else readonly).append(p)

    walk("/sys")
    return writable, readonly


@functools.cache
def files(profile: str) -> tuple[list[str], list[str]]:
    # walked when a test first draws from the profile, not at import: every xdist worker imports this module
    # to collect it (0.11 s of CPU for the eight trees), and the inner loop (-m "not slow") runs none of its fuzzing
    return _files(SimHost.from_profile(profile))

value = st.one_of(
    junk_text(60),
    st.sampled_from(["1", "0", "-1", "4", "64", "65536", "0x10", " 1\n", "1\n\n", "vfio-pci", "nvidia", "10de 1eb8",
                     "0000:3b:00.0", "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", "1155", "flr", "bus", "2048"]),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.integers(-(2**70), 2**70).map(str),
    st.just("9" * 5000),
)


@st.composite
def writes(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    profile = draw(st.sampled_from(PROFILES))
    writable, readonly = files(profile)
    paths = st.one_of(st.sampled_from(writable), st.sampled_from(writable), st.sampled_from(readonly))
    return profile, draw(st.lists(st.tuples(paths, value), min_size=1, max_size=4))


@pytest.mark.slow
@fuzz_settings(500)
@given(w=writes())
def test_writes_to_any_sim_file(w: tuple[str, list[tuple[str, str]]]) -> None:
    count("sim:apply-write")
    profile, ops = w
    host = SimHost.from_profile(profile)
    for path, text in ops:
        before = host.model.version
        op = refuses_cleanly(lambda path=path, text=text: Op.write(path, text))
        if op is None:
            assert host.model.version == before
            continue
        res = refuses_cleanly(lambda op=op: host.apply([op], on_error="continue"))
        if res is None:
            assert host.model.version == before
            continue
        r = res[0]
        if not r.ok:
            assert isinstance(r.errno, int) and r.error, f"a refused write without errno: {r}"
            assert host.model.version == before, f"refused write {path} <- {text!r} changed the host"
    inv = refuses_cleanly(lambda: inventory(host))
    if inv is not None:
        json.dumps(inv.to_dict())


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    from vgpuvirt.sim.materialize import materialize
    out = {}
    for p in ("t4x2", "a10-sriov", "l40s-vgpu17", "gvtg"):
        d = tmp_path_factory.mktemp(f"tree-{p}")
        materialize(p, str(d))
        out[p] = d
    yield out


def _regular_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink())


MARKUP = [b"[/x]", b"GRID T4-2Q[/x]\n", b"[bold]x", b"[link=http://evil]x[/link]", b"\x1b[2J\x1b]8;;http://x\x07",
          b"\x1b]0;title\x07", b"name\rspoof", b"\xe2\x80\xae\n"]
content = st.one_of(junk_text(80).map(lambda s: s.encode("utf-8", "surrogateescape")), st.binary(max_size=80),
                    st.sampled_from(MARKUP), st.sampled_from(MARKUP),
                    st.sampled_from([b"", b"\n", b"-1\n", b"99999999999999999999\n", b"0x\n", b"[/x]\n",
                                     b"GRID T4-2Q[/x]\n", b"\x1b[2J\x1b]8;;http://x\x07", b"\xff" * 5000,
                                     *(i.encode("utf-8", "surrogateescape") for i in INJECTIONS)]))


@pytest.mark.slow
def test_hostile_file_contents_in_a_tree(trees: dict[str, Path]) -> None:
    from fuzzkit import run_cli

    from vgpuvirt.host.local import LocalHost
    files = {p: _regular_files(d) for p, d in trees.items()}
    # files holding words (type names, descriptions, uevents) are printed as such: pick them half the time
    wordy = {p: [f for f in fs if re.search(rb"[g-zG-Z ]", (trees[p] / f).read_bytes())] for p, fs in files.items()}

    @fuzz_settings(500)
    @given(profile=st.sampled_from(sorted(trees)), data=st.data())
    def case(profile: str, data: st.DataObject) -> None:
        count("sim:tree-file-contents")
        root = trees[profile]
        path = st.one_of(st.sampled_from(files[profile]), st.sampled_from(wordy[profile]))
        picked = data.draw(st.lists(st.tuples(path, content), min_size=1, max_size=3,
                                    unique_by=lambda t: t[0]))
        saved = {rel: (root / rel).read_bytes() for rel, _ in picked}
        try:
            for rel, raw in picked:
                (root / rel).write_bytes(raw)
            inv = refuses_cleanly(lambda: inventory(LocalHost(str(root)), nvidia_smi=False, use_nvml=False))
            if inv is not None:
                json.dumps(inv.to_dict())
            verb = data.draw(st.sampled_from([["types"], ["types"], ["types", "--available"], ["inventory"],
                                              ["inventory", "--json"], ["mdev", "list"],
                                              ["iommu", "check", "0000:3b:00.0"], ["sriov", "show"]]))
            r = run_cli(["--sysfs-root", str(root), *verb[:1], *(["--no-nvidia-smi", "--nvml", "no"]
                                                                  if verb[0] in ("types", "inventory") else []),
                         *verb[1:]])
            r.check(report_rc=(1,) if verb[0] == "iommu" else ())
            # host text is printed as text: no terminal control sequence of the host's reaches the user's terminal
            leaked = [c for c in "\x1b\x07\x9b\r" if c in r.stdout + r.stderr]
            assert not leaked, f"control characters {leaked!r} from host files reached the terminal: {verb!r}"
        finally:
            for rel, raw in saved.items():
                (root / rel).write_bytes(raw)

    case()


def _profile_leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _profile_leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _profile_leaves(v, (*path, i))
    else:
        yield path


def _shipped(name: str) -> dict[str, Any]:
    import yaml
    text = (Path(__file__).resolve().parents[2] / "vgpuvirt" / "sim" / "profiles" / f"{name}.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


SHIPPED = {p: _shipped(p) for p in ("t4x2", "a10-sriov", "desktop")}
LEAVES = {p: list(_profile_leaves(d)) for p, d in SHIPPED.items()}
leaf_value = st.one_of(junk_text(30), st.integers(-5, 2**40), st.none(), st.booleans(), st.floats(),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                            max_size=2))


@pytest.mark.slow
def test_profiles_with_one_value_replaced(tmp_path: Path) -> None:
    import copy

    import yaml

    @fuzz_settings(400)
    @given(profile=st.sampled_from(sorted(SHIPPED)), data=st.data())
    def case(profile: str, data: st.DataObject) -> None:
        count("sim:profile-values")
        doc = copy.deepcopy(SHIPPED[profile])
        for leaf in data.draw(st.lists(st.sampled_from(LEAVES[profile]), min_size=1, max_size=2)):
            node = doc
            for k in leaf[:-1]:
                node = node[k]
            node[leaf[-1]] = data.draw(leaf_value)
        f = tmp_path / "p.yaml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True), errors="surrogateescape")
        host = refuses_cleanly(lambda: SimHost.from_profile(str(f)))
        if host is not None:
            inv = refuses_cleanly(lambda: inventory(host))
            if inv is not None:
                json.dumps(inv.to_dict())

    case()


def test_every_profile_has_writable_files() -> None:
    # the write fuzzing above is only as good as the files it finds
    for p in PROFILES:
        assert files(p)[0], p


# ---------------------------------------------------------------- issue 27: a full disk under materialize

_FULL_DISK = r"""
import json, os, subprocess, sys
from vgpuvirt.errors import HostError
from vgpuvirt.sim import materialize
mnt, profiles, sizes = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
out = []
for size in sizes:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", mnt], check=True)
    try:
        for p in profiles:
            dest = os.path.join(mnt, p)
            try:
                n = materialize(p, dest)
                out.append([size, p, "ok", n, os.path.isdir(dest)])
            except HostError as exc:
                out.append([size, p, str(exc), 0, os.path.lexists(dest)])
            except Exception as exc:
                out.append([size, p, "CRASH " + type(exc).__name__ + ": " + str(exc), 0, True])
            subprocess.run(["rm", "-rf", dest], check=True)
    finally:
        subprocess.run(["umount", mnt], check=True)
print(json.dumps(out))
"""


def test_materialize_onto_a_disk_that_fills_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """Every shipped profile onto tmpfs file systems of several sizes (in a private mount namespace): a whole
    tree, or one HostError naming the cause and nothing left (a full disk was an OSError traceback)."""
    import os
    import shutil
    import subprocess
    import sys
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sizes = ["8k", "64k", "256k", "1m", "4m"]
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", _FULL_DISK, str(mnt),
                        ",".join(PROFILES), ",".join(sizes)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.splitlines()[-1])
    assert len(results) == len(sizes) * len(PROFILES)
    for size, profile, outcome, _, left in results:
        count("sim-files:materialize onto a full disk")
        if outcome == "ok":
            assert left, (size, profile)
            continue
        assert "\n" not in outcome and "No space left on device" in outcome, (size, profile, outcome)
        assert not left, f"{profile} on {size}: a half-written tree was left"
    assert {o == "ok" for _, _, o, _, _ in results} == {True, False}      # both sides were exercised
