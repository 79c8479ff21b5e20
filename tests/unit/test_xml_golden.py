"""Golden files for each template x device mix.

Regenerate after an intended change: VGPUVIRT_REGEN_GOLDEN=1 pytest tests/unit/test_xml_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from xmlcheck import build_case, cases, check_create

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "xml"
REGEN = os.environ.get("VGPUVIRT_REGEN_GOLDEN") == "1"


@pytest.mark.parametrize("case", sorted(cases()))
def test_golden(case: str) -> None:
    xml = build_case(case).to_xml()
    path = GOLDEN / f"{case}.xml"
    if REGEN:
        check_create(xml)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(xml)
    assert path.is_file(), f"no golden file {path}: run with VGPUVIRT_REGEN_GOLDEN=1 and review it"
    assert xml == path.read_text(), f"{case} differs from {path}; if intended, regenerate and review the diff"
    check_create(path.read_text())


def test_no_stale_golden_files() -> None:
    names = {f"{c}.xml" for c in cases()}
    assert {p.name for p in GOLDEN.glob("*.xml")} <= names
