"""Case counts of the capacity referee, printed in pytest's terminal summary (visible under ``-q``)."""

from __future__ import annotations

from collections import Counter

import pytest

TALLY = pytest.StashKey[Counter]()


@pytest.fixture(scope="session")
def referee_tally(request: pytest.FixtureRequest) -> Counter:
    """Session-wide counts (cases run per property, planner refusals, ...) that the summary prints."""
    return request.config.stash.setdefault(TALLY, Counter())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    tally = config.stash.get(TALLY, None)
    if not tally:
        return
    total = tally["soundness cases"] + tally["completeness cases"]
    terminalreporter.write_sep("-", "capacity referee")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
    terminalreporter.write_line(f"{total} generated cases run: {counts}")
