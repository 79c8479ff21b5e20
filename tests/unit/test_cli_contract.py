"""The CLI keeps its word (issue 16): global options anywhere, every --host used or refused, errors in CLI
words, tables never cut, --json on every verb."""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from vgpuvirt.cli import build_parser, main
from vgpuvirt.cli.api_words import FLAG_FOR_KEYWORD
from vgpuvirt.cli.context import console_for
from vgpuvirt.cli.options import GLOBALS, merge_globals

PACKAGE = Path(__file__).resolve().parents[2] / "vgpuvirt"
GLOBAL_FLAGS = [flags[0] for flags, _k, _kw in GLOBALS.values()]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def parsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every parser of the command, with its verb path."""
    found = [(path, p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += parsers(sub, (*path, name))
    return found


def test_every_verb_and_sub_verb_carries_every_global_option() -> None:
    every = parsers(build_parser())
    assert len(every) > 20
    for path, p in every:
        have = {s for a in p._actions for s in a.option_strings}
        missing = [f for f in GLOBAL_FLAGS if f not in have]
        assert not missing, f"`vgpuvirt {' '.join(path)}` lacks {missing}"


def parse(*argv: str) -> argparse.Namespace:
    return merge_globals(build_parser().parse_args(list(argv)))


def test_options_after_the_verb_do_not_clobber_those_before() -> None:
    ns = parse("--host", "sim:t4x2", "--json", "-v", "sriov", "-v", "show", "--identity", "k", "-v")
    assert ns.hosts == ["sim:t4x2"] and ns.json and ns.verbose == 3 and ns.identity == "k"
    ns = parse("--host", "sim:t4x2@a", "provision", "--host", "sim:t4x2@b")
    assert ns.hosts == ["sim:t4x2@a", "sim:t4x2@b"]          # before: only the last --host, silently
    with pytest.raises(Exception, match="--identity"):
        parse("--identity", "a", "types", "--identity", "b")


@pytest.mark.parametrize("argv", [
    ["types", "--json", "--host", "sim:t4x2"],
    ["--host", "sim:t4x2", "types", "--json"],
    ["--json", "types", "--host", "sim:t4x2", "-v"],
])
def test_global_options_before_or_after_the_verb(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and json.loads(out)[0]["parent"] == "0000:3b:00.0"


@pytest.mark.parametrize("argv", [
    ["inventory"], ["types"], ["mdev", "list"], ["sriov", "show"], ["iommu", "check", "0000:3b:00.0"],
    ["audit", "show"], ["plan", "--count", "1"], ["gc", "--connect", "test:///default"],
    ["mdev", "create", "--parent", "0000:3b:00.0", "--type", "nvidia-231", "--dry-run"],
])
def test_json_after_every_verb(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:t4x2", *argv, "--json")
    assert rc in (0, 1)
    json.loads(out)


@pytest.mark.parametrize("argv", [["sim", "show", "t4x2"], ["xml", "build", "--template", "vdi", "--name", "d"],
                                  ["sim", "list"], ["sim", "umount", "{tmp}"],
                                  ["sim", "materialize", "t4x2", "{tmp}/t"]])
def test_json_after_hostless_verbs(capsys: pytest.CaptureFixture[str], argv: list[str], tmp_path: Path) -> None:
    rc, out, _ = run(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv), "--json")
    assert rc == 0
    json.loads(out)


def test_the_readme_multi_host_line_uses_every_host(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--host", "sim:t4x2@a", "--host", "sim:t4x2@b", "plan", "--connect", "test:///default",
                       "--connect", "test:///default", "--count", "4", "--policy", "spread", "--json")
    assert rc == 0, err
    assert {"sim:t4x2@a", "sim:t4x2@b"} <= set(re.findall(r"sim:t4x2@[ab]", out))


def test_named_simulated_hosts_have_their_own_state(capsys: pytest.CaptureFixture[str]) -> None:
    # 16 x 2Q-class vGPUs fill one T4 pair: 24 only fit because b is a second host, not a's state again
    rc, out, err = run(capsys, "--host", "sim:t4x2@a", "--host", "sim:t4x2@b", "provision", "--count", "24",
                       "--gpu", "fb>=2G,series=Q", "--prefix", "w16contract", "--json")
    assert rc == 0, err
    try:
        hosts = re.findall(r'"host": "(sim:t4x2@[ab])"', out)
        assert hosts.count("sim:t4x2@a") and hosts.count("sim:t4x2@b"), out[:2000]
    finally:
        # test:///default keeps one state per process: leave it as found for the tests that follow
        from provision_fixtures import drop_test_domains

        from vgpuvirt.libvirt_conn import LibvirtConnection
        drop_test_domains(LibvirtConnection("test:///default"))


@pytest.mark.parametrize(("argv", "words"), [
    (["--host", "sim:t4x2", "--host", "sim:t4x2", "plan"], "each host once"),
    (["--host", "ssh://root@127.0.0.1", "--host", "ssh://root@127.0.0.1:22", "plan"], "same host as"),
    (["--host", "sim:t4x2@a", "--host", "sim:t4x2@b", "inventory"], "one host for `inventory`"),
    (["--host", "sim:t4x2@a", "--host", "sim:t4x2@b", "plan", "--connect", "test:///default", "--connect",
      "test:///default", "--connect", "test:///default"], "one per --host"),
    (["--host", "sim:t4x2@bad/name", "types"], "sim:PROFILE@NAME"),
    (["--host", "sim:t4x2", "plan", "--connect", ""], "invalid --connect ''"),
])
def test_hosts_are_all_used_or_refused_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                   words: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1 and words in err and out == "", err


def test_errors_name_the_cli_flag_not_the_python_keyword(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dom = tmp_path / "vm1.xml"
    dom.write_text("<domain type='kvm'><name>vm1</name><devices><hostdev mode='subsystem' type='pci' managed='yes'>"
                   "<source><address domain='0x0000' bus='0x17' slot='0x00' function='0x4'/></source></hostdev>"
                   "</devices></domain>")
    rc, _, err = run(capsys, "--host", "sim:a100-sriov", "sriov", "disable", "0000:17:00.0", "--domain-xml", str(dom))
    assert rc == 1 and "--force" in err and "force=True" not in err, err


@pytest.mark.parametrize(("argv", "flag"), [
    (["--host", "sim:t4x2", "inventory", "--nvml", "yes"], "invalid --nvml yes"),
    (["--sysfs-root", "/nonexistent-w16", "types"], "invalid --sysfs-root"),
])
def test_invalid_values_are_named_by_their_flag(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                flag: str) -> None:
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and flag in err and "use_nvml" not in err, err


def _is_python_source(s: str) -> bool:
    """A program the library ships as a string (layout/boot.py's installer): code, not a message."""
    if "\n" not in s:
        return False
    try:
        ast.parse(s)
    except SyntaxError:
        return False
    return True


def _message_strings() -> list[tuple[str, int, str]]:
    """String constants of the library outside the CLI, docstrings and shipped programs."""
    out = []
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts[:1]:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out += [(str(path), n.lineno, n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                and not _is_python_source(n.value)]
    return out


def test_every_python_keyword_in_a_library_message_has_its_cli_words() -> None:
    found = {(f, line, m.group(0)) for f, line, s in _message_strings()
             for m in re.finditer(r"\b[a-z_]+=(True|False|None)\b", s)}
    assert found, "the scan finds the library's messages"
    missing = sorted(x for x in found if x[2] not in FLAG_FOR_KEYWORD)
    assert not missing, f"add to vgpuvirt/cli/api_words.py: {missing}"


def test_piped_tables_are_whole_lines(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host", "sim:t4x2", "inventory", "--no-nvidia-smi")
    assert rc == 0 and "…" not in out
    rc, js, _ = run(capsys, "--host", "sim:t4x2", "types", "--json")
    names = {r["name"] for r in json.loads(js)}
    assert names and all(n in out for n in names)          # before: cut at 80 columns ("GRID T4-…")


def test_terminal_tables_wrap_instead_of_cutting(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.table import Table

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "30")
    stream = Tty()
    con = console_for(stream)
    t = Table(title="t")
    t.add_column("address", no_wrap=True)
    t.add_column("name")
    t.add_row("0000:3b:00.0", "GRID T4-2B4 with a long description")
    con.print(t)
    text = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= 30
    assert "0000" in text and "descriptio" in text


def test_a_verb_with_its_own_copy_of_a_global_flag_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    # a verb module written the old way (its own --host/--json) must neither break start-up nor lose values
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    old = sub.add_parser("oldstyle")
    old.add_argument("--host", dest="hosts", action="append", default=None)
    old.add_argument("--json", action="store_true", dest="sub_json")
    ns = merge_globals(p.parse_args(["--host", "sim:t4x2@a", "oldstyle", "--host", "sim:t4x2@b", "--json"]))
    assert ns.hosts == ["sim:t4x2@a", "sim:t4x2@b"] and ns.sub_json
