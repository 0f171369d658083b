"""A task's median running time from Airflow's own history (``task_history``), read directly (Airflow 2 tasks,
``dag.test()``) and through the api-server's signed route (Airflow 3 tasks)."""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket import task_history
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.host_memory_client import ApiServerHostMemory, DirectHostMemory

from .conftest import AIRFLOW_2, task_states

KEY = "history-key"
CONN = "gpumarket_history"
DAG_ID = "gpm_history"


@pytest.fixture
def history(airflow_db):
    """The direct client, with ``run(*seconds, **conf)``: a run of ``gpm_history``. Earlier tests' runs are removed."""
    import os

    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2.11
        from airflow.models.dagbag import DagBag

    with create_session() as session:
        session.query(DagRun).filter(DagRun.dag_id == DAG_ID).delete()
    dag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag(DAG_ID)

    def run(*seconds: float, **conf):
        done = dag.test(run_conf={"seconds": list(seconds), **conf})
        assert done.state == ("failed" if min(seconds) < 0 else "success"), task_states(done)
        return done

    client = DirectHostMemory(settings.engine, KEY)
    client.run = run
    return client


def durations(run, seconds: float) -> None:
    """Each task instance of the run took ``seconds`` by Airflow's record (its start, end and duration)."""
    import datetime as dt

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        for ti in session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id="job"):
            ti.start_date = ti.end_date - dt.timedelta(seconds=seconds)
            ti.duration = seconds


def test_the_median_is_of_the_jobs_own_running_times_over_every_mapped_instance(history):
    history.run(60, 120)
    history.run(90)
    assert history.median_runtime(DAG_ID, "job") == 90.0  # 60, 90, 120: the boot before each is left out


def test_only_the_latest_successes_count(history):
    for seconds in (600, 60, 90):
        history.run(seconds)
    assert task_history.median_runtime(history.engine, DAG_ID, "job", last=2) == 75.0
    assert task_history.RECENT_RUNS == 20


def test_a_task_that_never_succeeded_has_no_median_and_failed_instances_do_not_count(history):
    assert history.median_runtime(DAG_ID, "job") is None
    history.run(-1)
    assert history.median_runtime(DAG_ID, "job") is None
    history.run(60, -1)
    assert history.median_runtime(DAG_ID, "job") == 60.0


def test_without_any_recorded_rental_the_task_instances_durations_count_boot_included(history):
    durations(history.run(60, record=False), 400)
    durations(history.run(60, 60, record=False), 500)
    assert history.median_runtime(DAG_ID, "job") == 500.0
    history.run(60)  # one recorded rental: the job's own running time wins
    assert history.median_runtime(DAG_ID, "job") == 60.0


def test_a_read_that_fails_is_an_airflow_exception_and_bad_names_a_validation_error(tmp_path):
    from sqlalchemy import create_engine

    broken = DirectHostMemory(create_engine(f"sqlite:///{tmp_path}/no-airflow-here.db"), KEY)
    with pytest.raises(AirflowException, match=f"earlier running times of task {DAG_ID}.job"):
        broken.median_runtime(DAG_ID, "job")
    with pytest.raises(GpuMarketValidationError, match="task_id"):
        broken.median_runtime(DAG_ID, "")


def test_a_real_jobs_record_gives_its_running_time(example_dag, sim):
    from airflow import settings

    from airflow_gpumarket.ui import records

    from .test_gpu_rentals_page import xcoms_of

    run = example_dag("gpm_history_job").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    record = xcoms_of(run, "train")[records.record_key(instance["id"])]
    seconds = DirectHostMemory(settings.engine, KEY).median_runtime("gpm_history_job", "train")
    assert seconds == record["stopped_at"] - record["running_at"] > 0


@pytest.fixture
def routes(history, monkeypatch):
    """The client that Airflow 3 tasks use, answered by the plugin's app on the test's metadata database."""
    import requests
    from fastapi.testclient import TestClient
    from ui.test_ledger_api import answered_by

    from airflow_gpumarket.ui import app as app_module

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    server = TestClient(app_module.create_app(), base_url="http://airflow.test")
    monkeypatch.setattr(requests, "post", answered_by(server))
    client = ApiServerHostMemory("http://airflow.test", KEY, CONN)
    client.run, client.server = history.run, server
    return client


@pytest.mark.skipif(AIRFLOW_2, reason="the routes are an Airflow 3.1+ api-server plugin")
def test_the_route_answers_the_median_to_a_signed_request(routes):
    from ui.test_ledger_api import signed

    assert routes.median_runtime(DAG_ID, "job") is None
    routes.run(60, 120)
    assert routes.median_runtime(DAG_ID, "job") == 90.0
    unsigned = signed({"conn_id": CONN, "dag_id": DAG_ID, "task_id": "job"}, key="not-the-key")
    assert routes.server.post("/history/median_runtime", **unsigned).status_code == 401


@pytest.mark.skipif(AIRFLOW_2, reason="the routes are an Airflow 3.1+ api-server plugin")
def test_the_route_answers_bad_names_with_a_400_naming_the_field(routes):
    from ui.test_ledger_api import signed

    bad = signed({"conn_id": CONN, "dag_id": DAG_ID, "task_id": 3}, key=KEY)
    answer = routes.server.post("/history/median_runtime", **bad)
    assert answer.status_code == 400 and answer.json()["detail"].startswith("task_id: ")
    with pytest.raises(GpuMarketValidationError, match="dag_id"):
        routes.median_runtime("", "job")
