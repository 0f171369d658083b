"""The deployment every scenario shares, started once per session, and the SYS lines that `make system` prints."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from .deployment import PRODUCTION, SMALL, clip, interrupt_on_signals
from .scenario import GOALS, Scenario, SystemDeployment

DEPLOYMENT = pytest.StashKey[SystemDeployment]()
SCENARIOS = pytest.StashKey[list[str]]()  # the scenarios selected, in the order they run
SUMMARY = pytest.StashKey[str]()
WALL_CLOCK_GOAL = 600  # seconds for the whole run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The small shape (one scheduler, one triggerer, no Celery worker) leaves out the production_shape tests."""
    if config.getoption("--shape") != "small":
        return
    left_out = [item for item in items if item.get_closest_marker("production_shape")]
    if left_out:
        items[:] = [item for item in items if item not in left_out]
        config.hook.pytest_deselected(items=left_out)


def pytest_collection_finish(session: pytest.Session) -> None:
    names = [item.name.removeprefix("test_") for item in session.items if item.get_closest_marker("system")]
    session.config.stash[SCENARIOS] = [name for name in names if name in GOALS]


@pytest.fixture(scope="session")
def deployment(request: pytest.FixtureRequest) -> Iterator[SystemDeployment]:
    """The shape's deployment (--shape), started once; at the end what is alive is counted, then it is stopped."""
    shape = SMALL if request.config.getoption("--shape") == "small" else PRODUCTION
    interrupt_on_signals()  # SIGTERM also ends the session through this fixture's teardown
    deployment = SystemDeployment(shape, _progress_writer(request.config))
    request.config.stash[DEPLOYMENT] = deployment
    try:
        deployment.start_all()
        yield deployment
    finally:
        deployment.stop_all()


@pytest.hookimpl(trylast=True)  # after the deployment's teardown, which counts what is alive
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """An instance alive at the end fails the run, even when every test passed."""
    deployment = session.config.stash.get(DEPLOYMENT, None)
    alive = [i for i in (deployment.final_instances or []) if not i["destroyed"]] if deployment else []
    if alive and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _progress_writer(config: pytest.Config) -> Callable[[str], None]:
    """Writes a progress line at once, on a line of its own beside pytest's (shown live with -s)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return partial(print, flush=True)

    def write(line: str) -> None:
        reporter.write_line(line)
        reporter.flush()

    return write


@pytest.fixture
def scenario(deployment: SystemDeployment, request: pytest.FixtureRequest) -> Scenario:
    """The scenario the test is named after: test_<scenario>."""
    return deployment.scenario(request.node.name.removeprefix("test_"))


def _failures(terminalreporter) -> dict[str, str]:
    """Scenario -> why its test failed (setup or call; the session's own teardown is no scenario's)."""
    failed = {}
    for report in [*terminalreporter.stats.get("failed", []), *terminalreporter.stats.get("error", [])]:
        name = report.nodeid.rpartition("::test_")[2]
        if report.when in ("setup", "call") and name in GOALS:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
            failed.setdefault(name, clip(message.removeprefix("AssertionError: ").splitlines()[0], 400))
    return failed


def _passed(terminalreporter) -> set[str]:
    return {
        report.nodeid.rpartition("::test_")[2]
        for report in terminalreporter.stats.get("passed", [])
        if report.when == "call"
    }


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The SYS lines: the deployment, one line per scenario, what is alive and what restarted, the probes."""
    deployment = config.stash.get(DEPLOYMENT, None)
    if deployment is None:
        return
    names = config.stash.get(SCENARIOS, [])
    write = terminalreporter.write_line
    if deployment.final_instances is None:
        config.stash[SUMMARY] = f"SYS: 0/{len(names)} scenarios pass, alive unknown (the simulator was never reached)"
        return
    instances = deployment.final_instances
    failures, passed = _failures(terminalreporter), _passed(terminalreporter)
    write(deployment.shape.line())
    passing = 0
    for name in names:
        alive = sum(1 for i in instances if i.get("gpu_name") == f"sys-{name}" and not i["destroyed"])
        reason = failures.get(name)
        if name not in passed and reason is None:
            reason = "interrupted" if exitstatus == pytest.ExitCode.INTERRUPTED else "not run"
        if reason is None and alive:
            reason = f"{alive} instance(s) of this scenario alive at the end"
        passing += reason is None
        billed = deployment.scenarios[name].billed if name in deployment.scenarios else "n/a"
        shown = "PASS" if reason is None else f"FAIL ({reason})"
        write(f"SYS {name}: {shown} billed_after_failure={billed} alive={alive} (goal: {GOALS[name]})")
    alive_total = sum(1 for i in instances if not i["destroyed"])
    write(f"SYS alive_total: {alive_total} (goal: 0)")
    restarts = deployment.restarts
    write(f"SYS components restarted after dying on their own: {len(restarts)} {restarts or ''}".rstrip())
    for line in _probes(deployment):
        write(line)
    ended = deployment.ended or time.time()
    write(f"wall-clock time: {ended - deployment.started:.0f} s (goal: < {WALL_CLOCK_GOAL} s)")
    if passing < len(names) or alive_total:
        _where_the_logs_are(deployment, write, [name for name in names if name not in passed])
    config.stash[SUMMARY] = f"SYS: {passing}/{len(names)} scenarios pass, {alive_total} instances alive"


def pytest_unconfigure(config: pytest.Config) -> None:
    """The summary comes last, after pytest's own, for a person or a script."""
    summary = config.stash.get(SUMMARY, None)
    if summary is not None:
        config.get_terminal_writer().line(summary)


def _short(cmdline: str) -> str:
    """A command line with its paths cut to their last part: "python airflow dag-processor"."""
    return " ".join(word.rpartition("/")[2] if word.startswith("/") else word for word in cmdline.split())


def _probes(deployment: SystemDeployment) -> list[str]:
    """Where the DAG file's probe callbacks ran after the heartbeat timeouts, how often, and what the connection was."""
    records: dict[str, list[dict]] = {}
    for path in sorted((deployment.home / "system-probes").glob("*.json")):
        record = json.loads(path.read_text())
        records.setdefault(f"{record.get('callback')} of {record.get('dag_id')}", []).append(record)
    processor = deployment.processor_pid
    lines = []
    for what, runs in records.items():
        places = sorted(
            f"pid {r['pid']} '{_short(r.get('process', '?'))}', a child of "
            + ("the dag-processor" if r.get("ppid") == processor else f"pid {r.get('ppid')} '{_short(r['parent'])}'")
            for r in runs
        )
        connections = sorted({str(r.get("connection_host") or r.get("connection_error")) for r in runs})
        lines.append(f"  probe: {what} ran {len(runs)}x: in {'; '.join(places)}; gpumarket_default -> {connections}")
    return lines


def _where_the_logs_are(deployment: SystemDeployment, write, failed: list[str]) -> None:
    home = deployment.home
    write(f"Logs: Airflow home {home}")
    for name in ("simulator", "db-migrate", *deployment.components):
        write(f"  {name}: {home / (name + '.log')}")
    write(f"  dag-processor children: {home / 'logs' / 'dag_processor'}")
    for name in failed:
        write(f"  task logs of {name}: {home / 'logs' / f'dag_id=system_{name}'}")
