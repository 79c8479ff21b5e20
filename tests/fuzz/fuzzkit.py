"""Shared pieces of the fuzz suite: the case counter, input strategies, and the bad-input contract.

The contract every fuzz test checks (issue 15): bad input gets a one-line error (the API raises a
:class:`~vgpuvirt.errors.VgpuvirtError` / ``ValueError`` with a one-line message; the CLI exits non-zero and
the last line on stderr is ``vgpuvirt...: error: ...``), no traceback, and nothing written.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# test name -> examples run; conftest.py prints the total in the terminal summary.
CASES: Counter[str] = Counter()


def count(name: str) -> None:
    CASES[name] += 1


def fuzz_settings(n: int) -> settings:
    """Fixed seed (CI is reproducible and its case count stable), no deadline (a 2-core CI box is slow)."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


# ---------------------------------------------------------------- inputs

INJECTIONS = [
    "; rm -rf /", "$(reboot)", "`id`", "| cat /etc/shadow", "&& halt", "\n", "../../etc/passwd", "..", "/",
    "'", '"', "0000:3b:00.0; reboot", "0000:3b:00.0\nrm", "nvidia-231 && reboot", "nvidia-231/../../x",
    "nvidia-..", "-rf", "--help", " ", "", "[red]x[/red]", "[/x]", "[bold", "\x1b[31mred\x1b[0m",
    "\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\", "\r", "\t", "\x7f", "\u202e", "\udcff", "%s%n", "{0}",
    "<x/>", "&amp;", "]]>", "a" * 300, "0x3b", "-1", "99999999999999999999", "1e9", "nan", "inf",
]

# text a terminal, a shell, XML, rich markup or a path parser may treat specially
SPECIAL = "\x00\x01\x07\x08\t\n\r\x1b\x7f[]/\\'\"$`;|&<>{}%*?~=,:.-_ \u2028\u00a0\u202e"


def _surrogate_escaped(b: bytes) -> str:
    # how Python hands a non-UTF-8 argv word or file name to the program
    return b.decode("utf-8", "surrogateescape")


def junk_text(max_size: int = 40, *, nul: bool = True) -> st.SearchStrategy[str]:
    """Strings a user, a file or a host could hand over: random, special characters, injections, non-UTF-8."""
    s = st.one_of(
        st.text(max_size=max_size),
        st.text(alphabet=SPECIAL + "0123456789abcdefABCDEFnvidia", max_size=max_size),
        st.sampled_from(INJECTIONS),
        st.binary(max_size=max_size).map(_surrogate_escaped),
    )
    return s if nul else s.map(lambda t: t.replace("\0", ""))


