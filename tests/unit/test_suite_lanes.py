"""What the inner loop (`-m "not slow"`) leaves out: every test parametrized with the scale profile `large` is
`slow` (tests/conftest.py marks it before `-m` deselects); in the whole suite (CI) there are dozens of them."""

from __future__ import annotations

import pytest


def test_every_test_on_the_large_profile_is_slow(request: pytest.FixtureRequest) -> None:
    on_large = [item for item in request.session.items
                if getattr(getattr(item, "callspec", None), "params", {}).get("profile") == "large"]
    assert [i.nodeid for i in on_large if i.get_closest_marker("slow") is None] == []
    if request.config.getoption("markexpr") == "not slow":
        assert on_large == []
