"""Every example command line of README.md and docs/*.md runs as written (issue 16).

The convention (docs/testbed.md, "Documentation examples"):
- an example is a line that starts with ``vgpuvirt`` inside a fenced block tagged ``sh``; a line ending in ``\\``
  continues on the next; untagged fenced blocks are synopses (``[--json]``, ``PROFILE``) and are not run;
- each block runs in a fresh temporary directory that holds a link to the clone's ``examples/`` (a user runs
  the README from the clone's root), its lines in order, through ``bash -c`` (quotes, ``&&`` and
  ``# comments`` as a user's shell reads them) with ``vgpuvirt`` being this tree's CLI (a process per command,
  forked from a warm interpreter: tests/unit/cli_zygote.py);
- ``NAME=VALUE vgpuvirt ...`` lines are run too, and an ``export NAME=VALUE`` line sets NAME for the block's later
  lines (relative values are relative to the block's directory);
- a line must exit 0, unless its comment says ``(exit N)``;
- a line whose comment says ``(real host)`` needs hardware or a host this machine cannot reach (``ssh://gpu1``).
  It still runs, and must fail the way an unreachable host fails: exit 1 with one line on stderr. So it parses,
  and the marker cannot hide a line that would work here (that one must lose its marker);
- a line whose comment says ``(testbed)`` needs the running testbed (libvirtd, sshd): it runs when the testbed
  is up, and fails the test under CI when it is not;
- a block tagged ``text`` is shown, not run (a transcript, or a sequence that needs a set-up of its own); in any
  other block (untagged, ``bash``, ``shell``, ``console``) a ``vgpuvirt`` line must be a synopsis: it has
  ``[...]``, ``a|b``, ``...`` or an UPPERCASE placeholder. So no runnable example escapes the test by its fence.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_zygote import Zygote

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)
_EXIT = re.compile(r"\(exit (\d+)\)")


_SYNOPSIS = re.compile(r"\[|\||\.\.\.|(?<![\w/:.-])[A-Z][A-Z_]{1,}(?![\w/:.-])")


def examples(path: Path) -> list[list[tuple[int, str]]]:
    """The ``sh`` blocks of a Markdown file, each a list of (line number, command) for its vgpuvirt lines."""
    text = path.read_text()
    blocks: list[list[tuple[int, str]]] = []
    for m in _FENCE.finditer(text):
        if m.group(1) != "sh":
            continue
        first = text.count("\n", 0, m.start(2)) + 1
        lines = m.group(2).splitlines()
        cmds: list[tuple[int, str]] = []
        i = 0
        while i < len(lines):
            start, cmd = first + i, lines[i]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            if re.match(r"(?:[A-Z_]+=\S+\s+)*vgpuvirt\b|export [A-Z_]+=\S+$", cmd):
                cmds.append((start, cmd))
            i += 1
        if cmds:
            blocks.append(cmds)
    return blocks


def comment(cmd: str) -> str:
    # the shell's comment: a '#' after whitespace, outside quotes (the examples quote no '#')
    m = re.search(r"\s#(?!\S*['\"])(.*)$", cmd)
    return m.group(1) if m else ""


# A block of 15 commands or more runs for many seconds (a process each): `slow`, out of the inner loop.
CASES = [pytest.param(path, n, block, id=f"{path.name}:{block[0][0]}",
                      marks=[pytest.mark.slow] if len(block) >= 15 else [])
         for path in DOCS for n, block in enumerate(examples(path))]


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory with a ``vgpuvirt`` that runs this tree's CLI: each call a process of its own, forked from
    one interpreter that imported the CLI once (tests/unit/cli_zygote.py; benchmarks/bench_doc_examples.py: 0.45x
    the machine CPU of a whole ``python -m vgpuvirt`` each), with the shell's streams, environment and directory."""
    z = Zygote(tmp_path_factory.mktemp("cli"))
    try:
        yield z.bindir
    finally:
        z.close()


def test_every_example_line_is_run_or_a_synopsis() -> None:
    loose = []
    for path in DOCS:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            if m.group(1) not in ("", "bash", "shell", "console"):
                continue
            first = text.count("\n", 0, m.start(2)) + 1
            lines = m.group(2).splitlines()
            for i, line in enumerate(lines):
                j, cmd = i, line.split(" #")[0]
                while cmd.endswith("\\") and j + 1 < len(lines):
                    j += 1
                    cmd = cmd[:-1] + " " + lines[j].split(" #")[0]
                if re.match(r"(\$ )?vgpuvirt\b", cmd) and not _SYNOPSIS.search(cmd):
                    loose.append(f"{path.name}:{first + i}: {line.strip()}")
    assert not loose, "runnable examples outside a ```sh block (tag the block sh, or text if it cannot run):\n" + \
        "\n".join(loose)


def test_the_docs_have_examples() -> None:
    # the README's command-line section is the user's first contact: it must stay under test
    assert sum(len(b) for b in examples(REPO / "README.md")) >= 15


@pytest.mark.parametrize(("path", "n", "block"), CASES)
def test_example_block_runs_as_written(path: Path, n: int, block: list[tuple[int, str]], bindir: Path,
                                       tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if any("(testbed)" in comment(cmd) for _, cmd in block):
        request.getfixturevalue("testbed")     # starts it, or skips (fails under CI) saying what is missing
    (tmp_path / "examples").symlink_to(REPO / "examples")     # `examples/layouts/lab.yaml` as from the clone
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80",
           "VGPUVIRT_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    for line, cmd in block:
        if cmd.startswith("export "):          # sets the variable for the block's later lines, as in a shell
            name, _, value = cmd[len("export "):].partition("=")
            env[name] = value
            continue
        where = f"{path.name}:{line}: {cmd}"
        res = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
        note = comment(cmd)
        if "(real host)" in note:
            assert res.returncode == 1, f"{where}\nmarked (real host) but exited {res.returncode}: {res.stderr}"
            errors = [ln for ln in res.stderr.splitlines() if ln.startswith("vgpuvirt: error:")]
            assert len(errors) == 1 and "Traceback" not in res.stderr, f"{where}\n{res.stderr}"
            continue
        m = _EXIT.search(note)
        want = int(m.group(1)) if m else 0
        assert res.returncode == want, f"{where}\nexit {res.returncode} (want {want})\n{res.stderr[-2000:]}"
        assert "Traceback" not in res.stderr, f"{where}\n{res.stderr}"
