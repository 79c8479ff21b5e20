"""Building XML at the speed of its validation (issue 25): build_domain does each piece of work once per domain.
Counted, not timed (benchmarks/bench_xml.py gives the figures); each count failed on the code before."""

from __future__ import annotations

import dataclasses
import importlib
import uuid

import pytest

from vgpuvirt.errors import XmlError
from vgpuvirt.model import MdevUuid
from vgpuvirt.xml import DomainOptions, MdevHostdev, build_domain, templates
from vgpuvirt.xml import domain as domain_mod

lint_mod = importlib.import_module("vgpuvirt.xml.lint")   # the package's `lint` is the function


def _mdevs(n: int) -> list[MdevHostdev]:
    return [MdevHostdev(MdevUuid(str(uuid.UUID(int=k + 1)))) for k in range(n)]


def test_each_device_source_is_read_once_by_the_builder_and_once_by_lint(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = domain_mod.source_key_of

    def counted(el: object) -> object:
        calls.append("x")
        return real(el)  # type: ignore[arg-type]

    monkeypatch.setattr(domain_mod, "source_key_of", counted)
    monkeypatch.setattr(lint_mod, "source_key_of", counted)
    base = sum(1 for el in templates.load_template("compute").devices if el.tag in ("hostdev", "interface"))
    templates.clear_caches()   # the first build of its shape (a later one reads none: test_xml_build_shapes.py)
    build_domain("compute", name="c", memory_mib=1024, vcpus=2, mdevs=_mdevs(8))
    # the template's own devices once by the builder and once by lint, each new one once by lint (each
    # addition used to read every device already there: 28 more for 8 mdevs)
    assert len(calls) == 8 + 2 * base


def test_a_duplicate_device_is_still_refused_by_the_builder() -> None:
    same = _mdevs(1) * 2
    with pytest.raises(XmlError, match="already in domain"):
        build_domain("compute", name="c", memory_mib=1024, vcpus=2, mdevs=same)


def test_options_read_their_fields_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    DomainOptions(tpm=True)                      # the field list is made on first use
    calls: list[int] = []
    real = dataclasses.fields

    def counted(obj: object) -> object:
        calls.append(1)
        return real(obj)  # type: ignore[arg-type]

    monkeypatch.setattr(templates, "fields", counted)
    for _ in range(3):
        DomainOptions(tpm=True, secure_boot=True)
        build_domain("vdi", name="v", memory_mib=1024, vcpus=2, mdevs=_mdevs(1))
    assert calls == []
    with pytest.raises(Exception, match="threads_per_core"):
        DomainOptions(threads_per_core=True)     # still checked: a bool is no int
