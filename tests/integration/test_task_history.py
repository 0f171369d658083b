"""What a task's earlier successes in Airflow's own history tell (``task_history``): its job's median running time and
its image's size, read directly (Airflow 2 tasks, ``dag.test()``) and through the api-server's signed route (Airflow 3
tasks)."""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket import offer_cost, task_history
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
    assert history.history(DAG_ID, "job").runtime == 90.0  # 60, 90, 120: the boot before each is left out


def test_only_the_latest_successes_count(history):
    for seconds in (600, 60, 90):
        history.run(seconds)
    assert task_history.learned(history.engine, DAG_ID, "job", last=2).runtime == 75.0
    assert task_history.RECENT_RUNS == 20


def test_a_task_that_never_succeeded_has_no_median_and_failed_instances_do_not_count(history):
    assert history.history(DAG_ID, "job").runtime is None
    history.run(-1)
    assert history.history(DAG_ID, "job").runtime is None
    history.run(60, -1)
    assert history.history(DAG_ID, "job").runtime == 60.0


def test_without_any_recorded_rental_the_task_instances_durations_count_boot_included(history):
    durations(history.run(60, record=False), 400)
    durations(history.run(60, 60, record=False), 500)
    assert history.history(DAG_ID, "job").runtime == 500.0
    history.run(60)  # one recorded rental: the job's own running time wins
    assert history.history(DAG_ID, "job").runtime == 60.0


def test_the_image_size_is_the_median_its_boots_imply_at_their_offers_download_speed(history):
    # at 400 Mbps a GB takes 8000 / (400 x 0.5) s to pull and 10 s to extract, after 40 s of provisioning
    history.run(60, 60, boot=140)  # 2 GB each
    history.run(60, boot=240)  # 4 GB
    history.run(60, boot=1040)  # 20 GB: one slow boot does not move the median
    history.run(60, boot=9999, image="other:2")  # another image's boot
    history.run(60, boot=9999, inet_down=None)  # a record of a provider that did not write the download speed
    learned = history.history(DAG_ID, "job", "img:1")
    assert (learned.image_gb, learned.image_gb_max) == (pytest.approx(3.0), pytest.approx(20.0))  # 2, 2, 4, 20
    assert history.history(DAG_ID, "job", "other:2").image_gb == pytest.approx(199.18, abs=0.01)
    assert history.history(DAG_ID, "job").image_gb is None  # not asked
    assert history.history(DAG_ID, "job", "never-booted").image_gb is None


def test_a_boot_no_longer_than_provisioning_implies_an_image_already_on_the_host(history):
    history.run(60, boot=30)
    assert history.history(DAG_ID, "job", "img:1").image_gb == 0.0


def test_a_read_that_fails_is_an_airflow_exception_and_bad_names_a_validation_error(tmp_path):
    from sqlalchemy import create_engine

    broken = DirectHostMemory(create_engine(f"sqlite:///{tmp_path}/no-airflow-here.db"), KEY)
    with pytest.raises(AirflowException, match=f"earlier runs of task {DAG_ID}.job"):
        broken.history(DAG_ID, "job")
    with pytest.raises(GpuMarketValidationError, match="task_id"):
        broken.history(DAG_ID, "")
    with pytest.raises(GpuMarketValidationError, match="image: must be a non-empty string"):
        broken.history(DAG_ID, "job", " ")


def test_a_real_jobs_record_gives_its_running_time_and_image_size(example_dag, sim):
    from airflow import settings

    from airflow_gpumarket.ui import records

    from .test_gpu_rentals_page import xcoms_of

    run = example_dag("gpm_history_job").test()
    assert run.state == "success", task_states(run)
    state = sim.state()
    (instance,) = state["instances"]
    (offer,) = (o for o in state["offers"] if o["id"] == instance["offer_id"])
    record = xcoms_of(run, "train")[records.record_key(instance["id"])]
    learned = DirectHostMemory(settings.engine, KEY).history("gpm_history_job", "train", "img")
    assert learned.runtime == record["stopped_at"] - record["running_at"] > 0
    assert record["image"] == "img" and record["inet_down"] == offer["inet_down"] > 0
    boot = record["running_at"] - record["created_at"]
    assert learned.image_gb == learned.image_gb_max == offer_cost.image_gb_from_boot(boot, record["inet_down"])


def test_the_expected_cost_choice_prices_boots_with_the_image_size_earlier_boots_imply(
    example_dag, sim, task_log, monkeypatch
):
    from airflow import settings

    from airflow_gpumarket.operators import host_memory_client

    monkeypatch.setattr(
        host_memory_client, "host_memory_client", lambda hook, conn: DirectHostMemory(settings.engine, KEY)
    )
    dag = example_dag("gpm_history_learns")
    assert dag.test().state == "success"
    assert "its image to be 6 GB (a default: no image_size_gb, and no earlier boot of this image)" in task_log()
    learned = DirectHostMemory(settings.engine, KEY).history("gpm_history_learns", "train", "img")
    assert learned.image_gb is not None and learned.image_gb != 6.0
    assert dag.test().state == "success"
    assert f"its image to be {learned.image_gb:.3g} GB (implied by this task's earlier boots of it)" in task_log()


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
def test_the_route_answers_the_runtime_and_image_size_to_a_signed_request(routes):
    from ui.test_ledger_api import signed

    assert routes.history(DAG_ID, "job", "img:1") == task_history.Learned(None, None, None)
    routes.run(60, 120)
    assert routes.history(DAG_ID, "job", "img:1") == (90.0, pytest.approx(5.2), pytest.approx(5.2))  # 300 s boots
    unsigned = signed("/history/learned", {"conn_id": CONN, "dag_id": DAG_ID, "task_id": "job"}, key="not-the-key")
    assert routes.server.post("/history/learned", **unsigned).status_code == 401


@pytest.mark.skipif(AIRFLOW_2, reason="the routes are an Airflow 3.1+ api-server plugin")
def test_the_route_answers_bad_names_with_a_400_naming_the_field(routes):
    from ui.test_ledger_api import signed

    bad = signed("/history/learned", {"conn_id": CONN, "dag_id": DAG_ID, "task_id": 3}, key=KEY)
    answer = routes.server.post("/history/learned", **bad)
    assert answer.status_code == 400 and answer.json()["detail"].startswith("task_id: ")
    bad = signed("/history/learned", {"conn_id": CONN, "dag_id": DAG_ID, "task_id": "job", "image": ["img"]}, key=KEY)
    answer = routes.server.post("/history/learned", **bad)
    assert answer.status_code == 400 and answer.json()["detail"].startswith("image: ")
    with pytest.raises(GpuMarketValidationError, match="dag_id"):
        routes.history("", "job")
