"""validate() uses libvirt's own domain.rng: it accepts what libvirt accepts, refuses the rest, and is compiled once."""

from __future__ import annotations

from pathlib import Path

import pytest
from xmlcheck import build_case

from vgpuvirt.errors import MissingDependency, XmlError
from vgpuvirt.xml import SchemaMissing, validate
from vgpuvirt.xml.schema import schema


def test_accepts_built_domain_as_text_element_or_domain() -> None:
    dom = build_case("vdi-mdev")
    validate(dom)
    validate(dom.to_xml())
    validate(dom.root)


def test_rejects_invalid_hostdev_model() -> None:
    bad = build_case("vdi-mdev").to_xml().replace('model="vfio-pci"', 'model="bogus"')
    with pytest.raises(XmlError) as ei:
        validate(bad)
    assert ei.value.problems and "domain.rng" in str(ei.value)


def test_compiled_once() -> None:
    assert schema() is schema()


def test_missing_schema_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VGPUVIRT_LIBVIRT_SCHEMAS", str(tmp_path))
    with pytest.raises(SchemaMissing) as ei:
        validate("<domain/>")
    assert isinstance(ei.value, MissingDependency)
    assert "libvirt0" in str(ei.value) and str(tmp_path) in str(ei.value)
