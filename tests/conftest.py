"""One isolated Airflow home for the whole test run, pinned before anything imports Airflow.

Airflow reads its home and configuration once, on first import, so this conftest (loaded first) sets them and
imports Airflow right away. The metadata database, needed only by tests that run DAGs, is created lazily by
the ``airflow_db`` fixture.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_home = tempfile.mkdtemp(prefix="gpumarket-tests-airflow-")
atexit.register(shutil.rmtree, _home, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _home
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home}/airflow.db"

import airflow  # noqa: E402,F401  (pins the configuration above)
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """Create the SQLite metadata database once per run (about 4 s) for tests that run DAGs."""
    from airflow.utils import db

    db.initdb()
    return _home
