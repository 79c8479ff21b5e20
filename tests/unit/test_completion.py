"""``vgpuvirt completion bash|zsh`` and ``--version`` (issue 26): the scripts are sourced in the real shells and
asked to complete, as a user's TAB would."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import require_part  # type: ignore[import-not-found]

import vgpuvirt
from vgpuvirt.cli import SUBCOMMANDS, build_parser, main
from vgpuvirt.cli.completion import command_tree


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


def test_version_prints_the_package_version() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0
    assert out.getvalue() == f"vgpuvirt {vgpuvirt.__version__}\n"


def test_the_tree_holds_every_verb_and_sub_verb() -> None:
    tree = command_tree(build_parser())
    assert set(tree[""][0]) == {name for name, _module, _help in SUBCOMMANDS}
    assert "show" in tree["audit"][0] and "--since" in tree["audit show"][1]
    assert {"bash", "zsh"} <= set(tree["completion"][1])


def _bash_complete(script: Path, *words: str) -> list[str]:
    """COMPREPLY for the command line ``words`` (the last one being completed)."""
    line = " ".join(f"'{w}'" for w in words)
    probe = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
             "_vgpuvirt; complete -p vgpuvirt >&2; printf '%s\\n' \"${COMPREPLY[@]}\"")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], capture_output=True, text=True,
                          check=True)
    assert proc.stderr.strip() == "complete -F _vgpuvirt vgpuvirt"
    return proc.stdout.split()


def test_bash_completes_verbs_sub_verbs_and_options(tmp_path: Path) -> None:
    rc, text = _cli("completion", "bash")
    assert rc == 0
    script = tmp_path / "vgpuvirt.bash"
    script.write_text(text)
    assert _bash_complete(script, "vgpuvirt", "inv") == ["inventory"]
    assert _bash_complete(script, "vgpuvirt", "s") == ["sriov", "sim", "scheduler"]
    # option values (sim:t4x2) and options are skipped when finding the verb
    assert _bash_complete(script, "vgpuvirt", "--host", "sim:t4x2", "audit", "")[0] == "show"
    assert _bash_complete(script, "vgpuvirt", "audit", "show", "--si") == ["--since"]
    assert _bash_complete(script, "vgpuvirt", "completion", "z") == ["zsh"]


def test_zsh_completes_verbs(tmp_path: Path) -> None:
    require_part("zsh", shutil.which("zsh") is not None, "apt-get install zsh (scripts/testbed.sh install does)")
    rc, text = _cli("completion", "zsh")
    assert rc == 0 and text.startswith("#compdef vgpuvirt\n")
    script = tmp_path / "_vgpuvirt"
    script.write_text(text)
    # compadd only works inside a completion widget: a function of that name records what would be offered
    probe = (f"compadd() {{ [[ $1 == -- ]] && shift; print -rl -- $@; }}; source {script}; "
             "words=(vgpuvirt --json audit ''); CURRENT=4; _vgpuvirt")
    out = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert "show" in out and "--since" not in out and "inventory" not in out
    # installed the zsh way: compinit registers it for vgpuvirt
    reg = subprocess.run(["zsh", "-f", "-c", f"autoload -U compinit; compinit -u -d {tmp_path}/zcd; source {script};"
                          " print -r -- ${_comps[vgpuvirt]}"], capture_output=True, text=True, check=True)
    assert reg.stdout.strip() == "_vgpuvirt"


def test_an_unknown_shell_is_refused() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ei:
        main(["completion", "fish"])
    assert ei.value.code == 2 and "invalid choice: 'fish'" in err.getvalue()
