"""@task.gpumarket on the simulator: the return value reaches the next task, an exception fails the task with its
traceback, mapping rents one instance per mapped task, and nothing is left alive."""

from __future__ import annotations

import time
from datetime import datetime
from types import SimpleNamespace

import pytest
from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket import lifecycle
from airflow_gpumarket.decorators.gpumarket import gpumarket_task
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.spec import RentalSpec

from .conftest import alive, offers_rented_twice_at_once, task_states
from .test_money_safety import cheapest_offers, wait_until


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_the_return_value_reaches_the_next_task(example_dag, sim, mode):
    run = example_dag(f"gpm_dec_pipeline_{mode}").test()
    assert run.state == "success", task_states(run)
    assert len(sim.state()["instances"]) == 1
    assert alive(sim) == []


def test_an_exception_fails_the_task_with_the_remote_traceback(example_dag, sim, task_log):
    run = example_dag("gpm_dec_raises").test()
    assert run.state == "failed"
    out = task_log()
    assert "ZeroDivisionError: division by zero" in out and "return a / b" in out
    assert "exit status 1" in out
    assert alive(sim) == []


def test_mapping_rents_one_instance_per_mapped_task(example_dag, sim):
    run = example_dag("gpm_dec_mapped").test()
    assert run.state == "success", task_states(run)
    assert len(sim.state()["instances"]) == 4
    assert offers_rented_twice_at_once(sim) == []
    assert alive(sim) == []


def test_an_argument_too_large_at_run_time_fails_before_anything_is_rented(example_dag, sim, task_log):
    run = example_dag("gpm_dec_big_xcom").test()
    assert run.state == "failed"
    assert "object storage" in task_log()
    assert sim.state()["instances"] == []


def test_the_exception_message_carries_the_remote_traceback(sim):
    from datetime import datetime
    from types import SimpleNamespace

    from airflow.providers.common.compat.sdk import DAG

    from airflow_gpumarket._compat import AirflowException
    from airflow_gpumarket.decorators.gpumarket import gpumarket_task

    from .dags.gpumarket_decorator_dags import COMMON

    def parse(text: str) -> int:
        return int(text)

    with DAG(dag_id="direct", start_date=datetime(2026, 1, 1), schedule=None):
        op = gpumarket_task(**COMMON, deferrable=False)(parse)("not a number").operator
    with pytest.raises(AirflowException) as caught:
        op.execute({"run_id": "r1", "ti": SimpleNamespace(try_number=1, map_index=-1, start_date=None)})
    message = str(caught.value)
    assert "exit status 1" in message and "ValueError: invalid literal for int()" in message
    assert "return int(text)" in message
    assert alive(sim) == []


def test_a_retry_returns_the_value_of_a_function_whose_run_ended_after_the_worker_died(sim):
    from .dags.gpumarket_decorator_dags import COMMON  # after the fixtures set its poll interval

    def double(n: int) -> int:
        return 2 * n

    with DAG(dag_id="direct", start_date=datetime(2026, 1, 1), schedule=None):
        op = gpumarket_task(**COMMON, deferrable=False)(double)(21).operator
    retry = {"run_id": "r1", "ti": SimpleNamespace(try_number=2, map_index=-1, start_date=None)}
    key = task_key(op, retry)
    op.command = op._command(key, list(op.op_args), dict(op.op_kwargs))  # try 1's command (execute builds it)
    label = lifecycle.make_label(key, time.time() + 3600)
    # Try 1's rental, then its worker died.
    body = RentalSpec.of(op).creation_body(label=label, base_url=op.hook.settings.base_url)
    made = op.hook.create_instance(cheapest_offers(1)[0]["id"], **body)["new_contract"]
    wait_until(lambda: sim.state()["instances"][0]["actual_status"] == "stopped")  # the function returned
    assert op.execute(retry) == 42
    assert [i["id"] for i in sim.state()["instances"]] == [made]
    assert alive(sim) == []
