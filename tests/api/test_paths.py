"""The status table's helpers (api/paths.py): which statuses still boot and which never run."""

from __future__ import annotations

import pytest

from airflow_gpumarket import api


@pytest.mark.parametrize(
    ("status", "booting", "never_runs"),
    [
        (None, True, False),
        ("loading", True, False),
        ("running", False, False),
        ("exited", False, True),
        ("unknown", False, True),
        ("offline", False, True),
    ],
)
def test_instance_status_helpers_follow_the_state_table(status, booting, never_runs):
    assert api.is_booting(status) is booting
    assert api.will_never_run(status) is never_runs
