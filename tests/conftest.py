"""One isolated Airflow home for the whole test run, pinned before anything imports Airflow.

Airflow reads its home and configuration once, on first import, so this conftest (loaded first) sets them and
imports Airflow right away. The metadata database, needed only by tests that run DAGs, is created lazily by
the ``airflow_db`` fixture. The DAGs folder holds copies of ``example_dags/`` and ``tests/integration/dags/``.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

_home = tempfile.mkdtemp(prefix="gpumarket-tests-airflow-")
atexit.register(shutil.rmtree, _home, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _home
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home}/airflow.db"
# dag.test() runs DAGs from the configured DAGs folder: the examples plus the DAGs written for the tests.
_dags = Path(_home) / "dags"
_dags.mkdir()
_repo = Path(__file__).resolve().parent.parent
for _source in [*(_repo / "example_dags").glob("*.py"), *(_repo / "tests" / "integration" / "dags").glob("*.py")]:
    shutil.copy(_source, _dags / _source.name)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_dags)
# The tests of the GPU rentals page sign users' tokens: a key as long as the signing algorithm wants.
os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = "gpumarket-tests-" + "0" * 48
if version("apache-airflow").startswith("2."):  # Airflow 2.11 refuses SQLite with its default LocalExecutor
    os.environ["AIRFLOW__CORE__EXECUTOR"] = "SequentialExecutor"

import airflow  # noqa: E402,F401  (pins the configuration above)
import pytest  # noqa: E402

AIRFLOW_2 = version("apache-airflow").startswith("2.")


#: Folders whose tests drive Airflow's own machinery (triggers, the UI and its plugin, the CLI, decorators, sensors,
#: notifications, connections): their code paths differ between Airflow versions.
EVERY_AIRFLOW_FOLDERS = ("triggers", "ui", "commands", "decorators", "sensors", "notifications", "hooks")


#: The names by which a test module tells Airflow versions apart (``_compat``'s switches and this conftest's).
VERSION_SWITCHES = ("AIRFLOW_2", "airflow_version", "is_airflow_2", "has_retry_policies", "triggerer_calls_on_kill")


def every_airflow(item: pytest.Item) -> bool:
    """Whether a test's code path differs between Airflow versions: ``make test`` runs those on 2.11 too.

    That is a test that uses the metadata database (``airflow_db``: DAG runs, XComs, Variables, the ledger as a task
    reaches it), lives in one of ``EVERY_AIRFLOW_FOLDERS``, carries a ``skipif``, or whose module names a version
    switch (``VERSION_SWITCHES``). The others call the provider's rules and operators on plain contexts and fakes, the
    same code on every version: they run on the newest Airflow, and on both in ``make test-all``.
    """
    parts = item.path.relative_to(Path(__file__).parent).parts
    if "airflow_db" in getattr(item, "fixturenames", ()) or (len(parts) > 1 and parts[0] in EVERY_AIRFLOW_FOLDERS):
        return True
    return item.get_closest_marker("skipif") is not None or _names_a_version(item.path)


@functools.cache
def _names_a_version(path: Path) -> bool:
    source = path.read_text(encoding="utf-8")
    return any(re.search(rf"\b{name}\b", source) for name in VERSION_SWITCHES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if every_airflow(item):
            item.add_marker(pytest.mark.every_airflow)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shape",
        choices=("production", "small"),
        default="production",
        help="the system tests' deployment (-m system): production is the CeleryExecutor with Redis and two "
        "schedulers, triggerers and workers; small is the LocalExecutor with one scheduler and one triggerer",
    )


@pytest.fixture(autouse=True)
def _loggers_enabled():
    """Airflow 2.11 re-applies its logging configuration when it runs a task, which disables every logger that
    existed before and is not named there (the provider's trigger loggers among them); a real triggerer configures
    logging before any trigger logs. Each test starts with every logger enabled, and without the handlers such a run
    left on an earlier test's captured output, which pytest has closed since (they would print logging errors)."""
    if AIRFLOW_2:
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            if isinstance(logger, logging.Logger):
                logger.disabled = False
                for handler in list(logger.handlers):
                    if getattr(getattr(handler, "stream", None), "closed", False):
                        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _pacing_of_this_test_alone(tmp_path, monkeypatch):
    """The budgets' slots are booked machine-wide (``airflow_gpumarket.pacing``): each test books in a folder
    of its own, so one test's slots never make another wait."""
    from airflow_gpumarket.hooks import core as hook_module

    monkeypatch.setenv("GPUMARKET_PACING_DIR", str(tmp_path / "pacing"))
    monkeypatch.setattr(hook_module, "_PACERS", {})


@pytest.fixture(autouse=True)
def host_memory_of_this_test_alone(tmp_path, monkeypatch):
    """Renting tasks reach host memory in a SQLite file of the test's own: a machine one test remembers is never
    skipped by another. The client the tasks get is returned, for tests that read or fill host memory."""
    from sqlalchemy import create_engine

    from airflow_gpumarket.operators import host_memory_client as module

    engine = create_engine(f"sqlite:///{tmp_path / 'host-memory.db'}")
    clients: dict[str, module.DirectHostMemory] = {}

    def client(hook, conn_id):
        key = getattr(getattr(hook, "settings", None), "api_key", None) or "test-key"
        return clients.setdefault(key, module.DirectHostMemory(engine, key))

    monkeypatch.setattr(module, "host_memory_client", client)
    yield client
    engine.dispose()


@pytest.fixture
def task_log(capsys, caplog):
    """A reader of what the tasks, operators and triggers of a test logged or printed. Airflow 3 prints their logs
    to stdout (structlog, which caplog does not see). Airflow 2.11 sends them through the standard library's root
    logger, which caplog sees, while a task's print() in its dag.test() goes to the plain stdout."""
    if AIRFLOW_2:  # a task run there may leave the root logger at WARNING: the lines read here are INFO
        caplog.set_level(logging.INFO)

    def read() -> str:
        out = capsys.readouterr().out
        if not AIRFLOW_2:
            return out
        # 2.11's console handler may print the same records to stdout (depending on what ran before): each once.
        messages = [record.getMessage() for record in caplog.records]
        printed = [line for line in out.splitlines(keepends=True) if not any(m and m in line for m in messages)]
        return caplog.text + "".join(printed)

    return read


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """Create the SQLite metadata database once per run (about 4 s) for tests that run DAGs."""
    from airflow.utils import db

    db.initdb()
    return _home
