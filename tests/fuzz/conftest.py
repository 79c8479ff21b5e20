"""The fuzz suite's fixtures and its case count, printed in pytest's terminal summary.

``pytest -q`` collects this directory with the rest; every test here is a hypothesis test with a fixed
seed (``derandomize=True``), so a CI run executes the same cases each time and reports how many.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fuzzkit import CASES


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not CASES:
        return
    total = sum(CASES.values())
    terminalreporter.write_sep("-", f"fuzz: {total} generated cases in {len(CASES)} tests")
    if config.getoption("verbose") > 0:
        for name, n in sorted(CASES.items()):
            terminalreporter.write_line(f"  {n:6d}  {name}")


@pytest.fixture(scope="module")
def opened_hosts() -> Iterator[list[Any]]:
    """Every Host the CLI opens (through ``open_host``) is appended here, so a test can look at its state."""
    import vgpuvirt.cli.context
    import vgpuvirt.cli.provision
    from vgpuvirt.hosts import open_host

    opened: list[Any] = []

    def recording_open_host(*a: Any, **kw: Any) -> Any:
        host = open_host(*a, **kw)
        opened.append(host)
        return host

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vgpuvirt.cli.context, "open_host", recording_open_host)
        mp.setattr(vgpuvirt.cli.provision, "open_host", recording_open_host)
        yield opened