def anything(max_size: int = 40) -> st.SearchStrategy[Any]:
    """Any value a Python caller (or a YAML/JSON document) may pass where a string or number is expected."""
    return st.one_of(junk_text(max_size), st.integers(), st.none(), st.floats(), st.booleans(),
                     st.binary(max_size=8), st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def one_of_or_junk(valid: list[str], *, nul: bool = False) -> st.SearchStrategy[str]:
    """A valid value about a third of the time, junk otherwise: both sides of every validator get exercised."""
    return st.one_of(st.sampled_from(valid), junk_text(nul=nul), junk_text(nul=nul))


# ---------------------------------------------------------------- domain XML

XML_SEEDS = [
    "<domain type='kvm'><name>a</name><devices><hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
    "<source><address uuid='83b8f4f2-509f-382f-3c1e-e6bfe0fa1001'/></source></hostdev></devices></domain>",
    "<domain type='kvm'><name>b</name><vcpu>2</vcpu><cputune><vcpupin vcpu='0' cpuset='1'/></cputune><devices>"
    "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x3b' slot='0x00' "
    "function='0x0'/></source><address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>"
    "</hostdev><interface type='hostdev'><mac address='52:54:00:12:34:56'/><source><address type='pci' "
    "domain='0x0000' bus='0x5e' slot='0x02' function='0x0'/></source><vlan><tag id='7'/></vlan></interface>"
    "</devices></domain>",
]
ATTR_VALUES = st.one_of(junk_text(12, nul=False), st.sampled_from(["0x3b", "yes", "no", "-1", "0x1ffff", "vfio-pci",
                                                                    "mdev", "pci", "0", "99999999999"]))


@st.composite
def mutated_xml(draw: st.DrawFn) -> str:
    """A valid domain with attributes and texts replaced, elements dropped or duplicated."""
    from lxml import etree

    from vgpuvirt.xml.document import parse_xml
    root = parse_xml(draw(st.sampled_from(XML_SEEDS)))
    els = list(root.iter())
    for _ in range(draw(st.integers(1, 4))):
        el = draw(st.sampled_from(els))
        what = draw(st.sampled_from(["attr", "text", "drop", "dup", "newattr"]))
        try:
            if what == "attr" and el.attrib:
                el.set(draw(st.sampled_from(sorted(el.attrib))), draw(ATTR_VALUES))
            elif what == "newattr":
                el.set(draw(st.sampled_from(["model", "managed", "type", "uuid", "id", "mode", "display"])),
                       draw(ATTR_VALUES))
            elif what == "text":
                el.text = draw(ATTR_VALUES)
            elif what == "drop" and el.getparent() is not None:
                el.getparent().remove(el)
            elif what == "dup" and el.getparent() is not None:
                el.getparent().append(etree.fromstring(etree.tostring(el)))
        except ValueError:
            pass  # lxml refuses control characters in XML text: such a document cannot exist
    return etree.tostring(root, encoding="unicode")



# ---------------------------------------------------------------- the contract

ERROR_LINE = re.compile(r"^vgpuvirt(?: [\w-]+)*: error: \S")


def assert_one_line_error(exc: BaseException, *, allowed: tuple[type[BaseException], ...] = ()) -> None:
    """An API refusal: a VgpuvirtError or ValueError (or ``allowed``) whose message is one non-empty line."""
    from vgpuvirt.errors import VgpuvirtError
    if not isinstance(exc, (VgpuvirtError, ValueError, *allowed)):
        raise AssertionError(f"not a vgpuvirt error: {type(exc).__name__}: {exc}") from exc
    msg = str(exc)
    assert msg.strip(), f"{type(exc).__name__} with an empty message"
    assert "\n" not in msg and "\r" not in msg, f"multi-line error message: {msg!r}"


def refuses_cleanly(call: Callable[[], Any], *, allowed: tuple[type[BaseException], ...] = ()) -> Any:
    """Run ``call``; return its value, or None when it raised an acceptable one-line error."""
    try:
        return call()
    except Exception as exc:
        assert_one_line_error(exc, allowed=allowed)
        return None


@dataclass
class CliRun:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    hosts: list[Any] = field(default_factory=list)

    def last_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def check(self, *, report_rc: tuple[int, ...] = ()) -> None:
        """No traceback; a failure ends with one error line (``report_rc``: exit codes that are a report)."""
        assert "Traceback" not in self.stderr, f"traceback on stderr for {self.argv!r}:\n{self.stderr}"
        if self.rc != 0 and self.rc not in report_rc:
            assert ERROR_LINE.match(self.last_line()), (
                f"exit {self.rc} without a one-line error for {self.argv!r}: stderr={self.stderr[-600:]!r}")


class _Stream(io.TextIOWrapper):
    """A text stream like the real ones: UTF-8 bytes underneath, so unencodable text fails as it would."""

    def __init__(self, errors: str) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors=errors, write_through=True)

    def isatty(self) -> bool:
        return False

    def value(self) -> str:
        self.flush()
        buf = self.buffer
        assert isinstance(buf, io.BytesIO)
        return buf.getvalue().decode("utf-8", "replace")


@contextlib.contextmanager
def _captured() -> Iterator[tuple[_Stream, _Stream]]:
    # stdout is strict, stderr backslashreplace: what CPython gives a UTF-8 terminal
    out, err = _Stream("strict"), _Stream("backslashreplace")
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = old


def run_cli(argv: list[str], opened: list[Any] | None = None) -> CliRun:
    """``vgpuvirt.cli.main(argv)`` in-process. An exception escaping main is a crash and propagates."""
    from vgpuvirt.cli import main
    with _captured() as (out, err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except RecursionError:
            # a crash like any other, reported without its thousand frames: formatting those for every
            # shrinking step would take hypothesis' whole shrinking budget (minutes)
            raise AssertionError(f"RecursionError escaped main for {argv!r}") from None
    return CliRun(list(argv), rc, out.value(), err.value(), list(opened or []))
