"""One test per assumption of docs/reference/live-service.md: a critical one that differs fails, the rest report."""

from __future__ import annotations

import pytest

from .acceptance import ASSUMPTIONS, Assumption

#: Real money: only `-m live` (make live-check) selects these, whatever the environment holds.
pytestmark = pytest.mark.live


@pytest.mark.parametrize("assumption", ASSUMPTIONS, ids=[a.id for a in ASSUMPTIONS])
def test_the_live_service_holds(live_report, assumption: Assumption) -> None:
    line = live_report.line(assumption)
    if assumption.critical:
        assert line.startswith("LIVE held:"), line
