"""The live acceptance run (``make live-check``): skipped unless ``GPUMARKET_LIVE_CONN`` names a service.

The run happens once per session, before its tests read its report; the report's lines are printed at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .acceptance import CONN_VARIABLE, Report, Run, Settings, SpendCapRefused, airflow_connections

#: Exit status of a run refused before renting: no usable spend cap or connection, or a worst case above the cap.
REFUSED_EXIT = 3
_REPORT = pytest.StashKey[Report]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a connection every test here is skipped (they are also marked ``live``, which only -m live selects)."""
    if os.environ.get(CONN_VARIABLE):
        return
    skip = pytest.mark.skip(reason=f"no live service: set {CONN_VARIABLE} to run the live acceptance suite")
    for item in items:
        if item.get_closest_marker("live") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def live_report(request: pytest.FixtureRequest) -> Iterator[Report]:
    """The report of the session's one acceptance run (its rentals destroyed and swept before it is read)."""
    # Refusals are said in one line: a traceback would show the environment, the connection's key with it.
    try:
        settings = Settings.from_env()
        connections = airflow_connections(settings.conn)
    except (SpendCapRefused, ValueError) as exc:
        pytest.exit(f"live-check refused: {exc}", returncode=REFUSED_EXIT)
    request.getfixturevalue("airflow_db")  # the budget ledger's database, once the run may start
    with pytest.MonkeyPatch.context() as env:
        for name, value in connections.items():
            env.setenv(name, value)
        run = Run(settings)
        request.config.stash[_REPORT] = run.report
        try:
            run.execute()
        except SpendCapRefused as exc:
            pytest.exit(f"live-check refused: {exc}", returncode=REFUSED_EXIT)
        yield run.report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    report = config.stash.get(_REPORT, None)
    if report is not None:
        terminalreporter.section("live acceptance report")
        for line in [*report.notes, *report.lines()]:
            terminalreporter.write_line(line)
