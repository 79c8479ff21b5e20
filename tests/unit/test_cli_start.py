"""The CLI starts fast (issue 25): `--help` comes from the static verb table, and a run imports only the chosen
verb's module and what that verb needs. Each case runs the real command in a fresh interpreter and fails when a
module that verb has no use for is loaded, so the gain cannot erode silently (benchmarks/bench_cli_start.py
gives the figures)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vgpuvirt.cli import SUBCOMMANDS, build_parser, chosen_verb
from vgpuvirt.cli.options import CliParser

REPO = Path(__file__).resolve().parents[2]
VERB_MODULES = {module for _name, module, _help in SUBCOMMANDS}

# Loaded by a fresh interpreter that runs main(argv), then prints its sys.modules (stdout stays the verb's).
_PROBE = """
import contextlib, io, json, sys
from vgpuvirt.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        rc = main(sys.argv[2:])
    except SystemExit as exc:
        rc = exc.code
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "modules": sorted(sys.modules)}, f)
"""


def loaded(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", _PROBE, str(out), *argv], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=120)
    data = json.loads(out.read_text())
    return int(data["rc"] or 0), set(data["modules"])


def under(modules: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


# What no read-only one-host verb needs: provisioning, layouts, the exporter, libvirt and the XML builders
# (domain XML is only read, through vgpuvirt.xml.refs), SSH, Prometheus.
HEAVY = ("vgpuvirt.provision", "vgpuvirt.layout", "vgpuvirt.libvirt_conn", "libvirt",
         # what observe/ held before metrics collection joined it: the exporter and top's rendering
         "vgpuvirt.observe.exporter", "vgpuvirt.observe.prometheus", "vgpuvirt.cli.top_live",
         "vgpuvirt.cli.top_view",
         "vgpuvirt.xml.domain", "vgpuvirt.xml.templates", "vgpuvirt.xml.schema", "vgpuvirt.xml.lint",
         "paramiko", "prometheus_client")


def test_help_loads_no_verb_module_and_no_host_code(tmp_path: Path) -> None:
    rc, mods = loaded(tmp_path, "--help")
    assert rc == 0
    assert not under(mods, *VERB_MODULES, "vgpuvirt.host", "vgpuvirt.services", "vgpuvirt.sim", "vgpuvirt.xml",
                     "lxml", "yaml", "rich", *HEAVY)


@pytest.mark.parametrize("verb", [name for name, _m, _h in SUBCOMMANDS])
def test_a_verb_loads_its_own_module_and_no_other_verbs(tmp_path: Path, verb: str) -> None:
    rc, mods = loaded(tmp_path, verb, "--help")
    own = dict((n, m) for n, m, _h in SUBCOMMANDS)[verb]
    assert rc == 0 and own in mods
    others = VERB_MODULES - {own}
    # a verb may build on another's helpers (types reuses inventory's options); it must say so here
    allowed = {"types": {"vgpuvirt.cli.inventory"}, "plan": {"vgpuvirt.cli.provision"},
               "teardown": {"vgpuvirt.cli.provision"}, "attach": {"vgpuvirt.cli.vm"},
               "detach": {"vgpuvirt.cli.vm", "vgpuvirt.cli.attach"}}.get(verb, set())
    assert not (under(mods, *others) and set(under(mods, *others)) - allowed), under(mods, *others)


def test_inventory_of_a_local_tree_loads_no_simulator_and_nothing_heavy(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _rc, mods = loaded(tmp_path, "--json", "--sysfs-root", str(root), "inventory")
    assert "vgpuvirt.services.inventory.read" in mods
    assert not under(mods, "vgpuvirt.sim", "yaml", "rich", *HEAVY)


def test_inventory_of_a_sim_host_loads_the_simulator_and_still_nothing_heavy(tmp_path: Path) -> None:
    rc, mods = loaded(tmp_path, "--json", "--host", "sim:t4x2", "inventory")
    assert rc == 0 and "vgpuvirt.sim" in mods
    assert not under(mods, "rich", *HEAVY)          # rich: --json prints no table


def test_a_table_loads_rich_and_json_metrics_no_exporter(tmp_path: Path) -> None:
    rc, mods = loaded(tmp_path, "--host", "sim:t4x2", "inventory")
    assert rc == 0 and "rich.table" in mods         # the table is really printed: the probe is not blind
    rc, mods = loaded(tmp_path, "--json", "--host", "sim:t4x2", "metrics")
    assert rc == 0 and "vgpuvirt.observe.collect" in mods
    assert not under(mods, "rich", *HEAVY)


def _registered_help(module: str, name: str) -> str | None:
    p = CliParser(prog="x")
    sub = p.add_subparsers()
    importlib.import_module(module).register(sub)
    for action in sub._choices_actions:
        if action.dest == name:
            return action.help
    return None


@pytest.mark.parametrize(("name", "module", "helptext"), SUBCOMMANDS)
def test_the_table_is_what_each_module_registers(name: str, module: str, helptext: str) -> None:
    # `vgpuvirt --help` prints the table: it must be the verb's own one-line help, under the verb's name
    assert _registered_help(module, name) == helptext


def test_the_probe_finds_the_verb_wherever_the_global_options_stand() -> None:
    assert chosen_verb(["--host", "sim:t4x2", "--json", "inventory", "--connect", "x"]) == "inventory"
    assert chosen_verb(["sriov", "--json", "disable", "--host", "X", "0000:41:00.0", "-v"]) == "sriov"
    assert chosen_verb(["--host", "metrics"]) is None         # --host took the word: no verb, let argparse say it
    assert chosen_verb(["nosuchverb"]) is None
    assert chosen_verb([]) is None


def test_the_lazy_parser_parses_as_the_whole_one() -> None:
    argv = ["--host", "sim:t4x2", "-v", "sriov", "-v", "show", "--identity", "k"]
    whole = vars(build_parser().parse_args(argv))
    lazy = vars(build_parser(only="sriov").parse_args(argv))
    assert whole == lazy


def test_a_stub_is_never_run() -> None:
    # the stand-ins only carry the help line; were one chosen, it would have no func and fail loudly
    p = build_parser(only="inventory")
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices["types"].get_default("func") is None
    assert sub.choices["inventory"].get_default("func") is not None


@pytest.mark.parametrize("argv", [("vm", "list"), ("host", "status"), ("plan", "--gpu", "fb>=1024", "--no-start")])
def test_a_libvirt_verb_on_a_host_not_over_ssh_loads_no_ssh(tmp_path: Path, argv: tuple[str, ...]) -> None:
    # Seen on a real H100 host without paramiko: `vm list`, `host status` and `plan` on `--host local` died in
    # default_uri's import of the SSH host before they asked libvirt anything.
    _rc, mods = loaded(tmp_path, "--json", "--host", "sim:t4x2", *argv)
    assert "vgpuvirt.libvirt_conn" in mods          # the probe is not blind: the verb did open libvirt
    assert not under(mods, "paramiko", "vgpuvirt.host.ssh")
