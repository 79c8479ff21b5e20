"""Issue 28 item 11: the global options were listed, with their help, in every verb's --help; they are listed
once (``vgpuvirt --help``) and named in one line under each verb, which still accepts them."""

from __future__ import annotations

import pytest

from vgpuvirt.cli import SUBCOMMANDS, build_parser, main
from vgpuvirt.cli.options import GLOBALS


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ei:
        main([*argv, "--help"])
    assert ei.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("verb", [v for v, _m, _h in SUBCOMMANDS if v in {"inventory", "provision", "vm", "layout"}])
def test_a_verbs_help_names_the_global_options_once(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _help([verb], capsys)
    for _name, (_flags, _kind, kw) in GLOBALS.items():
        assert kw["help"] not in " ".join(out.split())          # no help text of a global option
    assert out.count("--sysfs-root") == 1 and "global options, accepted before or after the verb" in out


def test_the_top_help_lists_them_and_verbs_still_take_them(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")      # argparse wraps at hyphens too ("read- only"): one line per option
    out = " ".join(_help([], capsys).split())
    assert all(" ".join(kw["help"].split()) in out for _f, _k, kw in GLOBALS.values())
    args = build_parser().parse_args(["inventory", "--host", "sim:t4x2", "--json"])
    assert "sim:t4x2" in str(vars(args))
