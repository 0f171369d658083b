"""One isolated Airflow home for the whole test run, pinned before anything imports Airflow.

Airflow reads its home and configuration once, on first import, so this conftest (loaded first) sets them and
imports Airflow right away. The metadata database, needed only by tests that run DAGs, is created lazily by
the ``airflow_db`` fixture. The DAGs folder holds copies of ``example_dags/`` and ``tests/integration/dags/``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
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

import airflow  # noqa: E402,F401  (pins the configuration above)
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """Create the SQLite metadata database once per run (about 4 s) for tests that run DAGs."""
    from airflow.utils import db

    db.initdb()
    return _home
